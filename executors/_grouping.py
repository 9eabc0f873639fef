"""Prefix grouping: when ready calls share a prefix nobody has computed yet, send one first.

Ten questions about one document, sent at once, make the server compute the document ten
times: they are scheduled in the same step, before any of them has filled a cache block.
`PrefixGrouper` sends the first and holds its siblings until it has finished, so they find
the prefix in the cache (and a prefix-aware `Router` underneath sends them where it is).
Calls whose prefix is already computed, or shares too little with the one in flight, go at
once; a sibling whose leader fails is released and becomes a leader itself.

The grouper declares every optional capability and forwards each to its backend where that
declares it (a `Router`'s health checks, an `OpenAIBackend`'s load), so wrapping hides none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from orchestrator import (
    FailureIsolating,
    HealthChecked,
    Hints,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    LoadReport,
    LoadReporting,
    ProgramAware,
    UrgentIsolating,
    WallClockBackend,
)

from ._prefix import Tokenize, prompt_hashes


@runtime_checkable
class _Described(Protocol):
    """A backend with a line for people (what `plait run` prints at the end), as `SimServer`."""

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class GroupingStats:
    calls: int
    held: int
    """Calls that waited for a sibling to compute their shared prefix first."""


class PrefixGrouper(
    ProgramAware,
    HealthChecked,
    LoadReporting,
    FailureIsolating,
    UrgentIsolating,
    WallClockBackend,
):
    """Wraps `backend`, holding calls that share `min_shared_blocks` uncomputed prefix blocks
    with a call in flight until that call returns.

    `block_tokens` is the hashing granularity (4-character tokens, or real ones with
    `tokenize`); `remember` bounds how many computed prefix blocks are remembered.
    """

    def __init__(
        self,
        backend: LLMBackend,
        *,
        block_tokens: int = 16,
        min_shared_blocks: int = 8,
        tokenize: Tokenize | None = None,
        remember: int = 1_000_000,
    ) -> None:
        self.backend = backend
        self.block_tokens = block_tokens
        self.min_shared_blocks = min_shared_blocks
        self._tokenize = tokenize
        self._remember = remember
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._computed: OrderedDict[int, None] = OrderedDict()
        self._calls = 0
        self._held = 0
        # What the backend declared, read once.
        self._program_aware = backend if isinstance(backend, ProgramAware) else None
        self._checked = backend if isinstance(backend, HealthChecked) else None
        self._reporting = backend if isinstance(backend, LoadReporting) else None
        self._isolating = backend if isinstance(backend, FailureIsolating) else None
        self._wall_clock = backend if isinstance(backend, WallClockBackend) else None
        self._described = backend if isinstance(backend, _Described) else None

    async def __aenter__(self) -> PrefixGrouper:
        if isinstance(self.backend, contextlib.AbstractAsyncContextManager):
            await self.backend.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(self.backend, contextlib.AbstractAsyncContextManager):
            await self.backend.__aexit__(exc_type, exc, tb)

    def _leader(self, hashes: Sequence[int]) -> asyncio.Future[None] | None:
        """The call computing the deepest part of this prompt's prefix, if it shares enough."""
        shared = 0
        leader: asyncio.Future[None] | None = None
        for h in hashes:
            if (future := self._pending.get(h)) is not None:
                shared += 1
                leader = future
            elif h not in self._computed:
                break
        return leader if shared >= self.min_shared_blocks else None

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        self._calls += 1
        hashes = prompt_hashes(request, self.block_tokens, self._tokenize)
        held = False
        while (leader := self._leader(hashes)) is not None:
            held = True
            await asyncio.shield(leader)  # a cancelled sibling must not cancel its leader
        self._held += held
        mine = [h for h in hashes if h not in self._pending and h not in self._computed]
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for h in mine:
            self._pending[h] = done
        ok = False
        try:
            response = await self.backend.complete(request, hints)
            ok = True
            return response
        finally:
            for h in mine:
                del self._pending[h]
                if ok:
                    self._computed[h] = None
                    self._computed.move_to_end(h)
            while len(self._computed) > self._remember:
                self._computed.popitem(last=False)
            done.set_result(None)

    # --- capabilities: as the backend's ----------------------------------------------------

    def isolates_urgent(self) -> bool:
        """A router with urgent lanes under the grouper keeps them (`UrgentIsolating`)."""
        inner = self.backend
        return isinstance(inner, UrgentIsolating) and inner.isolates_urgent()

    def isolates_failures(self) -> bool:
        """As the backend it wraps (a `Router` does)."""
        return self._isolating is not None and self._isolating.isolates_failures()

    def needs_wall_clock(self) -> bool:
        """The grouper waits on whatever its backend waits on."""
        return self._wall_clock is not None and self._wall_clock.needs_wall_clock()

    async def program_done(self, program_id: str) -> None:
        if self._program_aware is not None:
            await self._program_aware.program_done(program_id)

    async def check(self) -> None:
        """The backend's health check; passes if it has none (nothing here can fail)."""
        if self._checked is not None:
            await self._checked.check()

    async def load(self) -> LoadReport:
        """The backend's load; a report of unknowns if it reports none."""
        if self._reporting is not None:
            return await self._reporting.load()
        return LoadReport()

    def stats(self) -> GroupingStats:
        return GroupingStats(self._calls, self._held)

    def describe(self) -> str:
        """One line for people: the backend's own line, if it has one, and what was held."""
        text = f"grouping held {self._held} of {self._calls} calls"
        return f"{self._described.describe()}; {text}" if self._described is not None else text
