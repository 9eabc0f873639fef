"""Prefix-aware routing over replicas of one model: pure policy, no I/O, no clock.

A prompt is cut into blocks; block i's hash covers blocks 0..i (chained), so a hash names a
whole prefix. The router keeps, per replica, a model of that replica's prefix cache built
from its own routing history: what it sent there, most recent first, bounded by the
replica's cache size when it is known (`blocks_per_replica`). A prefix is evicted from the
model the way the server evicts it (least recently used, a request's tail before its
head), so the router stops believing in prefixes the replica has long since dropped. It
never sees the servers' caches.

For a new request it finds the replicas holding the longest prefix of it and takes the
least loaded of them, unless all of them are overloaded; otherwise, or for a prefix nobody
holds, the replica with the least recent work. Load is the work the router itself assigned:
the blocks each request had to compute (its blocks minus the modelled hit), decayed per
routed request, so balance is kept in prompt tokens computed rather than in requests
(Dynamo's KV router and SGLang's cache-aware policy weigh the same two things). Matching
the longest prefix rather than the first block matters: when every prompt starts with the
same system prompt, every replica holds that block and the next blocks decide.
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
    """How many of the request's leading blocks the chosen replica is believed to hold."""
    reason: str
    """"key": where the request's prefix key was placed; "prefix": a replica holding the
    longest known prefix; "least-loaded": nobody holds any of it, or every holder was
    overloaded."""


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
    """Models each replica's prefix cache and chooses a replica for each request.

    `max_imbalance`, `load_slack`: a replica holding the prefix keeps the request while its
    in-flight requests (`loads`) are at most `max_imbalance` times the mean plus
    `load_slack`. A larger slack treats a few more in-flight requests as jitter rather
    than overload: breaking affinity for jitter costs a recomputed prefix (on the Mooncake
    synthetic trace over 4 replicas, a slack of 4 instead of 1 gives a hit share of 0.232
    instead of 0.216). `max_work_imbalance`: nor while its recent work is more
    than this many times the least worked replica's (plus the request's own blocks).
    `blocks_per_replica`: each replica's KV cache in blocks (None: unknown, remember
    everything up to `capacity`). `capacity`: prefix hashes remembered over all replicas.
    `half_life`: after this many routed requests, a replica's past work counts half.
    `keys`: prefix keys remembered (each names the replica its latest request went to).
    """

    def __init__(
        self,
        replicas: int,
        *,
        max_imbalance: float = 1.5,
        capacity: int = 1_000_000,
        blocks_per_replica: int | None = None,
        load_slack: float = 1.0,
        max_work_imbalance: float = 1.25,
        half_life: float = 1000.0,
        keys: int = 100_000,
    ) -> None:
        if replicas < 1:
            raise ValueError("a router needs at least one replica")
        if blocks_per_replica is not None and blocks_per_replica < 1:
            raise ValueError(f"blocks_per_replica must be positive, got {blocks_per_replica}")
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        if keys < 1:
            raise ValueError(f"keys must be positive, got {keys}")
        self.replicas = replicas
        self.max_imbalance = max_imbalance
        self.capacity = capacity
        self.blocks_per_replica = blocks_per_replica
        self.load_slack = load_slack
        self.max_work_imbalance = max_work_imbalance
        self._decay = 0.5 ** (1.0 / half_life)
        # Per replica, the prefix hashes believed cached there, least recently used first.
        self._held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self._remembered = 0
        self._work = [0.0] * replicas
        self.keys = keys
        # Prefix key -> the replica its latest request went to, least recently used first.
        self._placed: OrderedDict[str, int] = OrderedDict()

    def held_prefix(self, hashes: Sequence[int], replica: int) -> int:
        """How many leading blocks of `hashes` `replica` is believed to hold."""
        held = self._held[replica]
        # The modelled set is prefix-closed: whoever touches block i touched blocks 0..i-1
        # (same chained hash, same prefix) more recently, and eviction takes the least
        # recent first. So the longest held prefix can be found by bisection.
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def work(self) -> list[float]:
        """Each replica's recent work: blocks it was sent to compute, decayed."""
        return list(self._work)

    def choose(
        self,
        hashes: Sequence[int],
        loads: Sequence[float],
        healthy: Sequence[bool],
        prefix_key: str | None = None,
    ) -> Choice:
        alive = [r for r in range(self.replicas) if healthy[r]]
        if not alive:
            raise LookupError("no healthy replica to route to")
        work = self._work
        mean_load = sum(loads[r] for r in alive) / len(alive)
        load_limit = self.max_imbalance * mean_load + self.load_slack
        placed = self._placed.get(prefix_key) if prefix_key is not None else None
        if placed is not None and healthy[placed] and loads[placed] <= load_limit:
            return Choice(placed, self.held_prefix(hashes, placed), "key")
        # Against the least worked replica, so that one just (re)admitted, with an empty
        # cache, draws work even when every other replica holds the prefix. Plus the request
        # itself, so that the first requests of a run do not count as imbalance.
        work_limit = self.max_work_imbalance * min(work[r] for r in alive) + len(hashes)
        key = hashes[-1] if hashes else 0

        def rank(r: int) -> tuple[float, int]:
            # Least work first; on a tie (an idle cluster) rendezvous hashing spreads new
            # prefixes over replicas and keeps each where it went.
            return work[r], -_score(key, r, 0)

        matched = {r: self.held_prefix(hashes, r) for r in alive}
        best = max(matched.values())
        if best > 0:
            holders = [
                r
                for r in alive
                if matched[r] == best and loads[r] <= load_limit and work[r] <= work_limit
            ]
            if holders:
                pick = min(holders, key=rank)
                return Choice(pick, best, "prefix")
        spare = [r for r in alive if loads[r] <= load_limit] or alive
        # What each would have after taking this request: a partial holder computes less.
        pick = min(spare, key=lambda r: (work[r] + len(hashes) - matched[r], rank(r)))
        return Choice(pick, matched[pick], "least-loaded")

    def record(self, hashes: Sequence[int], replica: int, prefix_key: str | None = None) -> None:
        """`replica` was sent this request: it will hold every prefix of it (and the
        requests with its `prefix_key` go there next)."""
        if prefix_key is not None:
            self._placed[prefix_key] = replica
            self._placed.move_to_end(prefix_key)
            if len(self._placed) > self.keys:
                self._placed.popitem(last=False)
        computed = len(hashes) - self.held_prefix(hashes, replica)
        decay = self._decay
        self._work = [w * decay for w in self._work]
        self._work[replica] += computed
        held = self._held[replica]
        before = len(held)
        # Tail first, so the head is the most recently used, as a server frees a request's
        # blocks: the shared prefix outlives the request's own suffix.
        for h in reversed(hashes):
            held[h] = None
            held.move_to_end(h)
        self._remembered += len(held) - before
        if self.blocks_per_replica is not None:
            while len(held) > self.blocks_per_replica:
                held.popitem(last=False)
                self._remembered -= 1
        while self._remembered > self.capacity:
            largest = max(self._held, key=len)
            largest.popitem(last=False)
            self._remembered -= 1

    def forget_replica(self, replica: int) -> None:
        """A replica restarted or was ejected: it holds nothing any more."""
        self._remembered -= len(self._held[replica])
        self._held[replica] = OrderedDict()
        for key in [k for k, r in self._placed.items() if r == replica]:
            del self._placed[key]
