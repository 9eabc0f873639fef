"""A seeded sequence of routing calls, like an agent cluster's, and its replay on a router.

Its decisions under the router of a given commit are kept in tests/golden/routing_decisions.json,
so that a faster policy can be shown to decide exactly as the one before it did.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from executors._routing import PrefixRouter

# replicas, steps, blocks_per_replica, capacity, seed
CASES = (
    (4, 1500, 400, 1_000_000, 1),
    (16, 1500, 300, 1_000_000, 2),
    (64, 1500, 200, 1_000_000, 3),
    (8, 1500, None, 1_500, 4),  # the memory bound over all replicas, not the cache size
)


@dataclass(frozen=True, slots=True)
class Call:
    hashes: tuple[int, ...]
    loads: tuple[float, ...]
    healthy: tuple[bool, ...]
    key: str | None
    forget: int | None = None
    """Before the call: this replica restarted (its prefixes are forgotten)."""


def calls(replicas: int, steps: int, seed: int) -> Iterator[Call]:
    """Programs sharing one of three system prompts, each growing its own conversation;
    some carry a prefix key; loads wander; now and then a replica is down or restarts."""
    rng = random.Random(seed)
    systems = [_chain(rng.randrange(1 << 30), rng.randint(4, 12)) for _ in range(3)]
    programs: dict[int, tuple[int, ...]] = {}
    loads = [0.0] * replicas
    down: int | None = None
    for step in range(steps):
        if rng.random() < 0.3 or not programs:
            pid = step
            hashes = systems[rng.randrange(3)] + _chain(rng.randrange(1 << 30), 3)
        else:
            pid = rng.choice(list(programs))
            hashes = programs[pid] + _chain(programs[pid][-1], rng.randint(1, 8))
        programs[pid] = hashes
        if len(hashes) > 80 or rng.random() < 0.05:
            del programs[pid]  # its last call
        loads = [min(12.0, max(0.0, x + rng.choice((-1.0, 0.0, 1.0)))) for x in loads]
        if rng.random() < 0.02:
            loads[rng.randrange(replicas)] += 15.0
        if rng.random() < 0.01:
            down = None if down is not None else rng.randrange(replicas)
        healthy = tuple(r != down for r in range(replicas))
        forget = down if down is not None and rng.random() < 0.1 else None
        key = f"k{pid}" if pid % 4 == 0 else None
        yield Call(hashes, tuple(loads), healthy, key, forget)


def _chain(parent: int, n: int) -> tuple[int, ...]:
    out = []
    for i in range(n):
        parent = hash((parent, i, 0x5EED))
        out.append(parent)
    return tuple(out)


def replay(router: PrefixRouter, seq: Iterator[Call]) -> list[str]:
    """Each call's decision as "replica/matched/reason", then the replicas' work."""
    out = []
    for call in seq:
        if call.forget is not None:
            router.forget_replica(call.forget)
        choice = router.choose(call.hashes, call.loads, call.healthy, call.key)
        router.record(call.hashes, choice.replica, call.key)
        out.append(f"{choice.replica}/{choice.matched_blocks}/{choice.reason[0]}")
    out.append(" ".join(repr(w) for w in router.work()))
    return out


def decisions() -> dict[str, list[str]]:
    out = {}
    for replicas, steps, blocks, capacity, seed in CASES:
        router = PrefixRouter(replicas, blocks_per_replica=blocks, capacity=capacity)
        out[f"{replicas}x{blocks}c{capacity}s{seed}"] = replay(router, calls(replicas, steps, seed))
    return out
