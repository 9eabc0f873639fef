"""The simulated server behind an OpenAI-compatible HTTP endpoint, with vLLM's metrics.

    plait sim serve --profile h100-llama3-8b --port 8000

Routes: POST /v1/chat/completions, POST /v1/completions (both also streamed as server-sent
events with `stream`, the usage in a last chunk with `stream_options.include_usage`),
GET /v1/models (with vLLM's `max_model_len`), GET /metrics (Prometheus text with vLLM's
metric names, its cache size in `vllm:cache_config_info` as vLLM says it), GET /health.
A streamed answer starts once the simulated request has finished, so over HTTP its time to
first token is its whole latency. Hints ride in the body as the
`sim` dialect spells them: `priority` (lower runs sooner, as in vLLM), `session_id` (the
program), `keep_alive_s`, `last_call` and `cache_salt` (vLLM's: prompts share cached blocks
only with prompts of the same salt). `tools` (with `tool_choice`), `response_format` and
vLLM's `structured_outputs.json` act as in the in-process simulator (the same code answers):
a tool call in OpenAI's format, or JSON that fits the schema. Every bad request gets a 400
whose message names the field (`logprobs` too: nothing here computes them); nothing a client
sends can crash the server.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator import BackendError, Hints, LLMRequest, LLMResponse, Message, ToolCall, UsageError
from orchestrator.ext import OutputSchema, Sampling, ToolSpec

from ._sim import SimServer
from ._simtext import CHARS_PER_TOKEN

MAX_BODY_BYTES = 8 * 1024 * 1024
# Deeper than any real request (a tool's schema nests a few levels); bounds the validators'
# recursion, which a body nested 100,000 deep would otherwise exhaust.
MAX_DEPTH = 100


# Strict like vLLM's OpenAI server: no coercion of "yes" to a bool or `true` to a number,
# and no NaN or infinity (JSON's 1e400 reads as infinity).
_Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
_Tokens = Annotated[int, Field(strict=True, ge=1)]


def _content_text(content: Any) -> str:
    """A message's content as text: a string, null, or the standard list of parts, whose
    text parts are joined. Other parts (images, audio) are refused: the model reads text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(
            f"content must be a string or a list of parts, got {type(content).__name__}"
        )
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ValueError(
                f"part {i} has type {kind!r}; the simulated server reads only text parts "
                '({"type": "text", "text": "..."})'
            )
        if not isinstance(part.get("text"), str):
            raise ValueError(f"part {i} needs a string `text`")
        texts.append(part["text"])
    return "".join(texts)


_Name = Annotated[str, Field(strict=True, min_length=1)]
_Schema = dict[str, Any]


class _CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: _Name
    arguments: Annotated[str, Field(strict=True)] = ""


class _ToolCallIn(BaseModel):
    """A tool call an assistant message made, sent back in the history."""

    model_config = ConfigDict(extra="ignore")
    id: Annotated[str, Field(strict=True)]
    type: Literal["function"] = "function"
    function: _CalledFunction


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Annotated[str, BeforeValidator(_content_text)] = ""
    name: Annotated[str, Field(strict=True)] | None = None
    tool_call_id: Annotated[str, Field(strict=True)] | None = None
    tool_calls: list[_ToolCallIn] | None = None

    def message(self) -> Message:
        calls = tuple(
            ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or ()
        )
        role = "system" if self.role == "developer" else self.role
        return Message(role, self.content, self.name, self.tool_call_id, calls)


