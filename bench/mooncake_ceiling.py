"""How much of a Mooncake trace any router could serve from cache, with caches of a size.

Routing only decides where a request's blocks go; what stays cached is the servers' LRU
eviction. One pooled LRU cache of N x B blocks (no prefix ever stored twice) is about what
a router over N replicas of B blocks can reach with LRU servers, and Belady's eviction
(the block used furthest in the future goes first) on those N x B blocks is what a better
eviction policy could add. Hits count full blocks of a request's longest cached prefix,
never its last token, as in the simulator (`bench/_harness.py` `ideal_hit_share`).

    python bench/mooncake_ceiling.py            # both traces, 4 x 940 blocks: a few seconds

Prints one JSON line: per trace, the pooled-LRU and Belady hit shares, the share of
requests finding no block cached in the pooled LRU, and the median seconds between two
uses of a block.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
from collections import OrderedDict
from collections.abc import Container
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
if str(_BENCH) not in sys.path:
    sys.path.insert(1, str(_BENCH))

import _results  # noqa: E402

from workloads import TraceStep, mooncake_programs  # noqa: E402
from workloads.mooncake import TRACE_BLOCK_TOKENS  # noqa: E402

Request = tuple[float, int, tuple[int, ...]]  # arrival s, prompt tokens, block ids


def requests(trace: str) -> list[Request]:
    out = []
    for program in mooncake_programs(trace):
        step = program.steps[0]
        assert isinstance(step, TraceStep)
        out.append((program.arrival, step.prompt_tokens, step.block_ids))
    return out


def hit_blocks(blocks: tuple[int, ...], tokens: int, cached: Container[int]) -> int:
    usable = blocks[: (tokens - 1) // TRACE_BLOCK_TOKENS]
    n = 0
    while n < len(usable) and usable[n] in cached:
        n += 1
    return n


def pooled_lru(reqs: list[Request], capacity: int) -> tuple[float, float]:
    cache: OrderedDict[int, None] = OrderedDict()
    queried = hits = cold = 0
    for _, tokens, blocks in reqs:
        n = hit_blocks(blocks, tokens, cache)
        queried += tokens
        hits += n * TRACE_BLOCK_TOKENS
        cold += n == 0
        for block in reversed(blocks):  # the head most recent: evicted tail first, as vLLM
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits / queried, cold / len(reqs)


def belady(reqs: list[Request], capacity: int) -> float:
    never = len(reqs)
    following: dict[int, int] = {}
    next_use: list[list[int]] = []
    for i in range(len(reqs) - 1, -1, -1):
        blocks = reqs[i][2]
        next_use.append([following.get(b, never) for b in blocks])
        for b in blocks:
            following[b] = i
    next_use.reverse()
    cache: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    queried = hits = 0
    for i, (_, tokens, blocks) in enumerate(reqs):
        hits += hit_blocks(blocks, tokens, cache) * TRACE_BLOCK_TOKENS
        queried += tokens
        for block, use in zip(blocks, next_use[i], strict=True):
            cache[block] = use
            heapq.heappush(heap, (-use, block))
        while len(cache) > capacity:
            use, block = heapq.heappop(heap)
            if cache.get(block) == -use:  # not a stale heap entry
                del cache[block]
    return hits / queried


def median_reuse_gap(reqs: list[Request]) -> float:
    last: dict[int, float] = {}
    gaps = []
    for at, _, blocks in reqs:
        for b in blocks:
            if b in last:
                gaps.append(at - last[b])
            last[b] = at
    return statistics.median(gaps) if gaps else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    capacity = 4 * 940
    out: dict[str, object] = {"blocks": capacity, "block_tokens": TRACE_BLOCK_TOKENS}
    for trace in ("synthetic", "conversation"):
        reqs = requests(trace)
        lru, cold = pooled_lru(reqs, capacity)
        out[trace] = {
            "pooled_lru_hit": round(lru, 4),
            "belady_hit": round(belady(reqs, capacity), 4),
            "pooled_lru_cold_request_share": round(cold, 4),
            "median_block_reuse_gap_s": round(median_reuse_gap(reqs), 1),
        }
    print(json.dumps(out))
    _results.save("mooncake_ceiling", out, parser, args, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
