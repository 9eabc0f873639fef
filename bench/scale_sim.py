"""A simulated cluster: many engines, many replicas, many agent programs, in virtual time.

Part 1, the cluster: 10,000 agent programs (`many_agent_programs`: the *agents* workload's
shapes and sizes, 10-40 turns, contexts up to 30-60k tokens) all arriving within seconds,
on 64 simulated `h100-llama3-8b` replicas, run six ways on identical fresh servers:

- one engine: one plait `Engine` with one `Router` over the 64 replicas (the baseline);
- 8 engines, shared routing: 8 `Engine`s in one process on one virtual clock, each with
  its own `Router` over the same 64 servers, the routers joined by a `LocalRouterHub`
  (each placement reaches the others 2 ms later); programs split by a hash of their id;
- 8 engines, unshared: the same without the hub (each router sees its own calls only);
- the same two with each program's turns sent through another engine's router in turn
  (`spread`: as after take-overs, or behind a front end that hands each turn to any
  engine), where a program's context must be found by a router that did not place it;
- take-over: shared routing, and engine 0 dies 60 s in; 12.5 s later the others finish
  its programs from the steps they had done.

The 8 engines share one admission budget (`LocalSlots`: 256 calls in flight per replica,
as one engine alone gets); it never binds at this size.

Part 2, the budget where it binds (always at the quick size): 8 calls in flight per
replica over all engines, shared or split statically, with and without a death.

Part 3, the router's decision cost: microseconds per call at 4, 16 and 64 replicas for
`choose` + `record` at one router and `observe` at a peer, on agent-like prompts of 2-4k
tokens (a shared system prompt, a document shared by a group, a conversation of its own),
each replica's model full (25,000 blocks of 16 tokens, an H100's KV cache).

    python bench/scale_sim.py --quick   # 320 programs, 16 replicas, 8 engines: ~6 minutes
    python bench/scale_sim.py           # full size (see docs/scaling-sim.md for the wall time)
    python bench/scale_sim.py --modes shared,takeover   # part 1: one engine and these only

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _cluster import ClusterRun, Kill, simulate_cluster  # noqa: E402

from executors import PrefixRouter  # noqa: E402
from workloads import Program, many_agent_programs  # noqa: E402

PROFILE = "h100-llama3-8b"
CACHE_BLOCKS = 25_000  # the profile's KV cache, in blocks of 16 tokens


@dataclass(frozen=True, slots=True)
class Size:
    programs: int
    replicas: int
    engines: int
    router_calls: int


FULL = Size(programs=10_000, replicas=64, engines=8, router_calls=5_000)
QUICK = Size(programs=320, replicas=16, engines=8, router_calls=2_000)
ARRIVALS_PER_S = 1_000.0  # all programs arrive within seconds: concurrent from the start


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- part 1: the cluster -----------------------------------------------------------------------


MODES: dict[str, dict[str, object]] = {
    # mode: how it differs from 8 engines sharing routing state and one admission budget
    "one_engine": {"engines": 1, "ceiling": True},
    "shared": {},
    "unshared": {"share_routes": False},
    "spread": {"spread_calls": True},  # each turn through another engine's router
    "spread_unshared": {"spread_calls": True, "share_routes": False},
    "takeover": {"kill": Kill()},  # engine 0 dies 60 s in; the others finish its programs
}


def run_modes(
    programs: list[Program],
    size: Size,
    seed: int,
    modes: Mapping[str, Mapping[str, object]],
    **common: object,
) -> dict[str, ClusterRun]:
    """`simulate_cluster` once per mode (its options over `common`), each logged."""
    runs = {}
    # Millions of long-lived objects (the routers' models): collect young garbage less
    # often, or the collector takes a quarter of the time. Figures are unaffected.
    thresholds = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        for mode, options in modes.items():
            run = simulate_cluster(
                programs,
                replicas=size.replicas,
                profile=PROFILE,
                seed=seed,
                mode=mode,
                **{"engines": size.engines, **common, **options},  # type: ignore[arg-type]
            )
            r = run.report
            log(
                f"  {mode:<15} hit {r.cache_hit_share:.4f}  busiest/mean {r.load_imbalance:.3f}"
                f"  mean JCT {r.mean_jct:7.1f} s  p95 {r.p95_jct:7.1f} s  makespan "
                f"{r.makespan:7.1f} s  busiest busy/mean {run.busy_imbalance:.3f}  peak in "
                f"flight {run.peak_in_flight:,} of {run.limit:,}"
                + (f"  taken over {run.taken_over}, re-sent {run.resent}" if run.taken_over else "")
                + f"  ({run.wall_s:.0f} s wall)"
            )
            runs[mode] = run
    finally:
        gc.set_threshold(*thresholds)
    return runs


def cluster(size: Size, seed: int, modes: list[str] | None = None) -> dict[str, ClusterRun]:
    programs = many_agent_programs(size.programs, rate=ARRIVALS_PER_S, seed=seed)
    calls = sum(p.llm_calls for p in programs)
    log(
        f"cluster: {size.programs:,} agent programs ({calls:,} LLM calls) on {size.replicas} "
        f"x {PROFILE}, 1 engine against {size.engines}:"
    )
    return run_modes(programs, size, seed, {m: MODES[m] for m in modes or MODES})


# --- part 2: one admission budget over the engines -----------------------------------------


BUDGET_PER_REPLICA = 8
"""Calls in flight per replica in part 2: about as many of these agents' contexts (30-60k
tokens) as fit an H100's KV cache, so the limit binds (part 1's 256 never does)."""

BUDGET_MODES: dict[str, dict[str, object]] = {
    "one_engine": {"engines": 1},
    "shared": {},
    "static": {"shared_budget": False},
    "takeover": {"kill": Kill()},
    "takeover_static": {"kill": Kill(), "shared_budget": False},
}


def budget(seed: int) -> dict[str, ClusterRun]:
    """Part 2, at the quick size whatever the size of part 1: the engines share one
    in-flight budget (`LocalSlots`) or split it statically, with and without a death."""
    size = QUICK
    programs = many_agent_programs(size.programs, rate=ARRIVALS_PER_S, seed=seed)
    log(
        f"budget: {size.programs} agent programs on {size.replicas} x {PROFILE}, "
        f"{BUDGET_PER_REPLICA} calls in flight per replica over all engines:"
    )
    return run_modes(programs, size, seed, BUDGET_MODES, per_replica=BUDGET_PER_REPLICA)


# --- part 3: the router's decision cost --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouterCost:
    replicas: int
    us_per_call: float
    """`choose` + `record` at the router that places the call."""
    observe_us: float
    """`observe` of that placement at a peer."""
    blocks_per_call: float
    message_bytes: float
    reasons: dict[str, int]


SYSTEM_TAG = 1 << 40  # (not -1: in CPython hash(-1) == hash(-2))


def _chain(parent: int, tag: int, n: int) -> list[int]:
    out = []
    for i in range(n):
        parent = hash((parent, tag, i))
        out.append(parent)
    return out


def router_cost(replicas: int, calls: int, seed: int = 0, batches: int = 8) -> RouterCost:
    """Time one router's choose + record and a peer's observe, per call, on a full model.

    Each replica's model is first filled with other conversations' blocks (its whole
    cache), then 16 conversations per replica take turns at random: a 1,000-token system
    prompt (one of three), a 1-2k-token document shared by about eight conversations, a
    200-token task, then turns of 100-500 tokens until the prompt passes 4,000 tokens,
    when a new conversation takes its place. Loads (calls in flight) wander between 2 and
    6 per replica, so that, as in the cluster runs, a conversation mostly stays where its
    context is (`reasons` counts the decisions of each kind). The figure is CPU time, the
    least of `batches` batches' means (the machine is shared; the least is the least
    disturbed)."""
    from executors import Placed

    rng = random.Random(seed)
    block = 16
    maker = PrefixRouter(
        replicas, blocks_per_replica=CACHE_BLOCKS, capacity=replicas * CACHE_BLOCKS
    )
    peer = PrefixRouter(replicas, blocks_per_replica=CACHE_BLOCKS, capacity=replicas * CACHE_BLOCKS)
    for r in range(replicas):  # fill: the caches hold other conversations
        for k in range(CACHE_BLOCKS // 250):
            filler = _chain(rng.getrandbits(60), k, 250)
            peer.observe(maker.record(filler, r))
    systems = [_chain(s, SYSTEM_TAG, 1000 // block) for s in range(3)]
    documents = [
        systems[d % 3] + _chain(systems[d % 3][-1], d, rng.randint(1000, 2000) // block)
        for d in range(2 * replicas)
    ]
    active = [documents[rng.randrange(len(documents))] for _ in range(16 * replicas)]
    loads = [float(rng.randint(2, 6)) for _ in range(replicas)]
    healthy = [True] * replicas
    started = 0

    def turn(i: int) -> tuple[tuple[int, ...], str]:
        nonlocal started
        chain = active[i]
        if len(chain) * block > 4000:
            started += 1
            chain = documents[rng.randrange(len(documents))]
        chain = chain + _chain(chain[-1], rng.getrandbits(30), rng.randint(100, 500) // block)
        active[i] = chain
        return tuple(chain), f"conversation-{i}-{started}"

    def step(loads: list[float]) -> None:
        r = rng.randrange(replicas)
        loads[r] = min(6.0, max(2.0, loads[r] + rng.choice((-1.0, 1.0))))

    for _ in range(4 * len(active)):  # warm up: every conversation under way
        i = rng.randrange(len(active))
        hashes, key = turn(i)
        choice = maker.choose(hashes, loads, healthy, key)
        peer.observe(maker.record(hashes, choice.replica, key))
        step(loads)
    work = [turn(rng.randrange(len(active))) for _ in range(calls * batches)]
    placing, applying = [], []
    sizes = []
    blocks = 0
    reasons: Counter[str] = Counter()
    for b in range(batches):
        placements = []
        # CPU time, not wall time: on a shared machine a batch may lose the CPU meanwhile.
        t0 = time.process_time()
        chosen = []
        for hashes, key in work[b * calls : (b + 1) * calls]:
            choice = maker.choose(hashes, loads, healthy, key)
            placements.append(maker.record(hashes, choice.replica, key))
            chosen.append(choice)
            step(loads)
        t1 = time.process_time()
        reasons.update(c.reason for c in chosen)
        for placement in placements:
            peer.observe(placement)
        t2 = time.process_time()
        placing.append((t1 - t0) / calls)
        applying.append((t2 - t1) / calls)
        blocks += sum(len(h) for h, _ in work[b * calls : (b + 1) * calls])
        sizes += [
            len(Placed(b"01234567", 0, f"replica{p.replica}", p).to_bytes())
            for p in placements[:500]
        ]
    assert peer.unresolved == 0, "the peer could not place what the router sent"
    return RouterCost(
        replicas,
        min(placing) * 1e6,
        min(applying) * 1e6,
        blocks / (calls * batches),
        statistics.fmean(sizes),
        dict(reasons),
    )


# --- the figures -------------------------------------------------------------------------------


def run(quick: bool, seed: int = 0, modes: list[str] | None = None) -> dict[str, object]:
    """Both parts at the quick or full size (the cluster's `modes`: all if None, and
    always one engine, the baseline); the figures as one flat dict."""
    size = QUICK if quick else FULL
    started = time.perf_counter()
    costs = {}
    for replicas in (4, 16, 64):
        cost = router_cost(replicas, size.router_calls, seed)
        log(
            f"router at {replicas} replicas: {cost.us_per_call:.1f} us per call "
            f"(choose + record), {cost.observe_us:.1f} us to apply at a peer; "
            f"{cost.blocks_per_call:.0f} blocks a prompt, {cost.message_bytes:.0f} bytes a message"
        )
        costs[replicas] = cost
    runs = cluster(size, seed, None if modes is None else ["one_engine", *modes])
    one = runs["one_engine"]
    figures: dict[str, object] = {}
    for mode, run in runs.items():
        suffix = "" if mode == "shared" else f"_{mode}"
        r = run.report
        figures[f"sim64_hit_share{suffix}"] = round(r.cache_hit_share, 4)
        figures[f"sim64_load_imbalance{suffix}"] = round(r.load_imbalance, 3)
        figures[f"sim64_busy_imbalance{suffix}"] = round(run.busy_imbalance, 3)
        figures[f"sim64_peak_in_flight{suffix}"] = run.peak_in_flight
        if run.taken_over:
            figures[f"sim64_taken_over{suffix}"] = run.taken_over
            figures[f"sim64_resent{suffix}"] = run.resent
        figures[f"sim64_mean_jct{suffix}_s"] = round(r.mean_jct, 2)
        figures[f"sim64_p95_jct{suffix}_s"] = round(r.p95_jct, 2)
        figures[f"sim64_makespan{suffix}_s"] = round(r.makespan, 1)
        figures[f"sim64_preemptions{suffix}"] = r.server.preemptions
        if run.link_messages:
            figures[f"sim64_link_bytes_per_message{suffix}"] = round(
                run.link_bytes / run.link_messages
            )
            figures[f"sim64_unresolved_share{suffix}"] = round(run.unresolved_share, 5)
    for mode, run in budget(seed).items():
        figures[f"budget_mean_jct_{mode}_s"] = round(run.report.mean_jct, 2)
        figures[f"budget_p95_jct_{mode}_s"] = round(run.report.p95_jct, 2)
        figures[f"budget_hit_share_{mode}"] = round(run.report.cache_hit_share, 4)
        figures[f"budget_peak_in_flight_{mode}"] = run.peak_in_flight
    figures["budget_limit"] = BUDGET_PER_REPLICA * QUICK.replicas
    figures.update(
        {
            "sim64_hit_share_ceiling": round(one.report.ideal_hit_share, 4),
            "sim64_programs": size.programs,
            "sim64_llm_calls": sum(one.server_requests),
            "sim64_replicas": size.replicas,
            "sim64_engines": size.engines,
            "sim64_wall_s": {mode: round(r.wall_s, 1) for mode, r in runs.items()},
            "router_blocks_per_prompt": round(costs[64].blocks_per_call, 1),
            "router_message_bytes": round(costs[64].message_bytes),
            "router_reasons_64": costs[64].reasons,
        }
    )
    for replicas, cost in costs.items():
        figures[f"router_us_per_call_{replicas}"] = round(cost.us_per_call, 1)
        figures[f"router_observe_us_{replicas}"] = round(cost.observe_us, 1)
    figures.update(
        {"quick": quick, "seed": seed, "profile": PROFILE,
         "wall_s": round(time.perf_counter() - started, 1)}
    )  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="320 programs on 16 replicas")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--modes",
        help=f"the cluster runs besides one engine, comma-separated (default: all of "
        f"{', '.join(m for m in MODES if m != 'one_engine')})",
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    modes = None
    if args.modes:
        modes = [m for m in args.modes.split(",") if m != "one_engine"]
        if unknown := [m for m in modes if m not in MODES]:
            parser.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    f = run(args.quick, args.seed, modes)
    n, e = f["sim64_replicas"], f["sim64_engines"]
    print(f"\n{f['sim64_programs']:,} agent programs on {n} x {PROFILE} (simulated)")
    print(
        f"{'':<36} {'hit share':>9} {'busiest/mean':>12} {'busy':>7} {'mean JCT s':>10} "
        f"{'p95 JCT s':>9}"
    )
    rows = (
        ("1 engine", "_one_engine"),
        (f"{e} engines, shared routing", ""),
        (f"{e} engines, unshared", "_unshared"),
        (f"{e} engines, turns spread, shared", "_spread"),
        (f"{e} engines, turns spread, unshared", "_spread_unshared"),
        (f"{e} engines, one dies at 60 s", "_takeover"),
    )
    for label, suffix in rows:
        if f"sim64_hit_share{suffix}" not in f:
            continue  # not run (--modes)
        print(
            f"{label:<36} {f[f'sim64_hit_share{suffix}']:>9.4f} "
            f"{f[f'sim64_load_imbalance{suffix}']:>12.3f} "
            f"{f[f'sim64_busy_imbalance{suffix}']:>7.3f} "
            f"{f[f'sim64_mean_jct{suffix}_s']:>10.1f} {f[f'sim64_p95_jct{suffix}_s']:>9.1f}"
        )
    print(f"{'unlimited cache (ceiling)':<36} {f['sim64_hit_share_ceiling']:>9.4f}")
    print(
        f"\none in-flight budget of {f['budget_limit']} over {QUICK.engines} engines "
        f"({QUICK.programs} programs, {QUICK.replicas} replicas):"
    )
    for mode in BUDGET_MODES:
        print(
            f"  {mode:<16} mean JCT {f[f'budget_mean_jct_{mode}_s']:>6.1f} s  p95 "
            f"{f[f'budget_p95_jct_{mode}_s']:>6.1f} s  peak in flight "
            f"{f[f'budget_peak_in_flight_{mode}']}"
        )
    print("\nrouter decision per call (choose + record; observe at a peer):")
    for replicas in (4, 16, 64):
        print(
            f"  {replicas:>2} replicas: {f[f'router_us_per_call_{replicas}']:>6.1f} us, "
            f"observe {f[f'router_observe_us_{replicas}']:>6.1f} us"
        )
    print(json.dumps(f, separators=(",", ":")))
    _results.save("scale_sim", f, parser, args, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
