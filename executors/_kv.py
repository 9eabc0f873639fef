"""A paged KV cache with block-level prefix caching, as vLLM keeps it.

Blocks hold `block_size` tokens. A full block is known by a chained hash (block i's hash
covers blocks 0..i), so equal hashes mean equal prefixes. Blocks nobody references stay
cached until they are reused: the free queue is LRU, allocation takes from its head and
evicts whatever prefix the block held. Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast


@dataclass(frozen=True, slots=True)
class CacheStats:
    num_blocks: int
    free_blocks: int
    cached_blocks: int
    queries: int
    hits: int

    @property
    def usage(self) -> float:
        """Share of blocks referenced by running (or pinned) requests, as vLLM reports it."""
        return 1.0 - self.free_blocks / self.num_blocks if self.num_blocks else 0.0


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # hash -> block
        # Unreferenced blocks, least recently used first; a dict keeps O(1) removal.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.queries = 0
        self.hits = 0

    @property
    def free(self) -> int:
        return len(self._free)

    def match(self, hashes: Sequence[int]) -> list[int]:
        """The blocks holding the longest cached prefix of `hashes` (not yet referenced)."""
        # Every lookup at C speed, then cut at the first miss: most of a prompt usually hits.
        found = list(map(self._cached.get, hashes))
        if None in found:
            del found[found.index(None) :]
        return cast(list[int], found)

    def fits(self, hits: Sequence[int], n: int) -> bool:
        """Whether `n` fresh blocks can be allocated once `hits` (from `match`) are acquired.
        If not, the unreferenced blocks among `hits` become the most recently used, as
        acquiring and at once releasing them would make them (an admission that failed)."""
        ref = self._ref
        idle = [block for block in hits if ref[block] == 0]
        if n <= len(self._free) - len(idle):
            return True
        touch = self._free.move_to_end
        for block in reversed(idle):
            touch(block)
        return False

    def count_query(self, tokens: int, hit_tokens: int) -> None:
        self.queries += tokens
        self.hits += hit_tokens

    def acquire(self, blocks: Iterable[int]) -> None:
        """Reference cached blocks (a prefix hit, or a pin)."""
        ref, free = self._ref, self._free
        for block in blocks:
            if ref[block] == 0:
                del free[block]
            ref[block] += 1

    def allocate(self, n: int) -> list[int] | None:
        """`n` fresh blocks, evicting least recently used cached ones; None if too few."""
        if n > len(self._free):
            return None
        out: list[int] = []
        free, ref, hashes, cached = self._free, self._ref, self._hash, self._cached
        for _ in range(n):
            block, _ = free.popitem(last=False)
            old = hashes[block]
            if old is not None:
                if cached.get(old) == block:
                    del cached[old]
                hashes[block] = None
            ref[block] = 1
            out.append(block)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block. Pass a request's blocks in order: the tail
        is freed first, so it is evicted first, and shared prefixes live longest. Blocks
        holding no reusable prefix (never filled) go to the front of the queue, to be
        reused before any cached block is evicted, as vLLM's block pool does."""
        ref, free, hashes = self._ref, self._free, self._hash
        for block in reversed(blocks):
            ref[block] -= 1
            if ref[block] == 0:
                free[block] = None
                if hashes[block] is None:
                    free.move_to_end(block, last=False)
            elif ref[block] < 0:
                raise AssertionError(f"block {block} released more often than acquired")

    def register(self, block: int, block_hash: int) -> None:
        """`block` is full and holds the prefix `block_hash`: later requests may reuse it."""
        if self._hash[block] is not None:
            return
        if block_hash in self._cached:
            return  # the same prefix computed twice at once: keep the first copy
        self._hash[block] = block_hash
        self._cached[block_hash] = block

    def stats(self) -> CacheStats:
        return CacheStats(
            self.num_blocks, len(self._free), len(self._cached), self.queries, self.hits
        )
