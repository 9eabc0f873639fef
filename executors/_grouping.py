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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from orchestrator import Hints, LLMBackend, LLMRequest, LLMResponse
from orchestrator.ext import ServerCapacity, WrappedBackend

from ._capacity import DEFAULT_BLOCK_TOKENS, router_block
from ._prefix import Tokenize, prompt_hashes


@dataclass(frozen=True, slots=True)
class GroupingStats:
    calls: int
    held: int
    """Calls that waited for a sibling to compute their shared prefix first."""


class PrefixGrouper(WrappedBackend):
    """Wraps `backend`, holding calls that share `min_shared_blocks` uncomputed prefix blocks
    with a call in flight until that call returns.

    `block_tokens` is the hashing granularity (4-character tokens, or real ones with
    `tokenize`); None (the default): the KV block `backend` says it uses (`capacity()`,
    made at least 16 tokens), read as the grouper is entered, else 16. `remember` bounds
    how many computed prefix blocks are remembered.
    """

    def __init__(
        self,
        backend: LLMBackend,
        *,
        block_tokens: int | None = None,
        min_shared_blocks: int = 8,
        tokenize: Tokenize | None = None,
        remember: int = 1_000_000,
    ) -> None:
        super().__init__(backend)
        self._block_given = block_tokens
        self.block_tokens = block_tokens or DEFAULT_BLOCK_TOKENS  # until the backend says its
        self.min_shared_blocks = min_shared_blocks
        self._tokenize = tokenize
        self._remember = remember
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._computed: OrderedDict[int, None] = OrderedDict()
        self._calls = 0
        self._held = 0

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        if self._block_given is None:
            try:
                said = await self.capacity()
            except Exception:  # the protocol says it does not raise; one that does said nothing
                said = ServerCapacity()
            self.block_tokens = router_block([said]) or DEFAULT_BLOCK_TOKENS
        return self

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
        hashes = prompt_hashes(request, self.block_tokens, self._tokenize, hints.cache_salt)
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

    def stats(self) -> GroupingStats:
        return GroupingStats(self._calls, self._held)

    def describe(self) -> str:
        """One line for people: the backend's own line, if it has one, and what was held."""
        text = f"grouping held {self._held} of {self._calls} calls"
        inner = self.inner_description()
        return f"{inner}; {text}" if inner is not None else text