class _Function(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: _Name
    description: Annotated[str, Field(strict=True)] = ""
    parameters: _Schema = Field(default_factory=dict)


class _Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: _Function


class _ChosenFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: _Name


class _ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: _ChosenFunction


class _JsonSchema(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: Annotated[str, Field(strict=True)] = "output"
    # `schema` would shadow a BaseModel attribute, hence the alias.
    json_schema: _Schema = Field(default_factory=lambda: {"type": "object"}, alias="schema")


class _ResponseFormat(BaseModel):
    """OpenAI's `response_format` (SGLang, llama.cpp, Dynamo and the `sim` dialect send it)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None

    def output(self) -> OutputSchema | None:
        if self.type == "text":
            return None
        if self.type == "json_object" or self.json_schema is None:
            return OutputSchema("json_object", {"type": "object"})
        return OutputSchema(self.json_schema.name or "output", self.json_schema.json_schema)


class _StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (the `vllm` dialect sends it); the simulator follows a
    JSON schema only, so its other constraints are refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")
    json_: _Schema | None = Field(default=None, alias="json")

    @model_validator(mode="after")
    def _has_json(self) -> _StructuredOutputs:
        if self.json_ is None:
            raise ValueError("needs `json`, a JSON schema (the simulator follows no other)")
        return self


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Annotated[bool, Field(strict=True)] = False


class _Hinted(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(strict=True)] = ""
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    n: Annotated[int, Field(strict=True, ge=1, le=1)] = 1
    temperature: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)] = 0.0
    seed: Annotated[int, Field(strict=True)] | None = None
    stream: Annotated[bool, Field(strict=True)] = False
    stream_options: _StreamOptions | None = None
    priority: _Number = 0.0
    session_id: Annotated[str, Field(strict=True)] | None = None
    keep_alive_s: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)] | None = None
    last_call: Annotated[bool, Field(strict=True)] = False
    # As vLLM: a non-empty string when given; prompts share cached blocks only within it.
    cache_salt: Annotated[str, Field(strict=True, min_length=1)] | None = None
    response_format: _ResponseFormat | None = None
    structured_outputs: _StructuredOutputs | None = None
    logprobs: Any = None
    top_logprobs: Any = None

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any) -> Any:
        # A client that asks for log probabilities must not get a silent null to misread.
        if value is None or value is False or value == 0:
            return value
        raise ValueError(
            "the simulated server computes no log probabilities; leave the field out "
            "(or set it to null or false)"
        )

    def output(self) -> OutputSchema | None:
        """The schema the reply must fit, from either spelling of structured output."""
        if self.structured_outputs is not None:
            return OutputSchema("structured_outputs", self.structured_outputs.json_ or {})
        if self.response_format is not None:
            return self.response_format.output()
        return None

    def hints(self) -> Hints:
        return Hints(
            program_id=self.session_id or "",
            urgency=-self.priority,
            keep_alive_s=self.keep_alive_s,
            last_call=self.last_call,
            cache_salt=self.cache_salt,
        )

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class _ChatBody(_Hinted):
    messages: list[_ChatMessage] = Field(min_length=1)
    tools: list[_Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | _ToolChoice | None = None

    @field_validator("tool_choice")
    @classmethod
    def _offered(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, _ToolChoice):
            offered = [t.function.name for t in info.data.get("tools") or ()]
            if value.function.name not in offered:
                raise ValueError(
                    f"names the function {value.function.name!r}, which is not among the "
                    f"tools ({', '.join(offered) or 'none'})"
                )
        return value

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools the model may call, after `tool_choice` ("none": none; a named
        function: that one only)."""
        tools = tuple(
            ToolSpec(t.function.name, t.function.description, t.function.parameters)
            for t in self.tools or ()
        )
        if self.tool_choice == "none":
            return ()
        if isinstance(self.tool_choice, _ToolChoice):
            return tuple(t for t in tools if t.name == self.tool_choice.function.name)
        return tools


class _CompletionBody(_Hinted):
    prompt: Annotated[str, Field(strict=True)]


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param}}
    return web.json_response(body, status=status)


def _too_deep(path: str) -> str:
    where = f" at {path}" if path else ""
    return (
        f"the request body is nested too deeply{where}: at most {MAX_DEPTH} levels of "
        "arrays and objects"
    )


