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

Routers of several engines in front of the same replicas keep one model between them:
`record` returns a `Placement`, a small value that the others apply with `observe`, so each
one's model of every replica's cache and recent work covers every engine's requests.

Cost: an index from each block hash to the replicas believed to hold it finds the longest
held prefix over all replicas with one bisection, instead of one per replica; each
replica's model keeps its blocks in runs along the prefix tree (`CacheModel`), so a request
costs a step per block it adds, not per block it reuses.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ._cachemodel import CacheModel


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


@dataclass(frozen=True, slots=True)
class Placement:
    """One request a router placed, for the routers of other engines to apply (`observe`).

    Block hashes are chained, so one hash names a whole prefix: `base` is the hash of block
    `base_blocks - 1`, the end of the longest prefix of the request that some replica held
    by the placing router's model (and so, about, by its peers'), and `tail` holds the
    hashes after it. A conversation's turn then carries only the blocks that the turn
    added. With `base_blocks` 0, `tail` is the whole request. `computed`: of its blocks,
    those the replica had to compute (by the placing router's model), the work it adds."""

    replica: int
    tail: tuple[int, ...]
    computed: int
    base: int = 0
    base_blocks: int = 0
    prefix_key: str | None = None

    @property
    def blocks(self) -> int:
        return self.base_blocks + len(self.tail)


# The positions of the set bits of each byte, to list the replicas in a mask quickly.
_BITS = tuple(tuple(i for i in range(8) if byte >> i & 1) for byte in range(256))


_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend


