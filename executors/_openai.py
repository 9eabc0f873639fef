"""An OpenAI-compatible backend: chat or text completions on `openai.AsyncOpenAI`, whole or
streamed, with plait's hints spelled in the server's dialect, the library's errors translated
into plait's, the server's health and load read from `/health` and `/metrics`, and its size
from where its kind of server says it (`capacity()`).

    async with OpenAIBackend("http://127.0.0.1:8000/v1", dialect="vllm", stream=True) as llm:
        async with Engine(backends={"default": llm}) as engine:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal

import openai

from orchestrator import (
    BackendError,
    Clock,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    ToolCall,
    Usage,
    UsageError,
)
from orchestrator.ext import (
    BackendOverloadedError,
    BackendRequestError,
    BackendUnavailableError,
    CapacityReporting,
    HealthChecked,
    LoadReport,
    LoadReporting,
    ProgramAware,
    ServerCapacity,
    WallClockBackend,
    running_clock,
)

from ._capacity import KEEPS_KV, probe_capacity
from ._dialects import DIALECTS, encode, merge, structured_output
from ._load import report_from_header, report_from_metrics
from ._simtext import render as render_prompt

Api = Literal["chat", "completions"]
APIS: tuple[Api, ...] = ("chat", "completions")

# SGLang's /open_session requires `capacity_of_str_len` (older servers) but only stores it.
SGLANG_SESSION_CAPACITY = 1 << 20

_CLIENT_FIELDS = frozenset({"stream", "stream_options", "n"})
"""Body fields this backend owns even when a request does not set them."""


class OpenAIBackend(
    ProgramAware, HealthChecked, LoadReporting, CapacityReporting, WallClockBackend
):
    """One OpenAI-compatible endpoint (vLLM, SGLang, Dynamo, llama.cpp, OpenAI, the simulator).

    Its capabilities, declared: it hears that a program is done (`program_done`, to close
    an SGLang session), can be probed (`check()`), reports the server's load (`load()`) and
    size (`capacity()`), and needs the system clock unless `local`. It does not isolate
    failures: one server.

    One HTTP connection pool per backend (the client's), also used for the probes. The client
    does not retry on its own (`max_retries=0`): retries are plait's, so they follow the
    scheduler and show as events. `model` overrides the request's model name (servers serve
    one model each).

    `api="completions"` sends `/v1/completions` with the messages rendered to one prompt by
    `render` (give it the model's chat template). `stream=True` streams the answer and reads
    the usage from its last chunk; the response then carries `first_token_s`, measured on
    `clock` (the running loop's by default). `probe_timeout_s` bounds `check()`, `load()` and
    `capacity()`. `kv_cache_tokens`: the server's KV cache in tokens, for a server that does
    not say its own (`capacity()`).
    `local=True`: the server runs in this process on the same event loop (tests, an in-process
    `SimHTTP`), so a virtual clock may drive both; otherwise the engine needs the system clock.
    """

    def __init__(
        self,
        base_url: str,
        *,
        dialect: str = "openai",
        model: str | None = None,
        api_key: str = "none",
        name: str = "",
        timeout_s: float = 600.0,
        slots: int | None = None,
        api: Api = "chat",
        stream: bool = False,
        render: Callable[[Sequence[Message]], str] = render_prompt,
        probe_timeout_s: float = 5.0,
        local: bool = False,
        clock: Clock | None = None,
        kv_cache_tokens: int | None = None,
    ) -> None:
        if dialect not in DIALECTS:
            raise UsageError(f"unknown dialect {dialect!r}; choose one of {', '.join(DIALECTS)}")
        if api not in APIS:
            raise UsageError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")
        if kv_cache_tokens is not None and kv_cache_tokens < 1:
            raise UsageError(
                f"OpenAIBackend(kv_cache_tokens={kv_cache_tokens}) must be at least 1, or "
                "None where the server says its own"
            )
        self.kv_cache_tokens = kv_cache_tokens
        self._capacity: ServerCapacity | None = None
        """What the server said of its size, once it answered."""
        self.api = api
        self.stream = stream
        self.render = render
        self.probe_timeout_s = probe_timeout_s
        self.local = local
        self._clock = clock
        self.base_url = base_url.rstrip("/")
        self.dialect = dialect
        self.model = model
        self.name = name or self.base_url
        self.slots = slots
        self._api_key = api_key
        self._timeout = timeout_s
        self._client: openai.AsyncOpenAI | None = None
        self.last_load_report: str | None = None
        """vLLM's `endpoint-load-metrics` header of the latest answer, when it sends one."""
        self.last_load: LoadReport | None = None
        """`last_load_report` read into a `LoadReport`, when it could be."""
        # SGLang sessions opened, by program; set once the open has been answered, so a
        # program's concurrent calls wait for it instead of opening twice.
        self._sessions: dict[str, asyncio.Event] = {}

    async def __aenter__(self) -> OpenAIBackend:
        # One client, so one connection pool, per backend, for as long as it is open.
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self._api_key, max_retries=0, timeout=self._timeout
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _require_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            raise UsageError(
                f"backend {self.name!r} is not open; use `async with OpenAIBackend(...)`"
            )
        return self._client

    @property
    def root(self) -> str:
        """The server's address without the API prefix: where `/health` and `/metrics` are."""
        return self.base_url.removesuffix("/v1")

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        client = self._require_client()
        if self.api == "completions" and request.tools:
            raise UsageError(
                f"backend {self.name!r} sends /v1/completions, which has no tools; "
                'use api="chat" for requests with tools'
            )
        kwargs = self._body(request)
        if self.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        # The structured-output field rides in the body beside the hints (the client has no
        # parameter for vLLM's), and extra_body may not replace it.
        structured = (
            structured_output(self.dialect, request.output) if request.output is not None else {}
        )
        hinted = merge(
            self.dialect,
            encode(self.dialect, hints, slots=self.slots),
            kwargs.keys() | _CLIENT_FIELDS | structured.keys(),
            request.extra_body,
            request.extra_headers,
        )
        kwargs["extra_body"] = {**structured, **hinted.body} or None
        kwargs["extra_headers"] = hinted.headers or None
        if self.dialect == "sglang":
            await self._open_sglang_session(client, hints)
        endpoint: Any = client.chat.completions if self.api == "chat" else client.completions
        clock = self._clock or running_clock()
        with self._translated():
            started = clock.monotonic()
            raw = await endpoint.with_raw_response.create(**kwargs)
            self.last_load_report = raw.headers.get("endpoint-load-metrics")
            self.last_load = report_from_header(self.last_load_report)
            if self.stream:
                assembly = _Assembly()
                async with raw.parse() as chunks:
                    async for chunk in chunks:
                        assembly.add(chunk, clock.monotonic() - started)
                response = assembly.response()
            else:
                response = _response(raw.parse())
        if self.dialect == "sglang" and hints.last_call and hints.program_id:
            await self._close_sglang_session(client, hints.program_id)
        return response

    def needs_wall_clock(self) -> bool:
        """It waits on a server's socket, which virtual time would jump over, unless the
        server runs in this process on the same loop (`local=True`: a test's server, or a
        `SimHTTP` front of an in-process simulator), whose time is the same clock."""
        return not self.local

    async def program_done(self, program_id: str) -> None:
        """The engine's note that a program has finished: release what the server keeps for
        it (an SGLang session its last call did not close: say the run failed, or ended with
        a non-LLM task)."""
        if program_id in self._sessions and self._client is not None:
            await self._close_sglang_session(self._client, program_id)

    async def check(self) -> None:
        """Raise `BackendUnavailableError` unless the server answers its health probe.

        GET `/health` (vLLM, SGLang, llama.cpp, Dynamo, the simulator), or `/v1/models` for
        the `openai` dialect. Only no answer, or a 5xx one (llama.cpp's 503 while it loads the
        model), fails: a 4xx still shows a live server.
        """
        client = self._require_client()
        url = f"{self.base_url}/models" if self.dialect == "openai" else f"{self.root}/health"
        try:
            await client.get(url, cast_to=str, options={"timeout": self.probe_timeout_s})
        except openai.APIStatusError as exc:
            if exc.status_code >= 500:
                raise BackendUnavailableError(
                    f"backend {self.name!r} is unhealthy: {url} answered {exc.status_code}",
                    backend=self.name,
                    status=exc.status_code,
                ) from exc
        except openai.APIConnectionError as exc:
            raise BackendUnavailableError(
                f"backend {self.name!r} did not answer its health probe at {url}: {exc}",
                backend=self.name,
            ) from exc

    async def load(self) -> LoadReport:
        """The server's load from its Prometheus `/metrics` (vLLM, SGLang, llama.cpp names).

        Raises `BackendUnavailableError` if it cannot be reached, and `BackendRequestError`
        if it serves no metrics (llama.cpp needs `--metrics`).
        """
        client = self._require_client()
        with self._translated(self.probe_timeout_s):
            text = await client.get(
                f"{self.root}/metrics", cast_to=str, options={"timeout": self.probe_timeout_s}
            )
        return report_from_metrics(text)

    async def capacity(self) -> ServerCapacity:
        """The server's KV cache, KV block and sequences at once, as it says them (vLLM's
        `/metrics` `vllm:cache_config_info`, SGLang's `/server_info`, llama.cpp's `/props`:
        `executors._capacity`), asked once it has answered, each ask within
        `probe_timeout_s`; `kv_cache_tokens` where it does not say its KV cache. Never
        raises: a server that is down, or a backend not open, says nothing (until asked
        again)."""
        said = self._capacity
        if said is None and self._client is not None:
            said = self._capacity = await probe_capacity(self._get_text, self.root, self.dialect)
        if said is None:
            said = ServerCapacity(keeps_kv=self.dialect in KEEPS_KV)
        if said.kv_tokens is None and self.kv_cache_tokens is not None:
            said = replace(said, kv_tokens=self.kv_cache_tokens, kv_from_config=True)
        return said

    async def _get_text(self, url: str) -> str | None:
        """`url`'s body; None for a 4xx (not served here); `BackendUnavailableError` for no
        answer or a 5xx (a server still loading its model)."""
        client = self._require_client()
        try:
            text: str = await client.get(
                url, cast_to=str, options={"timeout": self.probe_timeout_s}
            )
        except openai.APIStatusError as exc:
            if exc.status_code < 500:
                return None
            raise self._status_error(exc) from exc
        except openai.APIConnectionError as exc:  # timeouts too
            raise BackendUnavailableError(
                f"backend {self.name!r} did not answer {url}: {exc}", backend=self.name
            ) from exc
        return text

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model or request.model,
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
        }
        if self.api == "chat":
            kwargs["messages"] = [_message(m) for m in request.messages]
        else:
            kwargs["prompt"] = self.render(request.messages)
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        if request.sampling.seed is not None:
            kwargs["seed"] = request.sampling.seed
        if request.sampling.stop:
            kwargs["stop"] = list(request.sampling.stop)
        if request.tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters or {"type": "object", "properties": {}},
                    },
                }
                for t in request.tools
            ]
        return kwargs

    @contextlib.contextmanager
    def _translated(self, timeout_s: float | None = None) -> Iterator[None]:
        """Translate the client's errors, raised on sending or mid-stream, into plait's."""
        try:
            yield
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except openai.APITimeoutError as exc:
            raise BackendUnavailableError(
                f"backend {self.name!r} did not answer within {timeout_s or self._timeout:g} s",
                backend=self.name,
            ) from exc
        except openai.APIConnectionError as exc:
            raise BackendUnavailableError(
                f"cannot reach backend {self.name!r} at {self.base_url}: {exc}",
                backend=self.name,
            ) from exc
        except openai.APIError as exc:  # an error event in the middle of a stream
            raise BackendError(
                f"backend {self.name!r} failed while answering: {exc.message}", backend=self.name
            ) from exc

    def _status_error(self, exc: openai.APIStatusError) -> BackendError:
        status = exc.status_code
        detail = _error_detail(exc)
        where = f"backend {self.name!r} answered {status}: {detail}"
        if status in (429, 503):
            retry_after = _retry_after(exc.response.headers.get("retry-after"))
            return BackendOverloadedError(
                where, backend=self.name, status=status, retry_after=retry_after
            )
        if 400 <= status < 500:
            return BackendRequestError(where, backend=self.name, status=status)
        return BackendError(where, backend=self.name, status=status)

    async def _open_sglang_session(self, client: openai.AsyncOpenAI, hints: Hints) -> None:
        # A program that will be back (it asks for keep-alive) gets an SGLang session, whose
        # KV the server keeps for `timeout` idle seconds, once, before its first call.
        program = hints.program_id
        if not program or hints.keep_alive_s is None or hints.last_call:
            return
        opened = self._sessions.get(program)
        if opened is not None:
            await opened.wait()
            return
        self._sessions[program] = opened = asyncio.Event()
        body = {
            "capacity_of_str_len": SGLANG_SESSION_CAPACITY,
            "session_id": program,
            "timeout": hints.keep_alive_s,
        }
        try:
            # Best effort, and tried once: without a session the call still runs, only its
            # KV is not protected. A refusal (say, the session is still open) is no error.
            with contextlib.suppress(openai.APIError):
                await client.post(f"{self.root}/open_session", body=body, cast_to=object)
        finally:
            opened.set()

    async def _close_sglang_session(self, client: openai.AsyncOpenAI, session: str) -> None:
        # SGLang keeps a session's KV until it is closed; the program is done with it.
        self._sessions.pop(session, None)
        with contextlib.suppress(openai.APIError):  # best effort: it is evicted in time anyway
            await client.post(
                f"{self.root}/close_session", body={"session_id": session}, cast_to=object
            )