def _unreadable(data: Any) -> tuple[str, str] | None:
    """The first place in a parsed body nested past MAX_DEPTH or holding text that is not
    Unicode (a lone surrogate, which JSON's `\\udcff` escape can spell), and why; None if
    none. Walked without recursion, so any depth json.loads returns is safe."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return path, (
                    f"field {path or 'body'!r}: it holds a lone surrogate "
                    f"({ascii(value[exc.start])[1:-1]}) at character {exc.start}, which is "
                    "not Unicode text; send text as UTF-8"
                )
            continue
        if not isinstance(value, list | dict):
            continue
        if depth >= MAX_DEPTH:
            return path, _too_deep(path or "the top")
        items = enumerate(value) if isinstance(value, list) else value.items()
        # Spelled as pydantic spells a field's place (`messages.0.content`); a key is text too.
        children = [(item, _place(path, key), depth + 1) for key, item in items]
        if isinstance(value, dict):
            children += [(key, _place(path, key), depth + 1) for key in value]
        stack.extend(reversed(children))
    return None


def _place(path: str, key: object) -> str:
    shown = str(key)
    if not shown.isascii():
        try:
            shown.encode("utf-8")
        except UnicodeEncodeError:
            shown = ascii(shown)[1:-1]
    return f"{path}.{shown}" if path else shown


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def _pieces(text: str) -> list[str]:
    """The text as it would stream: one piece per simulated token."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


@dataclass(frozen=True, slots=True)
class Faults:
    """Failures to inject into completions (chat and text; never /health or /metrics).

    Each request draws once from a `random.Random(seed)`: with probability `error_rate` it
    gets a 500, with `timeout_rate` the server holds it for `hold_s` seconds of its clock
    (past any sane client timeout) and then answers 504.
    """

    error_rate: float = 0.0
    timeout_rate: float = 0.0
    hold_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.error_rate < 0 or self.timeout_rate < 0:
            raise UsageError(f"{self}: rates must not be negative")
        if self.error_rate + self.timeout_rate > 1:
            raise UsageError(f"{self}: error_rate + timeout_rate must be at most 1")


