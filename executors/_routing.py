"""Prefix-aware routing over replicas of one model: pure policy, no I/O, no clock.

A prompt is cut into blocks; block i's hash covers blocks 0..i (chained), so a hash names a
whole prefix. The router remembers which replica last received each prefix (bounded, LRU).
For a new request it finds the longest prefix some healthy replica holds and sends the
request there, unless that replica is much busier than the others; otherwise it picks the
less loaded of two replicas chosen by consistent (rendezvous) hashing of the request's
deepest block, so that new prefixes spread but stay put (DualMap's two choices). Hashing
only the first block would send everything to one replica when all prompts share a system
prompt, hence the longest match.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Choice:
    replica: int
    matched_blocks: int
    """How many of the request's leading blocks the chosen replica is known to hold."""
    reason: str


def _score(key: int, replica: int, salt: int) -> int:
    # A well-mixing hash: crc32 is linear, and ranked replicas the same way for most keys.
    data = f"{salt}:{key}:{replica}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def two_candidates(key: int, replicas: Sequence[int]) -> tuple[int, int]:
    """Two distinct replicas for `key` by rendezvous hashing (stable as replicas come and go)."""
    ranked = sorted(replicas, key=lambda r: _score(key, r, 0), reverse=True)
    if len(ranked) == 1:
        return ranked[0], ranked[0]
    return ranked[0], ranked[1]


class PrefixRouter:
    """Remembers prefixes per replica and chooses a replica for each request.

    `max_imbalance`: affinity is kept while the holder's load is at most this many times
    the mean load (+1, so an idle cluster does not count as imbalanced).
    `capacity`: how many prefix hashes to remember in all (oldest forgotten first).
    """

    def __init__(
        self, replicas: int, *, max_imbalance: float = 1.5, capacity: int = 1_000_000
    ) -> None:
        if replicas < 1:
            raise ValueError("a router needs at least one replica")
        self.replicas = replicas
        self.max_imbalance = max_imbalance
        self.capacity = capacity
        self._where: OrderedDict[int, int] = OrderedDict()

    def choose(
        self, hashes: Sequence[int], loads: Sequence[float], healthy: Sequence[bool]
    ) -> Choice:
        alive = [r for r in range(self.replicas) if healthy[r]]
        if not alive:
            raise LookupError("no healthy replica to route to")
        mean = sum(loads[r] for r in alive) / len(alive)
        limit = self.max_imbalance * mean + 1.0
        # Longest known prefix held by a healthy replica that is not overloaded.
        for depth in range(len(hashes), 0, -1):
            holder = self._where.get(hashes[depth - 1])
            if holder is not None and healthy[holder] and loads[holder] <= limit:
                return Choice(holder, depth, "prefix")
        key = hashes[-1] if hashes else 0
        first, second = two_candidates(key, alive)
        pick = first if loads[first] <= loads[second] else second
        return Choice(pick, 0, "two-choices")

    def record(self, hashes: Sequence[int], replica: int) -> None:
        """`replica` now holds every prefix of this request."""
        where = self._where
        for h in hashes:
            where[h] = replica
            where.move_to_end(h)
        while len(where) > self.capacity:
            where.popitem(last=False)

    def forget_replica(self, replica: int) -> None:
        """A replica restarted or was ejected: it holds nothing any more."""
        for h in [h for h, r in self._where.items() if r == replica]:
            del self._where[h]
