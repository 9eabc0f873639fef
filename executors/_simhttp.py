"""The simulated server behind an OpenAI-compatible HTTP endpoint, with vLLM's metrics.

    plait sim serve --profile h100-llama3-8b --port 8000

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /metrics
(Prometheus text with vLLM's metric names), GET /health. Hints ride in the body as the
`sim` dialect spells them: `priority` (lower runs sooner, as in vLLM), `session_id` (the
program), `keep_alive_s` and `last_call`. Every bad request gets a 400 whose message names
the field; nothing a client sends can crash the server.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator import BackendError, Hints, LLMRequest, Message, Sampling

from ._sim import SimServer

MAX_BODY_BYTES = 8 * 1024 * 1024


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = ""


class _Hinted(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    seed: int | None = None
    stream: bool = False
    priority: float = 0.0
    session_id: str | None = None
    keep_alive_s: float | None = Field(default=None, ge=0)
    last_call: bool = False

    def hints(self) -> Hints:
        return Hints(
            program_id=self.session_id or "",
            urgency=-self.priority,
            keep_alive_s=self.keep_alive_s,
            last_call=self.last_call,
        )

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class _ChatBody(_Hinted):
    messages: list[_ChatMessage] = Field(min_length=1)


class _CompletionBody(_Hinted):
    prompt: str


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param}}
    return web.json_response(body, status=status)


class SimHTTP:
    """Serves one `SimServer`. Build the app with `app()`; run it with aiohttp."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.model = server.profile.model

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
        if not isinstance(data, dict):
            return _error(400, "the request body must be a JSON object")
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            return _error(400, f"field {field!r}: {first['msg']}", field)
        if body.stream:
            return _error(
                400, "streaming is not supported by the simulator; send stream=false", "stream"
            )
        return body

    async def _run(self, request: LLMRequest, hints: Hints) -> dict[str, Any] | web.Response:
        try:
            response = await self.server.complete(request, hints)
        except BackendError as exc:
            return _error(400, str(exc))
        usage = response.usage
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.model,
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens or 0},
            },
            "_text": response.text,
            "_finish": response.finish_reason,
        }

    async def chat(self, request: web.Request) -> web.Response:
        body = await self._body(request, _ChatBody)
        if isinstance(body, web.Response):
            return body
        assert isinstance(body, _ChatBody)
        messages = tuple(
            Message("system" if m.role == "developer" else m.role, m.content or "")
            for m in body.messages
        )
        sampling = Sampling(temperature=body.temperature, seed=body.seed)
        out = await self._run(
            LLMRequest(messages, body.model or self.model, sampling, body.limit()), body.hints()
        )
        if isinstance(out, web.Response):
            return out
        text, finish = out.pop("_text"), out.pop("_finish")
        out["object"] = "chat.completion"
        out["choices"] = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        ]
        return web.json_response(out)

    async def completions(self, request: web.Request) -> web.Response:
        body = await self._body(request, _CompletionBody)
        if isinstance(body, web.Response):
            return body
        assert isinstance(body, _CompletionBody)
        # A raw prompt is one user message without the chat template's other turns.
        messages = (Message("user", body.prompt),)
        out = await self._run(
            LLMRequest(messages, body.model or self.model, max_tokens=body.limit()), body.hints()
        )
        if isinstance(out, web.Response):
            return out
        text, finish = out.pop("_text"), out.pop("_finish")
        out["object"] = "text_completion"
        out["choices"] = [{"index": 0, "text": text, "finish_reason": finish}]
        return web.json_response(out)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "owned_by": "plait-sim"}],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        stats = self.server.stats()
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
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