class SimHTTP:
    """Serves one `SimServer`. Run it with `runner()` (or build the app with `app()`).

    `faults` makes it fail on purpose (`injected_errors`, `injected_timeouts` count them);
    `disconnects` counts clients that hung up before their answer was sent.
    """

    def __init__(self, server: SimServer, *, faults: Faults | None = None) -> None:
        self.server = server
        self.model = server.profile.model
        self.faults = faults
        self._dice = random.Random(faults.seed if faults else 0)
        self.injected_errors = 0
        self.injected_timeouts = 0
        self.disconnects = 0

    async def _inject(self) -> web.Response | None:
        """The fault this request draws, if any."""
        if self.faults is None:
            return None
        draw = self._dice.random()
        if draw < self.faults.error_rate:
            self.injected_errors += 1
            body = {"error": {"message": "injected fault: internal error", "type": "server_error"}}
            return web.json_response(body, status=500)
        if draw < self.faults.error_rate + self.faults.timeout_rate:
            self.injected_timeouts += 1
            await self.server.clock.sleep(self.faults.hold_s)
            body = {"error": {"message": "injected fault: held too long", "type": "timeout"}}
            return web.json_response(body, status=504)
        return None

    def runner(self) -> web.AppRunner:
        """A runner for `app()` that cancels a handler whose client hangs up, so a request
        abandoned mid-simulation stops taking the simulated GPU's time."""
        return web.AppRunner(self.app(), handler_cancellation=True)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health)
        return app

    async def _body(self, request: web.Request, model: type[_Hinted]) -> _Hinted | web.Response:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"the request body is not valid JSON: {exc}")
        except RecursionError:
            return _error(400, _too_deep(""))
        if (found := _unreadable(data)) is not None:
            return _error(400, found[1], found[0] or None)
        if not isinstance(data, dict):
            return _error(400, "the request body must be a JSON object")
        try:
            body = model.model_validate(data)
        except RecursionError:  # never past MAX_DEPTH, but a bad body is a 400 whatever it is
            return _error(400, _too_deep(""))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            message = f"field {field!r}: {first['msg']}"
            if field == "n":
                message += "; the simulated server answers one choice a request: send n requests"
            return _error(400, message, field)
        if body.model and body.model != self.model:
            # vLLM's answer to a model it does not serve; an empty name means the served one.
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.model}` does not exist. This server "
                        f"serves `{self.model}`: set `model` on the backend (config key "
                        "`model`, or OpenAIBackend(model=...)).",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
                status=404,
            )
        return body

    def _sizes(
        self, body: _Hinted, messages: tuple[Message, ...], where: str
    ) -> int | web.Response | None:
        """The request's output limit for the simulator, or the 400 vLLM gives a request
        that cannot fit. None: no limit was asked for and the context leaves room for the
        simulator's default length, where its answer ends of itself (`finish_reason` stop);
        a limit the answer reaches ends it with `length`.

        Checked before any work: the output text and the block hashes cost time in proportion
        to the length, so a huge `max_tokens` refused afterwards would stall every request."""
        profile = self.server.profile
        context = profile.max_model_len
        prompt = self.server.prompt_tokens(messages)
        if prompt >= context:
            return _error(
                400,
                f"This model's maximum context length is {context} tokens. However, your "
                f"{where} resulted in {prompt} tokens. Please reduce the length of the {where}.",
                where,
            )
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        asked = body.limit()
        if asked is None:
            # As vLLM: no limit means what the context leaves (here capped by the default).
            left = context - prompt
            if left >= self.server.default_max_tokens:
                return None
            asked = left
        elif prompt + asked > context:
            return _error(
                400,
                f"This model's maximum context length is {context} tokens. However, you "
                f"requested {prompt + asked} tokens ({prompt} in the {where}, {asked} in the "
                f"completion). Please reduce the length of the {where} or {field}.",
                field,
            )
        if prompt + asked > profile.kv_tokens:
            return _error(
                400,
                f"This request needs {prompt + asked} tokens of KV cache ({prompt} in the "
                f"{where}, {asked} in the completion) but the whole cache holds "
                f"{profile.kv_tokens}; it could never run. Reduce {field} or the {where}.",
                field,
            )
        return asked

    async def _run(
        self, request: LLMRequest, hints: Hints
    ) -> tuple[dict[str, Any], LLMResponse] | web.Response:
        """The answer's envelope (id, model, usage) and the simulator's response; the same
        `SimServer.complete` as the in-process backend, so tools and schemas act alike."""
        fault = await self._inject()
        if fault is not None:
            return fault
        try:
            response = await self.server.complete(request, hints)
        except BackendError as exc:
            return _error(400, str(exc))
        except asyncio.CancelledError:
            # The client hung up (the runner cancels the handler): `submit` has taken the
            # request out of the simulated batch, as vLLM aborts it.
            self.disconnects += 1
            raise
        usage = response.usage
        out = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.model,
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens or 0},
            },
        }
        return out, response

    async def _stream(
        self,
        request: web.Request,
        body: _Hinted,
        out: dict[str, Any],
        chunks: list[dict[str, Any]],
    ) -> web.StreamResponse:
        """Send `chunks` as server-sent events, then the usage if asked for, then [DONE]."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        head = {k: out[k] for k in ("id", "object", "created", "model")}
        try:
            for choice in chunks:
                await response.write(_event({**head, "choices": [choice]}))
            if body.stream_options is not None and body.stream_options.include_usage:
                await response.write(_event({**head, "choices": [], "usage": out["usage"]}))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            # The client went away mid-stream (it may stop reading whenever it likes): the
            # simulated request has already finished, so there is nothing left to stop.
            self.disconnects += 1
        return response

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, _ChatBody)
        if isinstance(body, web.Response):
            return body
        assert isinstance(body, _ChatBody)
        messages = tuple(m.message() for m in body.messages)
        sampling = Sampling(temperature=body.temperature, seed=body.seed)
        tokens = self._sizes(body, messages, "messages")
        if isinstance(tokens, web.Response):
            return tokens
        request_ = LLMRequest(
            messages,
            body.model or self.model,
            sampling,
            tokens,
            tools=body.tool_specs(),
            output=body.output(),
        )
        ran = await self._run(request_, body.hints())
        if isinstance(ran, web.Response):
            return ran
        out, answer = ran
        calls: list[dict[str, Any]] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in answer.tool_calls
        ]
        if body.stream:
            out["object"] = "chat.completion.chunk"
            deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
            deltas += [{"content": piece} for piece in _pieces(answer.text)]
            for i, c in enumerate(answer.tool_calls):
                # As OpenAI streams a call: id and name first, then the arguments in pieces.
                head = {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": ""},
                }
                deltas.append({"tool_calls": [{"index": i, **head}]})
                deltas += [
                    {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
                    for piece in _pieces(c.arguments)
                ]
            chunks: list[dict[str, Any]] = [
                {"index": 0, "delta": d, "finish_reason": None} for d in deltas
            ]
            chunks.append({"index": 0, "delta": {}, "finish_reason": answer.finish_reason})
            return await self._stream(request, body, out, chunks)
        message: dict[str, Any] = {"role": "assistant", "content": answer.text}
        if calls:
            message["content"] = answer.text or None
            message["tool_calls"] = calls
        out["object"] = "chat.completion"
        out["choices"] = [{"index": 0, "message": message, "finish_reason": answer.finish_reason}]
        return web.json_response(out)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, _CompletionBody)
        if isinstance(body, web.Response):
            return body
        assert isinstance(body, _CompletionBody)
        # A raw prompt is one user message without the chat template's other turns.
        messages = (Message("user", body.prompt),)
        tokens = self._sizes(body, messages, "prompt")
        if isinstance(tokens, web.Response):
            return tokens
        request_ = LLMRequest(
            messages, body.model or self.model, max_tokens=tokens, output=body.output()
        )
        ran = await self._run(request_, body.hints())
        if isinstance(ran, web.Response):
            return ran
        out, answer = ran
        text, finish = answer.text, answer.finish_reason
        out["object"] = "text_completion"
        if body.stream:
            chunks = [{"index": 0, "text": p, "finish_reason": None} for p in _pieces(text)]
            chunks.append({"index": 0, "text": "", "finish_reason": finish})
            return await self._stream(request, body, out, chunks)
        out["choices"] = [{"index": 0, "text": text, "finish_reason": finish}]
        return web.json_response(out)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "owned_by": "plait-sim",
                        "max_model_len": self.server.profile.max_model_len,
                    }
                ],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        stats, profile = self.server.stats(), self.server.profile
        label = f'{{model_name="{self.model}"}}'
        lines = [
            "# HELP vllm:prefix_cache_queries_total Prompt tokens looked up in the prefix cache.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{label} {stats.prefix_cache_queries}",
            "# HELP vllm:prefix_cache_hits_total Prompt tokens found in the prefix cache.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{label} {stats.prefix_cache_hits}",
            "# HELP vllm:num_requests_running Requests in the running batch.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {stats.running}",
            "# HELP vllm:num_requests_waiting Requests waiting to be scheduled.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {stats.waiting}",
            "# HELP vllm:kv_cache_usage_perc Fraction of KV blocks in use (1 = 100%).",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{label} {stats.kv_cache_usage:.6f}",
            # vLLM's info gauge of its CacheConfig (labels: its fields as text), so a client
            # reads the cache size from here as from a real vLLM (`OpenAIBackend.capacity()`).
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{profile.block_size}",cache_dtype="auto",'
            f'enable_prefix_caching="True",engine="0",kv_cache_size_tokens="{profile.kv_tokens}",'
            f'num_cpu_blocks="None",num_gpu_blocks="{profile.num_blocks}"}} 1.0',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
