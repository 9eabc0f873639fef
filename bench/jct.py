"""Job completion time: plait against the naive baseline on identical simulated hardware.

For each workload the same seeded programs and arrivals run twice (or more) on fresh
simulated servers in virtual time: once as a user of another framework would send them
(every call as soon as it is ready, no hints, FCFS server queue, round-robin over
replicas) and once through plait (program-first, keep-alive hints, prefix routing over
replicas; each feature is also measured on its own). A sweep of arrival rates finds the
capacity of the simulated hardware for the workload: the highest steady throughput any
mode sustained (for agents over 4 replicas also with every program queued at once).
"Load 0.8" is 80% of that capacity. The sweep itself is reported too: where the naive
baseline collapses (its KV cache thrashes once more programs are active than it holds) is
the main finding.

    python bench/jct.py --quick          # about 2.5 minutes
    python bench/jct.py --plots docs/img # full sizes, about 12 minutes; draws the plots

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _harness import Report, plait_runner, routed_runner, run_naive, simulate  # noqa: E402

from executors import get_profile  # noqa: E402
from workloads import (  # noqa: E402
    Program,
    agent_programs,
    batch_programs,
    mooncake_programs,
    sql_programs,
)

PROFILE = "h100-llama3-8b"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sweep(
    name: str,
    make: object,
    rates: Sequence[float],
    n: int,
    seed: int,
    plait_policy: str,
) -> list[tuple[float, Report, Report]]:
    rows = []
    for rate in rates:
        programs: list[Program] = make(n, rate=rate, seed=seed)  # type: ignore[operator]
        started = time.perf_counter()
        naive = simulate(programs, run_naive, profile=PROFILE, seed=seed, mode="naive")
        plait = simulate(
            programs, plait_runner(plait_policy), profile=PROFILE, seed=seed, mode=plait_policy
        )
        log(
            f"  {name} rate {rate:.3f}/s: naive mean {naive.mean_jct:7.1f} s "
            f"p95 {naive.p95_jct:7.1f} s thr {naive.throughput:.3f}/s att "
            f"{naive.deadline_attainment:.2f} | plait mean {plait.mean_jct:7.1f} s "
            f"p95 {plait.p95_jct:7.1f} s att {plait.deadline_attainment:.2f} "
            f"({time.perf_counter() - started:.1f} s)"
        )
        rows.append((rate, naive, plait))
    return rows


def at_load(
    make: object, rate: float, n: int, seed: int, plait_policy: str
) -> tuple[Report, Report]:
    programs: list[Program] = make(n, rate=rate, seed=seed)  # type: ignore[operator]
    naive = simulate(programs, run_naive, profile=PROFILE, seed=seed, mode="naive")
    plait = simulate(
        programs, plait_runner(plait_policy), profile=PROFILE, seed=seed, mode=plait_policy
    )
    return naive, plait


FULL_REPLICAS = 4

# Each plait feature alone and together, on top of program-first scheduling (an ablation).
ABLATIONS = {
    "program-first": {"route": False, "group": False, "keep_alive": False},
    "+routing": {"route": True, "group": False, "keep_alive": False},
    "full": {"route": True, "group": False, "keep_alive": True},
    "full+grouping": {"route": True, "group": True, "keep_alive": True},
}


def agents_full(
    rates: Sequence[float], n: int, seed: int
) -> tuple[float, float, dict[str, Report], list[tuple[float, Report, Report]]]:
    """Agents over 4 replicas: naive (round-robin, no hints) against all of plait.

    Returns the capacity (the highest steady throughput any mode sustained, in the sweep or
    with every program queued at once), the rate at load 0.8 of it, the reports at that
    rate (naive and every ablation), and the sweep."""
    rows = []
    for rate in rates:
        programs = agent_programs(n, rate=rate, seed=seed)
        started = time.perf_counter()
        naive = simulate(
            programs, run_naive, profile=PROFILE, replicas=FULL_REPLICAS, seed=seed, mode="naive"
        )
        plait = simulate(
            programs,
            plait_runner("fcfs"),
            profile=PROFILE,
            replicas=FULL_REPLICAS,
            seed=seed,
            mode="full",
        )
        log(
            f"  agents x{FULL_REPLICAS} rate {rate:.3f}/s: naive mean {naive.mean_jct:7.1f} s "
            f"p95 {naive.p95_jct:7.1f} s thr {naive.throughput:.3f}/s hit "
            f"{naive.cache_hit_share:.2f} | plait mean {plait.mean_jct:7.1f} s p95 "
            f"{plait.p95_jct:7.1f} s thr {plait.throughput:.3f}/s hit "
            f"{plait.cache_hit_share:.2f} ({time.perf_counter() - started:.1f} s)"
        )
        rows.append((rate, naive, plait))
    # With every program queued at once each mode runs at its saturation throughput; in a
    # short sweep a mode that never saturates shows only the arrival rate it was given.
    burst = agent_programs(n, rate=1000.0, seed=seed)
    saturated = [
        simulate(burst, runner, profile=PROFILE, replicas=FULL_REPLICAS, seed=seed, mode=mode)
        for mode, runner in (("naive", run_naive), ("full", plait_runner("fcfs")))
    ]
    capacity = max(
        max(max(n.throughput, p.throughput) for _, n, p in rows),
        max(r.throughput for r in saturated),
    )
    log(
        f"  saturation throughput: naive {saturated[0].throughput:.3f}/s, plait "
        f"{saturated[1].throughput:.3f}/s; capacity {capacity:.3f}/s"
    )
    rate = round(0.8 * capacity, 4)
    programs = agent_programs(n, rate=rate, seed=seed)
    reports = {
        "naive": simulate(
            programs, run_naive, profile=PROFILE, replicas=FULL_REPLICAS, seed=seed, mode="naive"
        )
    }
    for name, switches in ABLATIONS.items():
        reports[name] = simulate(
            programs,
            plait_runner("fcfs", **switches),
            profile=PROFILE,
            replicas=FULL_REPLICAS,
            seed=seed,
            mode=name,
        )
    for name, report in reports.items():
        log(
            f"  load 0.8 = {rate:.3f}/s, {name:<20} mean {report.mean_jct:7.1f} s p95 "
            f"{report.p95_jct:7.1f} s hit {report.cache_hit_share:.3f} "
            f"imbalance {report.load_imbalance:.2f}"
        )
    return capacity, rate, reports, rows


def hour_replay(rate: float, seed: int) -> tuple[float, float]:
    """Wall seconds to simulate an hour of agent arrivals, and the simulated span."""
    n = max(1, int(rate * 3600))
    programs = agent_programs(n, rate=rate, seed=seed)
    started = time.perf_counter()
    report = simulate(programs, run_naive, profile=PROFILE, seed=seed, mode="naive")
    return time.perf_counter() - started, report.makespan


def overload_rate(rows: Sequence[tuple[float, Report, Report]]) -> float:
    """The sweep's rate where plait gains most over naive (the cache is under pressure)."""
    return max(rows, key=lambda row: row[1].mean_jct / row[2].mean_jct)[0]


