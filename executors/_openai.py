"""An OpenAI-compatible backend: chat completions on `openai.AsyncOpenAI`, with plait's hints
spelled in the server's dialect, and the library's errors translated into plait's.

    async with OpenAIBackend("http://127.0.0.1:8000/v1", dialect="vllm") as llm:
        async with Engine(backends={"default": llm}) as engine:
            ...
"""

from __future__ import annotations

import contextlib
import json
from types import TracebackType
from typing import Any

import openai

from orchestrator import (
    BackendError,
    BackendOverloadedError,
    BackendRequestError,
    BackendUnavailableError,
    Hints,
    LLMRequest,
    LLMResponse,
    ToolCall,
    Usage,
    UsageError,
)

from ._dialects import DIALECTS, encode


class OpenAIBackend:
    """One OpenAI-compatible endpoint (vLLM, SGLang, Dynamo, llama.cpp, OpenAI, the simulator).

    One HTTP connection pool per backend (the client's). The client does not retry on
    its own (`max_retries=0`): retries are plait's, so they follow the scheduler and show as
    events. `model` overrides the request's model name (servers serve one model each).
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
    ) -> None:
        if dialect not in DIALECTS:
            raise UsageError(f"unknown dialect {dialect!r}; choose one of {', '.join(DIALECTS)}")
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

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        client = self._require_client()
        hinted = encode(self.dialect, hints, slots=self.slots)
        kwargs: dict[str, Any] = {
            "model": self.model or request.model,
            "messages": [_message(m) for m in request.messages],
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
        }
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
        try:
            raw = await client.chat.completions.with_raw_response.create(
                **kwargs, extra_body=hinted.body or None, extra_headers=hinted.headers or None
            )
            completion = raw.parse()
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except openai.APITimeoutError as exc:
            raise BackendUnavailableError(
                f"backend {self.name!r} did not answer within {self._timeout:g} s",
                backend=self.name,
            ) from exc
        except openai.APIConnectionError as exc:
            raise BackendUnavailableError(
                f"cannot reach backend {self.name!r} at {self.base_url}: {exc}",
                backend=self.name,
            ) from exc
        self.last_load_report = raw.headers.get("endpoint-load-metrics")
        if self.dialect == "sglang" and hints.last_call and hints.program_id:
            await self._close_sglang_session(client, hints.program_id)
        return _response(completion)

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

    async def _close_sglang_session(self, client: openai.AsyncOpenAI, session: str) -> None:
        # SGLang keeps a session's KV until it is closed; the program is done with it.
        root = self.base_url.removesuffix("/v1")
        with contextlib.suppress(openai.APIError):  # best effort: it is evicted in time anyway
            await client.post(f"{root}/close_session", body={"session_id": session}, cast_to=object)


def _message(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def _response(completion: Any) -> LLMResponse:
    if not completion.choices:
        raise BackendError("the backend answered with no choices")
    choice = completion.choices[0]
    calls = tuple(
        ToolCall(call.id, call.function.name, call.function.arguments or "")
        for call in (choice.message.tool_calls or ())
        if getattr(call, "function", None) is not None
    )
    usage = completion.usage
    cached: int | None = None
    if usage is not None and usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens
    return LLMResponse(
        text=choice.message.content or "",
        usage=Usage(
            usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0, cached
        ),
        finish_reason=choice.finish_reason or "stop",
        tool_calls=calls,
        model=completion.model,
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
