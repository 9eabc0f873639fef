"""A function-driven fake LLM: a real, small implementation of `LLMBackend` for tests."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from orchestrator import Clock, Hints, LLMRequest, LLMResponse, Usage

Reply = str | LLMResponse
ReplyFn = Callable[[LLMRequest, Hints], Reply | Awaitable[Reply]]


def approx_tokens(text: str) -> int:
    """About four characters a token, the usual rule of thumb for English with BPE."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True, slots=True)
class RecordedCall:
    request: LLMRequest
    hints: Hints
    at: float


class FunctionLLM:
    """Answers every call with `reply(request, hints)`, after `latency` seconds of clock time.

    `latency` is a number or a function of the request. Every call is recorded in `calls`
    with its hints, so tests can assert what the scheduler sent. Usage is estimated with
    `approx_tokens` unless the reply is a full `LLMResponse`. A text reply longer than the
    request's `max_tokens` is cut there (`finish_reason="length"`), as a server cuts it.
    """

    def __init__(
        self,
        reply: ReplyFn,
        *,
        latency: float | Callable[[LLMRequest], float] = 0.0,
        clock: Clock | None = None,
    ) -> None:
        self._reply = reply
        self._latency = latency
        self._clock = clock
        self.calls: list[RecordedCall] = []

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        loop_time = asyncio.get_running_loop().time()
        self.calls.append(RecordedCall(request, hints, loop_time))
        delay = self._latency(request) if callable(self._latency) else self._latency
        if delay > 0:
            await (self._clock.sleep(delay) if self._clock else asyncio.sleep(delay))
        out = self._reply(request, hints)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, LLMResponse):
            return out
        finish = "stop"
        if request.max_tokens is not None and approx_tokens(out) > request.max_tokens:
            out, finish = out[: request.max_tokens * 4], "length"
        prompt = sum(approx_tokens(m.content) for m in request.messages)
        return LLMResponse(
            text=out,
            usage=Usage(prompt_tokens=prompt, completion_tokens=approx_tokens(out)),
            finish_reason=finish,
            model=request.model,
        )


def echo(request: LLMRequest, hints: Hints) -> str:
    """A reply function that repeats the last message: handy in examples and tests."""
    return request.messages[-1].content if request.messages else ""
