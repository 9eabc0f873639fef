"""A Router: many backends serving one model, used as one backend.

Each request goes where its prompt's longest known prefix already sits (`PrefixRouter`),
so replicas reuse their KV caches instead of recomputing what another replica holds. A
backend that cannot be reached is ejected at once, its prefixes forgotten, and the request
fails over to another; it is tried again after `readmit_after_s`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from orchestrator import (
    BackendUnavailableError,
    Clock,
    Hints,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    UsageError,
    running_clock,
)

from ._prefix import prompt_hashes
from ._routing import PrefixRouter


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    name: str
    healthy: bool
    in_flight: int
    requests: int
    failures: int


class Router:
    """Routes each call to one of `backends` by prompt prefix and load.

    `block_tokens`: the prefix granularity (prompts are hashed in blocks of that many
    4-character tokens; match the servers' KV block size where you can).
    """

    def __init__(
        self,
        backends: Mapping[str, LLMBackend],
        *,
        block_tokens: int = 16,
        max_imbalance: float = 1.5,
        readmit_after_s: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if not backends:
            raise UsageError("a Router needs at least one backend")
        self.names = list(backends)
        self.backends = list(backends.values())
        self.block_tokens = block_tokens
        self.readmit_after_s = readmit_after_s
        self.policy = PrefixRouter(len(self.backends), max_imbalance=max_imbalance)
        self._clock = clock
        n = len(self.backends)
        self._in_flight = [0] * n
        self._healthy = [True] * n
        self._ejected_at = [0.0] * n
        self._requests = [0] * n
        self._failures = [0] * n
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> Router:
        self._clock = self._clock or running_clock()
        self._stack = contextlib.AsyncExitStack()
        await self._stack.__aenter__()
        for backend in self.backends:
            if isinstance(backend, contextlib.AbstractAsyncContextManager):
                await self._stack.enter_async_context(backend)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.__aexit__(exc_type, exc, tb)

    def _now(self) -> float:
        if self._clock is None:
            self._clock = running_clock()
        return self._clock.monotonic()

    def _readmit(self) -> None:
        now = self._now()
        for i, healthy in enumerate(self._healthy):
            if not healthy and now - self._ejected_at[i] >= self.readmit_after_s:
                self._healthy[i] = True  # on probation: one more failure ejects it again

    def _eject(self, replica: int) -> None:
        self._healthy[replica] = False
        self._ejected_at[replica] = self._now()
        self.policy.forget_replica(replica)

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        hashes = prompt_hashes(request, self.block_tokens)
        last_error: BackendUnavailableError | None = None
        for _ in range(len(self.backends)):
            self._readmit()
            try:
                choice = self.policy.choose(hashes, self._in_flight, self._healthy)
            except LookupError:
                break
            i = choice.replica
            self.policy.record(hashes, i)
            self._in_flight[i] += 1
            self._requests[i] += 1
            try:
                return await self.backends[i].complete(request, hints)
            except BackendUnavailableError as exc:
                self._failures[i] += 1
                self._eject(i)
                last_error = exc  # fail over to another replica
            finally:
                self._in_flight[i] -= 1
        raise BackendUnavailableError(
            f"no backend of this router could serve the call ({len(self.backends)} tried or "
            f"ejected); last error: {last_error}",
        ) from last_error

    def stats(self) -> list[ReplicaStats]:
        return [
            ReplicaStats(
                self.names[i],
                self._healthy[i],
                self._in_flight[i],
                self._requests[i],
                self._failures[i],
            )
            for i in range(len(self.backends))
        ]