def _members(mask: int) -> list[int]:
    """The replicas in `mask`, in ascending order."""
    out: list[int] = []
    if mask.bit_count() <= 4:  # a prefix of one conversation: held by one replica or two
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out
    offset = 0
    while mask:
        byte = mask & 255
        if byte:
            out.extend(offset + i for i in _BITS[byte])
        mask >>= 8
        offset += 8
    return out


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
        self._held = [CacheModel() for _ in range(replicas)]
        self._uses = 0
        # Each hash believed cached somewhere -> a mask of the replicas holding it. Every
        # replica's set is prefix-closed (see held_prefix), so along a request's hashes the
        # masks only lose replicas: the longest prefix any replica holds is one bisection.
        self._where: dict[int, int] = {}
        self._all = (1 << replicas) - 1
        self._remembered = 0
        # Per replica, blocks of requests routed there and not yet served: queued behind
        # others, they have pushed nothing out of its cache yet.
        self._pending = [0] * replicas
        self._pending_total = 0
        self._work = [0.0] * replicas
        self.keys = keys
        # Prefix key -> the replica its latest request went to, least recently used first.
        self._placed: OrderedDict[str, int] = OrderedDict()
        self.unresolved = 0
        """Peers' placements whose `base` no replica held here (their blocks were not applied)."""
        self._chosen: tuple[Sequence[int], int] | None = None

    def held_prefix(self, hashes: Sequence[int], replica: int) -> int:
        """How many leading blocks of `hashes` `replica` is believed to hold."""
        held = self._held[replica].run
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
        every = all(healthy)
        alive = range(self.replicas) if every else [r for r in range(self.replicas) if healthy[r]]
        if not alive:
            raise LookupError("no healthy replica to route to")
        work = self._work
        whole = every and len(loads) == self.replicas  # then the sums run over all of it
        mean_load = (sum(loads) if whole else sum([loads[r] for r in alive])) / len(alive)
        load_limit = self.max_imbalance * mean_load + self.load_slack
        placed = self._placed.get(prefix_key) if prefix_key is not None else None
        if placed is not None and healthy[placed] and loads[placed] <= load_limit:
            return Choice(placed, self.held_prefix(hashes, placed), "key")
        # Against the least worked replica, so that one just (re)admitted, with an empty
        # cache, draws work even when every other replica holds the prefix. Plus the request
        # itself, so that the first requests of a run do not count as imbalance.
        n = len(hashes)
        work_limit = (
            self.max_work_imbalance * (min(work) if every else min([work[r] for r in alive])) + n
        )
        key = hashes[-1] if hashes else 0
        alive_mask = self._all if every else sum(1 << r for r in alive)
        best = self._longest(hashes, alive_mask)
        if every:
            self._chosen = (hashes, best)  # record() names its placement by the same prefix
        if best > 0:
            holders = [
                r
                for r in _members(self._where[hashes[best - 1]] & alive_mask)
                if loads[r] <= load_limit and work[r] <= work_limit
            ]
            if holders:
                # Least work first; on a tie (an idle cluster) rendezvous hashing spreads
                # new prefixes over replicas and keeps each where it went.
                return Choice(_least(holders, work, work, key), best, "prefix")
        spare = [r for r in alive if loads[r] <= load_limit] or list(alive)
        matched = self._matched(hashes, best, alive_mask) if best > 0 else {}
        # What each would have after taking this request: a partial holder computes less.
        after = {r: work[r] + n - matched.get(r, 0) for r in spare}
        pick = _least(spare, after, work, key)
        return Choice(pick, matched.get(pick, 0), "least-loaded")

    def _longest(self, hashes: Sequence[int], mask: int) -> int:
        """The most leading blocks of `hashes` any replica in `mask` holds."""
        get = self._where.get
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if get(hashes[mid - 1], 0) & mask:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _matched(self, hashes: Sequence[int], best: int, mask: int) -> dict[int, int]:
        """`held_prefix` of every replica in `mask` (absent: 0), from the masks at a few
        positions: each replica leaves the mask once along the hashes, found by bisection."""
        get = self._where.get
        matched: dict[int, int] = {}
        top = get(hashes[best - 1], 0) & mask
        for r in _members(top):
            matched[r] = best
        stack = [(0, mask, best, top)]
        while stack:
            lo, at_lo, hi, at_hi = stack.pop()
            if at_lo == at_hi:
                continue
            if hi - lo == 1:
                for r in _members(at_lo & ~at_hi):
                    matched[r] = lo
                continue
            mid = (lo + hi) // 2
            at_mid = get(hashes[mid - 1], 0) & mask
            stack.append((lo, at_lo, mid, at_mid))
            stack.append((mid, at_mid, hi, at_hi))
        return matched

    def record(
        self,
        hashes: Sequence[int],
        replica: int,
        prefix_key: str | None = None,
        *,
        pending: bool = False,
    ) -> Placement:
        """`replica` was sent this request: it will hold every prefix of it (and the
        requests with its `prefix_key` go there next). Returns the placement, for the
        routers of other engines to `observe`. `pending`: the blocks it adds push others
        out of the model only once `served` says the replica served it (a request queued
        behind many others has evicted nothing yet)."""
        if prefix_key is not None:
            self._place_key(prefix_key, replica)
        chain = hashes if isinstance(hashes, tuple) else tuple(hashes)
        held = self.held_prefix(chain, replica)
        computed = len(chain) - held
        self._add_work(replica, computed)
        # Named by the longest prefix some replica holds (by this model, and so by the
        # peers' too): a conversation's turn then carries only the blocks it added.
        chosen, self._chosen = self._chosen, None
        base = chosen[1] if chosen and chosen[0] is hashes else self._longest(chain, self._all)
        last = chain[held - 1] if held else 0
        self._touch(replica, last, held, chain[held:], base - held, computed if pending else 0)
        if base:
            return Placement(replica, chain[base:], computed, chain[base - 1], base, prefix_key)
        return Placement(replica, chain, computed, prefix_key=prefix_key)

    def observe(self, placement: Placement, *, pending: bool = False) -> bool:
        """Apply a peer's `placement` as `record` applied it there (nothing is returned to
        send on: each router publishes only its own); `pending` as there, until `served`.
        False when no replica is believed to hold its `base` here (lost or late, or
        evicted since): its key and work are still applied, its blocks are not, as they
        cannot be named (and it is not pending)."""
        waiting = placement.computed if pending else 0
        replica = placement.replica
        if not 0 <= replica < self.replicas:
            raise ValueError(f"a placement on replica {replica} of {self.replicas}")
        if placement.prefix_key is not None:
            self._place_key(placement.prefix_key, replica)
        self._add_work(replica, placement.computed)
        tail, base, blocks = placement.tail, placement.base, placement.base_blocks
        model = self._held[replica]
        if blocks and model.holds(base, blocks):
            # The replica holds the base here too (a conversation staying where it is):
            # only the tail need be looked at.
            extra = self.held_prefix(tail, replica)
            held = blocks + extra
            last = tail[extra - 1] if extra else base
            shared = self._longest(tail, self._all) - extra
            self._touch(replica, last, held, tail[extra:], shared, waiting)
            return True
        chain = tail
        if blocks:
            head = self._prefix(base, blocks, replica)
            if head is None:
                self.unresolved += 1
                return False
            chain = head + tail
        held = self.held_prefix(chain, replica)
        shared = self._longest(chain, self._all) - held
        self._touch(replica, chain[held - 1] if held else 0, held, chain[held:], shared, waiting)
        return True

    def _prefix(self, block: int, blocks: int, prefer: int) -> tuple[int, ...] | None:
        """The hashes of the `blocks`-block prefix ending in `block`, from the model of a
        replica believed to hold it (`prefer` if it does); None if none does."""
        holders = self._where.get(block, 0)
        if not holders:
            return None
        replica = prefer if holders >> prefer & 1 else (holders & -holders).bit_length() - 1
        return self._held[replica].prefix(block, blocks)

    def _place_key(self, prefix_key: str, replica: int) -> None:
        self._placed[prefix_key] = replica
        self._placed.move_to_end(prefix_key)
        if len(self._placed) > self.keys:
            self._placed.popitem(last=False)

    def _add_work(self, replica: int, computed: int) -> None:
        decay = self._decay
        self._work = [w * decay for w in self._work]
        self._work[replica] += computed

    def _touch(
        self,
        replica: int,
        last: int,
        held: int,
        new: Sequence[int],
        shared: int,
        pending: int = 0,
    ) -> None:
        """A request used `held` blocks held at `replica` (the last of them `last`) and
        then the blocks `new`: make them the most recently used there, the head most (as a
        server frees a request's blocks tail first, so the shared prefix outlives the
        request's own suffix), then evict what its cache could not keep. `shared`: how many
        leading blocks of `new` other replicas may hold (past those, none does). `pending`:
        blocks of the request that count against the cache only once it is `served`."""
        model = self._held[replica]
        bit = 1 << replica
        where = self._where
        self._uses += 1
        self._chosen = None
        model.touch(held, last, new, self._uses)
        if new:
            # Past the longest prefix any replica holds, no replica holds a block (the
            # union of prefix-closed sets is prefix-closed): those are set at C speed.
            shared = max(0, shared)
            for h in new[:shared]:
                where[h] = where.get(h, 0) | bit
            where.update(dict.fromkeys(new[shared:], bit))
        self._remembered += len(new)
        self._pending[replica] += pending
        self._pending_total += pending
        self._evict(replica)

    def served(self, placement: Placement) -> None:
        """The replica served a request recorded as `pending`: its blocks now count against
        the replica's cache."""
        replica = placement.replica
        left = max(0, self._pending[replica] - placement.computed)
        self._pending_total -= self._pending[replica] - left
        self._pending[replica] = left
        self._evict(replica)

    def _evict(self, replica: int) -> None:
        model = self._held[replica]
        bit = 1 << replica
        where = self._where
        room = self.blocks_per_replica
        if room is not None and len(model) - self._pending[replica] > room:
            gone = model.evict(len(model) - self._pending[replica] - room)
            self._remembered -= len(gone)
            masks = list(map(where.__getitem__, gone))
            if masks.count(bit) == len(masks):  # held here only, as a request's own blocks
                _consume(map(where.__delitem__, gone))
            else:
                for h, mask in zip(gone, masks, strict=True):
                    if mask == bit:
                        del where[h]
                    else:
                        where[h] = mask & ~bit
        # The bound on memory leaves out blocks of calls not yet served, as the caches do.
        while self._remembered - self._pending_total > self.capacity:
            largest = max(range(self.replicas), key=lambda r: len(self._held[r]))
            self._drop(self._held[largest].evict()[0], 1 << largest)
            self._remembered -= 1

    def _drop(self, h: int, bit: int) -> None:
        left = self._where.get(h, 0) & ~bit
        if left:
            self._where[h] = left
        else:
            self._where.pop(h, None)

    def forget_replica(self, replica: int) -> None:
        """A replica restarted or was ejected: it holds nothing any more."""
        self._chosen = None
        self._pending_total -= self._pending[replica]
        self._pending[replica] = 0
        held = self._held[replica]
        bit = 1 << replica
        for h in held.hashes():
            self._drop(h, bit)
        self._remembered -= len(held)
        self._held[replica] = CacheModel()
        for key in [k for k, r in self._placed.items() if r == replica]:
            del self._placed[key]


def _least(
    candidates: list[int],
    cost: Sequence[float] | dict[int, float],
    work: Sequence[float],
    key: int,
) -> int:
    """The candidate of least `cost`, then of least `work`; of several, the one rendezvous
    hashing ranks first for `key` (hashed only on a tie: it is the costly part)."""
    low = min([cost[r] for r in candidates])
    tied = [r for r in candidates if cost[r] == low]
    if len(tied) > 1:
        low = min([work[r] for r in tied])
        tied = [r for r in tied if work[r] == low]
    if len(tied) == 1:
        return tied[0]
    return max(tied, key=lambda r: _score(key, r, 0))
