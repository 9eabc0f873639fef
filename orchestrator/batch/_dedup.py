"""A backend wrapper that computes identical LLM calls once.

Rows of a batch often ask exactly the same thing (the same model, messages and sampling):
rows repeated in the input, or a step every per-row workflow shares (a summary of the same
document). `Coalescing` sends the first such call; a copy that arrives while it is in
flight waits for it, and one that arrives later is answered from the `keep` latest answers.
A copy's usage says every prompt token came from cache. If the first call fails, each
waiting copy sends its own (a failure is not shared: it may not happen twice).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, replace

from ..model._errors import UsageError
from ..model._llm import (
    Hints,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    Usage,
    WrappedBackend,
)
from ._plan import call_key, deterministic


@dataclass(frozen=True, slots=True)
class CoalescingStats:
    calls: int
    """Calls sent to the backend."""
    coalesced: int
    """Calls answered by another identical call (in flight, or kept)."""


class Coalescing(WrappedBackend):
    """Wraps `backend`; identical calls (`call_key`) are sent once. Its capabilities are the
    backend's (`WrappedBackend`)."""

    def __init__(self, backend: LLMBackend, *, keep: int = 100_000) -> None:
        if keep < 0:
            raise UsageError(f"Coalescing(keep={keep}) must be 0 or more")
        super().__init__(backend)
        self.keep = keep
        self._flying: dict[str, asyncio.Future[LLMResponse]] = {}
        self._kept: OrderedDict[str, LLMResponse] = OrderedDict()
        self._calls = 0
        self._coalesced = 0

    def stats(self) -> CoalescingStats:
        return CoalescingStats(self._calls, self._coalesced)

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        if not deterministic(request):  # a sampled call: each copy is a sample of its own
            self._calls += 1
            return await self.backend.complete(request, hints)
        key = call_key(request)
        while True:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self._coalesced += 1
                return _shared(kept)
            flying = self._flying.get(key)
            if flying is None:
                return await self._lead(key, request, hints)
            try:
                answer = await asyncio.shield(flying)
            except Exception:
                continue  # the first failed: this copy goes on its own
            self._coalesced += 1
            return _shared(answer)

    async def _lead(self, key: str, request: LLMRequest, hints: Hints) -> LLMResponse:
        future: asyncio.Future[LLMResponse] = asyncio.get_running_loop().create_future()
        self._flying[key] = future
        self._calls += 1
        try:
            answer = await self.backend.complete(request, hints)
        except BaseException as exc:
            # Copies waiting on it go on their own; nothing reads this error but them.
            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            future.exception()
            raise
        finally:
            self._flying.pop(key, None)
        future.set_result(answer)
        if self.keep:
            self._kept[key] = answer
            while len(self._kept) > self.keep:
                self._kept.popitem(last=False)
        return answer

    def describe(self) -> str:
        s = self.stats()
        text = f"{s.calls} calls sent, {s.coalesced} identical calls answered once"
        inner = self.inner_description()
        return f"{inner}; {text}" if inner is not None else text


def _shared(answer: LLMResponse) -> LLMResponse:
    usage = answer.usage
    return replace(
        answer,
        usage=Usage(usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens),
    )