def _message(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return out


def _response(completion: Any) -> LLMResponse:
    if not completion.choices:
        raise BackendError("the backend answered with no choices")
    choice = completion.choices[0]
    message = getattr(choice, "message", None)  # None: a text completion
    calls = tuple(
        ToolCall(call.id, call.function.name, call.function.arguments or "")
        for call in ((message.tool_calls if message else None) or ())
        if getattr(call, "function", None) is not None
    )
    return LLMResponse(
        text=(message.content if message else choice.text) or "",
        usage=_usage(completion.usage),
        finish_reason=choice.finish_reason or "stop",
        tool_calls=calls,
        model=completion.model,
    )


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    details = getattr(usage, "prompt_tokens_details", None)
    cached = details.cached_tokens if details is not None else None
    return Usage(usage.prompt_tokens, usage.completion_tokens, cached)


@dataclass
class _Assembly:
    """A streamed answer put back together, chunk by chunk (chat deltas or text pieces)."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    first_token_s: float | None = None

    def add(self, chunk: Any, elapsed_s: float) -> None:
        if chunk.usage is not None:  # the last chunk, with `include_usage`
            self.usage = _usage(chunk.usage)
        self.model = chunk.model or self.model
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = getattr(choice, "delta", None)  # None: a text completion
            piece = (delta.content if delta is not None else choice.text) or ""
            self.text.append(piece)
            tool_calls = (delta.tool_calls if delta is not None else None) or ()
            for call in tool_calls:
                # The id and name come in the call's first delta, the arguments in pieces.
                parts = self.calls.setdefault(call.index, ["", "", ""])
                parts[0] = call.id or parts[0]
                if call.function is not None:
                    parts[1] = call.function.name or parts[1]
                    parts[2] += call.function.arguments or ""
            # The first chunk often carries only the role: it is not a token.
            if self.first_token_s is None and (piece or tool_calls):
                self.first_token_s = elapsed_s
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def response(self) -> LLMResponse:
        return LLMResponse(
            text="".join(self.text),
            usage=self.usage,
            finish_reason=self.finish_reason,
            tool_calls=tuple(ToolCall(*self.calls[i]) for i in sorted(self.calls)),
            model=self.model,
            first_token_s=self.first_token_s,
        )


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        return json.dumps(body)[:500]
    return str(exc.message)[:500]


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date; rare from model servers