def plot(path: Path, agents: list[tuple[float, Report, Report]], head: tuple[Report, Report],
         sql: list[tuple[float, Report, Report]]) -> list[str]:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for report, style, color in ((head[0], "--", "tab:gray"), (head[1], "-", "tab:blue")):
        xs = sorted(report.jcts)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, c=color, label=report.mode)
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("share of programs")
    ax.set_title("Multi-turn agents at load 0.8, h100-llama3-8b (simulated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path / "jct_agents_cdf.png", dpi=110)
    written.append(str(path / "jct_agents_cdf.png"))
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    rates = [r for r, _, _ in agents]
    naive_c, plait_c = "tab:gray", "tab:blue"
    axes[0].plot(rates, [n.mean_jct for _, n, _ in agents], "o--", c=naive_c, label="naive mean")
    axes[0].plot(rates, [p.mean_jct for _, _, p in agents], "o-", c=plait_c, label="plait mean")
    axes[0].plot(rates, [n.p95_jct for _, n, _ in agents], "s:", c=naive_c, label="naive p95")
    axes[0].plot(rates, [p.p95_jct for _, _, p in agents], "s-.", c=plait_c, label="plait p95")
    axes[0].set_xlabel("agent programs arriving per second")
    axes[0].set_ylabel("JCT (s)")
    axes[0].set_yscale("log")
    axes[0].set_title("Agents: load sweep")
    axes[0].legend()
    rates = [r for r, _, _ in sql]
    axes[1].plot(rates, [n.deadline_attainment for _, n, _ in sql], "o--", c=naive_c, label="naive")
    axes[1].plot(
        rates, [p.deadline_attainment for _, _, p in sql], "o-", c=plait_c, label="plait slack"
    )
    axes[1].set_xlabel("SQL queries arriving per second")
    axes[1].set_ylabel("deadline attainment")
    axes[1].set_title("Text-to-SQL: load sweep")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path / "jct_load_sweep.png", dpi=110)
    written.append(str(path / "jct_load_sweep.png"))
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer programs and rates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plots", type=Path, help="directory for PNG plots")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plots needs matplotlib: `make .venv/bin/.installed-bench` or "
                         "`pip install -e '.[bench]'`")  # fmt: skip
    started = time.perf_counter()
    n_agents, n_sql = (60, 120) if args.quick else (150, 300)
    agent_rates = (
        (0.03, 0.06, 0.09, 0.12, 0.15)
        if args.quick
        else (0.03, 0.05, 0.07, 0.08, 0.09, 0.1, 0.11, 0.12, 0.15)
    )
    sql_rates = (0.5, 1.0, 1.5, 2.0) if args.quick else (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5)

    log("agents (multi-turn, tool pauses), plait policy fcfs:")
    agents = sweep("agents", agent_programs, agent_rates, n_agents, args.seed, "fcfs")
    naive_peak = max(n.throughput for _, n, _ in agents)
    peak = max(naive_peak, max(p.throughput for _, _, p in agents))
    head_rate = 0.8 * peak
    log(
        f"  capacity {peak:.3f} programs/s (naive peak {naive_peak:.3f}); "
        f"load 0.8 = {head_rate:.3f}/s"
    )
    head = at_load(agent_programs, head_rate, n_agents, args.seed, "fcfs")

    log(f"agents over {FULL_REPLICAS} replicas: naive round-robin vs plait (all features):")
    full_rates = (
        (0.1, 0.2, 0.3, 0.4)
        if args.quick
        else (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6)
    )
    full_capacity, full_rate, full, full_sweep = agents_full(full_rates, n_agents, args.seed)
    # Keep-alive on one replica where the cache is under pressure: off, heard by the server
    # (it pins paused programs' blocks), or not heard (upstream vLLM) with plait holding new
    # programs back instead (Limits.kv_tokens).
    ka_rate = overload_rate(agents)
    ka_programs = agent_programs(n_agents, rate=ka_rate, seed=args.seed)
    keep_alive_on = next(p for r, _, p in agents if r == ka_rate)
    keep_alive_off = simulate(
        ka_programs, plait_runner("fcfs", keep_alive=False), profile=PROFILE, mode="no-ka"
    )
    hold_back = simulate(
        ka_programs, plait_runner("fcfs", hold_back=True), profile=PROFILE, mode="hold-back"
    )
    log(
        f"  keep-alive on one replica at {ka_rate}/s: off mean {keep_alive_off.mean_jct:.1f} s "
        f"hit {keep_alive_off.cache_hit_share:.3f} | server keep-alive mean "
        f"{keep_alive_on.mean_jct:.1f} s hit {keep_alive_on.cache_hit_share:.3f} | client "
        f"hold-back mean {hold_back.mean_jct:.1f} s hit {hold_back.cache_hit_share:.3f}"
    )

    log("text-to-SQL (4 stages, deadlines), plait policy slack:")
    sql = sweep("sql", sql_programs, sql_rates, n_sql, args.seed, "slack")
    stressed = [(r, n, p) for r, n, p in sql if n.deadline_attainment < 0.7]
    sql_rate, sql_naive, sql_plait = stressed[0] if stressed else sql[-1]

    docs, questions = (200, 8) if args.quick else (500, 10)
    log(f"batch analytics ({docs} documents x {questions} questions, one job), plait fcfs:")
    batch = batch_programs(docs, questions, seed=args.seed)
    batch_naive = simulate(batch, run_naive, profile=PROFILE, seed=args.seed, mode="naive")
    batch_plait = simulate(
        batch, plait_runner("fcfs"), profile=PROFILE, seed=args.seed, mode="fcfs"
    )
    batch_grouped = simulate(
        batch, plait_runner("fcfs", group=True), profile=PROFILE, seed=args.seed, mode="grouped"
    )
    log(
        f"  naive makespan {batch_naive.makespan:.1f} s, cache {batch_naive.cache_hit_share:.2f}"
        f" | plait makespan {batch_plait.makespan:.1f} s, cache "
        f"{batch_plait.cache_hit_share:.2f} (ideal {batch_plait.ideal_hit_share:.2f}) | "
        f"with prefix grouping {batch_grouped.makespan:.1f} s, cache "
        f"{batch_grouped.cache_hit_share:.2f}"
    )

    log("Mooncake traces over 4 replicas of 940 blocks of 512 tokens, round-robin / routed:")
    replay = get_profile(PROFILE).replace(
        name=f"{PROFILE}-512", block_size=512, num_blocks=940, max_model_len=262_144
    )
    mooncake: dict[str, Report] = {}
    routed: dict[str, Report] = {}
    for trace in ("synthetic", "conversation"):
        programs = mooncake_programs(trace)  # whole traces: a few seconds each
        mooncake[trace] = simulate(programs, run_naive, profile=replay, replicas=4, mode="rr")
        routed[trace] = simulate(
            programs, routed_runner(), profile=replay, replicas=4, mode="routed"
        )
        log(
            f"  {trace}: {len(programs)} requests, hit share {mooncake[trace].cache_hit_share:.3f}"
            f" round-robin, {routed[trace].cache_hit_share:.3f} routed (load imbalance "
            f"{routed[trace].load_imbalance:.2f}); unlimited cache "
            f"{mooncake[trace].ideal_hit_share:.3f}"
        )

    log("one hour of agent arrivals at load 0.8 (naive driver, the simulator's own speed):")
    hour_s, span = hour_replay(head_rate, args.seed)
    log(f"  {span:.0f} s simulated in {hour_s:.1f} s")

    naive, plait = head
    print(f"{'workload':<10} {'mode':<7} {'rate/s':>7} {'mean JCT':>9} {'p95 JCT':>9} "
          f"{'thr/s':>7} {'deadl.':>6} {'cache hit':>9}")  # fmt: skip
    for label, rate, report in (
        ("agents", head_rate, naive),
        ("agents", head_rate, plait),
        ("sql", sql_rate, sql_naive),
        ("sql", sql_rate, sql_plait),
        ("batch", 0.0, batch_naive),
        ("batch", 0.0, batch_plait),
    ):
        print(
            f"{label:<10} {report.mode:<7} {rate:>7.3f} {report.mean_jct:>9.1f} "
            f"{report.p95_jct:>9.1f} {report.throughput:>7.3f} "
            f"{report.deadline_attainment:>6.2f} {report.cache_hit_share:>9.3f}"
        )
    overload = next(row for row in agents if row[0] == overload_rate(agents))
    full_naive, full_plait = full["naive"], full["full"]
    figures = {
        # Agents over 4 replicas at load 0.8 (of the best mode's capacity): naive round-robin
        # without hints against program-first + prefix routing + grouping + keep-alive.
        "agents_full_mean_jct_ratio": round(full_naive.mean_jct / full_plait.mean_jct, 3),
        "agents_full_p95_jct_ratio": round(full_naive.p95_jct / full_plait.p95_jct, 3),
        "agents_full_rate_per_s": full_rate,
        "agents_full_capacity_per_s": round(full_capacity, 4),
        "agents_full_naive_peak_throughput_per_s": round(
            max(n.throughput for _, n, _ in full_sweep), 4
        ),
        "agents_full_ablation": {
            name: {
                "mean_jct_s": round(r.mean_jct, 2),
                "p95_jct_s": round(r.p95_jct, 2),
                "cache_hit_share": round(r.cache_hit_share, 4),
                "load_imbalance": round(r.load_imbalance, 3),
            }
            for name, r in full.items()
        },
        "agents_keep_alive_rate_per_s": ka_rate,
        "agents_keep_alive_mean_jct_s": {
            "off": round(keep_alive_off.mean_jct, 2),
            "on": round(keep_alive_on.mean_jct, 2),
            "hold_back": round(hold_back.mean_jct, 2),
        },
        "agents_keep_alive_cache_hit": {
            "off": round(keep_alive_off.cache_hit_share, 4),
            "on": round(keep_alive_on.cache_hit_share, 4),
            "hold_back": round(hold_back.cache_hit_share, 4),
        },
        "batch_makespan_naive_s": round(batch_naive.makespan, 2),
        "batch_makespan_plait_s": round(batch_plait.makespan, 2),
        "batch_makespan_grouped_s": round(batch_grouped.makespan, 2),
        "batch_cache_hit_grouped": round(batch_grouped.cache_hit_share, 4),
        "agents_load_rate_per_s": round(head_rate, 4),
        "agents_capacity_per_s": round(peak, 4),
        "agents_naive_peak_throughput_per_s": round(naive_peak, 4),
        "agents_mean_jct_ratio": round(naive.mean_jct / plait.mean_jct, 3),
        "agents_p95_jct_ratio": round(naive.p95_jct / plait.p95_jct, 3),
        "agents_best_sweep_mean_jct_ratio": round(overload[1].mean_jct / overload[2].mean_jct, 3),
        "agents_best_sweep_p95_jct_ratio": round(overload[1].p95_jct / overload[2].p95_jct, 3),
        "agents_best_sweep_rate_per_s": overload[0],
        "sql_rate_per_s": sql_rate,
        "sql_deadline_attainment_plait": round(sql_plait.deadline_attainment, 4),
        "sql_deadline_attainment_naive": round(sql_naive.deadline_attainment, 4),
        # Wall seconds per simulated hour (the run may simulate longer than an hour: the
        # naive baseline drains its backlog long after the last arrival).
        "batch_throughput_ratio": round(batch_naive.makespan / batch_plait.makespan, 3),
        "batch_cache_hit_naive": round(batch_naive.cache_hit_share, 4),
        "batch_cache_hit_plait": round(batch_plait.cache_hit_share, 4),
        "batch_cache_hit_ideal": round(batch_plait.ideal_hit_share, 4),
        # Prompt tokens computed (not served from cache) over the least any cache allows.
        "batch_prompt_tokens_vs_bound": round(
            (1 - batch_plait.cache_hit_share) / (1 - batch_plait.ideal_hit_share), 3
        ),
        "agents_cache_hit_naive": round(naive.cache_hit_share, 4),
        "agents_cache_hit_plait": round(plait.cache_hit_share, 4),
        "agents_cache_hit_ideal": round(plait.ideal_hit_share, 4),
        # Round-robin (naive) over 4 replicas; traces/README.md measured 0.068 (synthetic)
        # and 0.052 (conversation) with a plain LRU cache, 0.651 and 0.374 unlimited.
        "mooncake_syn_hit_rr": round(mooncake["synthetic"].cache_hit_share, 4),
        "mooncake_conv_hit_rr": round(mooncake["conversation"].cache_hit_share, 4),
        "mooncake_syn_hit_ideal": round(mooncake["synthetic"].ideal_hit_share, 4),
        # plait's prefix-aware router (longest known prefix, two choices, load cap 1.5x).
        "mooncake_syn_hit": round(routed["synthetic"].cache_hit_share, 4),
        "mooncake_syn_load_imbalance": round(routed["synthetic"].load_imbalance, 3),
        "mooncake_conv_hit": round(routed["conversation"].cache_hit_share, 4),
        "mooncake_conv_load_imbalance": round(routed["conversation"].load_imbalance, 3),
        "mooncake_conv_hit_ideal": round(mooncake["conversation"].ideal_hit_share, 4),
        "sim_hour_replay_s": round(hour_s * 3600 / span, 2),
        "sim_replay_wall_s": round(hour_s, 2),
        "sim_replay_simulated_s": round(span, 1),
        "sweep": {
            "agents": [{"rate": r, "naive": n.row(), "plait": p.row()} for r, n, p in agents],
            "sql": [{"rate": r, "naive": n.row(), "plait": p.row()} for r, n, p in sql],
            "agents_full": [
                {"rate": r, "naive": n.row(), "plait": p.row()} for r, n, p in full_sweep
            ],
        },
        "quick": args.quick,
        "seed": args.seed,
        "profile": PROFILE,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if args.plots:
        figures["plots"] = plot(args.plots, agents, head, sql)
    print(json.dumps(figures, separators=(",", ":")))
    _results.save("jct", figures, parser, args, argv, ignore=("plots",))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
