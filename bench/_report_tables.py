"""The tables of docs/benchmarks.md, each rendered from result records (bench/report.py).

A table function takes the `Results` of a directory and returns markdown: the table and the
line naming where its figures come from. Targets are the benches' own (their docstrings);
everything else is read from the records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _report import Results, busy, num, provenance, table, x

Table = Callable[[Results], str]
TABLES: dict[str, Table] = {}


def renders(fn: Table) -> Table:
    """Register `fn` under its own name: the template places it as `{{ name }}`."""
    TABLES[fn.__name__] = fn
    return fn


def met(value: float | None, ok: bool, busy: bool = False, ratio: bool = False) -> str:
    """The verdict on a target. On a machine busier than its cores (`busy`) a time or a rate
    that meets its target is met (the load only slowed it), but a miss, or any verdict on a
    `ratio` of two times (the load moves either side), is not judged."""
    if value is None:
        return "not measured"
    if busy and (ratio or not ok):
        return "not judged (busy machine)"
    return "met" if ok else "**not met**"


def _at_most(value: float | None, bound: float, busy: bool = False, ratio: bool = False) -> str:
    return met(value, value is not None and value <= bound, busy, ratio)


def _at_least(value: float | None, bound: float, busy: bool = False, ratio: bool = False) -> str:
    return met(value, value is not None and value >= bound, busy, ratio)


# --- engine overhead -------------------------------------------------------------------------

OVERHEAD = "python bench/overhead.py"
GRAPH_NAMES = {
    "chain": "chain",
    "fanout": "fan-out",
    "dag": "random DAG",
    "concurrent": "many 10-task workflows",
}
RUNNER_NAMES = {"plait": "plait", "asyncio": "asyncio", "langgraph": "LangGraph", "ray": "Ray"}


@renders
def overhead_graphs(results: Results) -> str:
    record = results("overhead", OVERHEAD)
    rows = []
    for kind, runners in record["figures"]["graphs"].items():
        for runner, m in runners.items():
            if m is None:
                rows.append([GRAPH_NAMES[kind], RUNNER_NAMES[runner], "not run", "", "", ""])
                continue
            rows.append(
                [
                    GRAPH_NAMES[kind],
                    RUNNER_NAMES[runner],
                    num(m["tasks"], ",d"),
                    num(m["run_s"], ".3f"),
                    num(m["us_per_task"]),
                    x(m["ratio_vs_plait"]),
                ]
            )
    header = ["graph", "runner", "tasks", "run s", "us per task", "x plait"]
    return table(header, rows, "llrrrr") + "\n\n" + provenance(record)


@renders
def overhead_tracing(results: Results) -> str:
    command = "python bench/overhead.py --quick --only plait --tracing"
    record = results("overhead-onlyplait-quick-tracing", command)
    f = record["figures"]
    rows = [
        [
            GRAPH_NAMES[kind],
            num(f["graphs"][kind]["plait"]["us_per_task"]),
            num(f["traced_graphs"][kind]),
        ]
        for kind in f["traced_graphs"]
    ]
    rows.append(
        [
            "**mean**",
            num(f["plait_us_per_task"]),
            f"{num(f['plait_us_per_task_traced'])} ({x(f['tracing_ratio'])})",
        ]
    )
    header = ["graph", "us per task, tracing off", "us per task, traced"]
    return table(header, rows) + "\n\n" + provenance(record)


@renders
def overhead_headline(results: Results) -> str:
    record = results("overhead", OVERHEAD)
    f, slow = record["figures"], busy(record)
    us, dag, pending = f["plait_us_per_task"], f["dag100k_s"], f["bytes_per_pending_task"]
    rows = [
        [
            "`plait_us_per_task` (mean over the four graphs)",
            num(us, ".1f", " us"),
            "at most 30 us: " + _at_most(us, 30, slow),
        ],
        [
            "`asyncio_us_per_task` (the lower bound)",
            num(f["asyncio_us_per_task"], ".1f", " us"),
            "",
        ],
        [
            "`langgraph_ratio` (LangGraph us per task ÷ plait's)",
            x(f["langgraph_ratio"], ".1f"),
            "at least 10x: " + _at_least(f["langgraph_ratio"], 10, slow, ratio=True),
        ],
        ["`ray_ratio`", x(f["ray_ratio"], ".1f"), ""],
        [
            "`dag100k_s` (build and run a 100,000-task DAG)",
            num(dag, ".2f", " s"),
            "under 5 s: " + met(dag, dag is not None and dag < 5, slow),
        ],
        [
            "`bytes_per_pending_task` (a built, not yet run, 100,000-task workflow)",
            num(pending, ",.0f", " B"),
            "under 2 KB: " + met(pending, pending is not None and pending < 2048),
        ],
        [
            "`plait_build_us_per_task` (`wf.add` with validation)",
            num(f["plait_build_us_per_task"], ".1f", " us"),
            "",
        ],
    ]
    return table(["figure", "measured", "target"], rows, "lrl") + "\n\n" + provenance(record)


# --- batch mode ------------------------------------------------------------------------------


@renders
def batch_simulator(results: Results) -> str:
    full = results("batch-no-vllm", "python bench/batch.py --no-vllm")
    quick = results("batch-no-vllm-quick", "python bench/batch.py --quick --no-vllm")
    rows = []
    for label, record in ((None, full), ("quick", quick)):
        f = record["figures"]
        size = f"{f['sim_rows']:,} rows" + (" (`--quick`)" if label else "")
        speedup, bound = f["sim_speedup"], f["sim_prompt_tokens_vs_bound"]
        rows += [
            [
                f"{size}: wall time (virtual)",
                num(f["sim_naive_wall_s"], ",.1f", " s"),
                num(f["sim_plait_wall_s"], ",.1f", " s"),
                x(speedup) + " faster",
                ">= 3x: " + _at_least(speedup, 3),
            ],
            [
                f"{size}: prompt tokens computed ÷ the bound",
                x(f["sim_naive_prompt_tokens_vs_bound"], ".3f"),
                x(bound, ".3f"),
                "",
                "<= 1.05x: " + _at_most(bound, 1.05),
            ],
            [
                f"{size}: share of prompt tokens from cache",
                num(f["sim_naive_cache_hit"], ".3f"),
                num(f["sim_plait_cache_hit"], ".3f"),
                "",
                "",
            ],
        ]
    header = ["simulator, 4 replicas", "naive", "plait", "ratio", "target"]
    return table(header, rows, "lrrrl") + "\n\n" + provenance(full, quick, wall_time=False)


@renders
def batch_vllm(results: Results) -> str:
    record = results("batch", "python bench/batch.py")
    f = record["figures"]
    rows = [
        [
            f"2 servers, {f['vllm_rows']:,} rows: wall",
            num(f["vllm_naive_s"], ",.1f", " s"),
            num(f["vllm_plait_s"], ",.1f", " s"),
            x(f["vllm_speedup"]) + " faster",
            ">= 2x: " + _at_least(f["vllm_speedup"], 2),
        ],
        [
            "2 servers: prompt tokens computed, plait ÷ naive",
            "",
            "",
            num(f["vllm_computed_tokens_ratio"], ".3f"),
            "",
        ],
        [
            "1 server: wall, vLLM's `run-batch` ÷ `plait batch run`",
            num(f["vllm_run_batch_s"], ",.1f", " s"),
            num(f["vllm_plait_one_server_s"], ",.1f", " s"),
            x(f["vllm_run_batch_ratio"]),
            "reported",
        ],
        [
            "1 server: the same, `run-batch`'s engine start-up left out",
            "",
            "",
            x(f["vllm_run_batch_ratio_after_startup"]),
            "reported",
        ],
    ]
    header = ["real vLLM (CPU build)", "naive / run-batch", "plait", "ratio", "target"]
    return table(header, rows, "lrrrl") + "\n\n" + provenance(record)


# --- the demo --------------------------------------------------------------------------------


@renders
def demo(results: Results) -> str:
    record = results("demo", "python bench/demo.py")
    rows = []
    for r in record["figures"]["rates"]:
        for mode in ("naive", "plait"):
            m = r[mode]
            rows.append(
                [
                    num(r["rate"], ".2f"),
                    mode,
                    num(m["mean_jct_s"]),
                    num(m["p95_jct_s"]),
                    num(m["cache_hit_share"], ".0%"),
                    num(m["throughput_per_s"], ".3f"),
                ]
            )
        rows.append(["", "naive ÷ plait", x(r["mean_jct_ratio"]), x(r["p95_jct_ratio"]), "", ""])
    header = ["arrivals/s", "mode", "mean JCT s", "p95 JCT s", "cache hits", "done/s"]
    return table(header, rows, "rlrrrr") + "\n\n" + provenance(record, wall_time=False)


# --- job completion time ---------------------------------------------------------------------

JCT = "python bench/jct.py"
ABLATION_NAMES = {
    "naive": "naive (round-robin, no hints)",
    "program-first": "plait: program-first only (round-robin)",
    "+routing": "plait: + prefix routing",
    "full": "plait: + routing + keep-alive (**the default**)",
    "full+grouping": "plait: the default + prefix grouping",
}


def _sweep(rows: list[dict[str, Any]], throughput: bool) -> str:
    out = []
    for r in rows:
        n, p = r["naive"], r["plait"]
        cells = [
            num(r["rate"], ".2f"),
            num(n["mean_jct_s"]),
            num(p["mean_jct_s"]),
            num(n["p95_jct_s"]),
            num(p["p95_jct_s"]),
            num(n["cache_hit_share"], ".2f"),
            num(p["cache_hit_share"], ".2f"),
        ]
        if throughput:
            cells += [num(n["throughput_per_s"], ".3f"), num(p["throughput_per_s"], ".3f")]
        out.append(cells)
    header = [
        "arrivals/s",
        "naive mean s",
        "plait mean s",
        "naive p95 s",
        "plait p95 s",
        "naive cache hit",
        "plait cache hit",
    ]
    if throughput:
        header += ["naive done/s", "plait done/s"]
    return table(header, out)


@renders
def jct_agents_replicas(results: Results) -> str:
    record = results("jct", JCT)
    f = record["figures"]
    return (
        _sweep(f["sweep"]["agents_full"], throughput=True)
        + "\n\n"
        + provenance(record, wall_time=False)
    )


@renders
def jct_agents_ablation(results: Results) -> str:
    record = results("jct", JCT)
    f = record["figures"]
    rate = f["agents_full_rate_per_s"]
    rows = [
        [
            ABLATION_NAMES.get(name, name),
            num(r["mean_jct_s"]),
            num(r["p95_jct_s"]),
            num(r["cache_hit_share"], ".2f"),
            num(r["load_imbalance"], ".2f"),
        ]
        for name, r in f["agents_full_ablation"].items()
    ]
    header = [
        f"mode ({rate:.3f} agents/s, 4 replicas)",
        "mean JCT s",
        "p95 JCT s",
        "cache hit",
        "busiest replica ÷ mean",
    ]
    mean, p95 = f["agents_full_mean_jct_ratio"], f["agents_full_p95_jct_ratio"]
    headline = table(
        ["figure", "value", "target"],
        [
            [
                "capacity (the best mode's steady throughput), agents/s",
                num(f["agents_full_capacity_per_s"], ".3f"),
                "",
            ],
            [
                "naive's own peak throughput, agents/s",
                num(f["agents_full_naive_peak_throughput_per_s"], ".3f"),
                "",
            ],
            [
                "`agents_full_mean_jct_ratio` (naive ÷ plait, at 0.8 of capacity)",
                x(mean),
                ">= 2.5x: " + _at_least(mean, 2.5),
            ],
            ["`agents_full_p95_jct_ratio`", x(p95), ">= 2x: " + _at_least(p95, 2)],
        ],
        "lrl",
    )
    return table(header, rows) + "\n\n" + headline + "\n\n" + provenance(record, wall_time=False)


@renders
def jct_agents_one_replica(results: Results) -> str:
    record = results("jct", JCT)
    f = record["figures"]
    return (
        _sweep(f["sweep"]["agents"], throughput=False)
        + "\n\n"
        + provenance(record, wall_time=False)
    )


@renders
def jct_keep_alive(results: Results) -> str:
    record = results("jct", JCT)
    f = record["figures"]
    jct, hit = f["agents_keep_alive_mean_jct_s"], f["agents_keep_alive_cache_hit"]
    rows = [
        ["program-first, no keep-alive", num(jct["off"]), num(hit["off"], ".2f")],
        [
            "+ keep-alive heard by the server (the simulator pins the program's blocks)",
            num(jct["on"]),
            num(hit["on"], ".2f"),
        ],
        [
            "+ hold-back instead (the server hears nothing, as upstream vLLM)",
            num(jct["hold_back"]),
            num(hit["hold_back"], ".2f"),
        ],
    ]
    rate = f["agents_keep_alive_rate_per_s"]
    header = [f"mode (one replica, {rate:.2f} agents/s)", "mean JCT s", "cache hit"]
    return table(header, rows) + "\n\n" + provenance(record, wall_time=False)


@renders
def jct_batch(results: Results) -> str:
    record = results("jct", JCT)
    f = record["figures"]
    ideal = 1 - f["batch_cache_hit_ideal"]

    def vs_bound(hit: float) -> str:
        return x((1 - hit) / ideal)

    rows = [
        [
            "naive (question-major, as the input is laid out)",
            num(f.get("batch_makespan_naive_s")),
            num(f["batch_cache_hit_naive"], ".2f"),
            vs_bound(f["batch_cache_hit_naive"]),
        ],
        [
            "plait (program-first: a document's questions together)",
            num(f.get("batch_makespan_plait_s")),
            num(f["batch_cache_hit_plait"], ".2f"),
            x(f["batch_prompt_tokens_vs_bound"]),
        ],
        [
            "plait + prefix grouping",
            num(f["batch_makespan_grouped_s"]),
            num(f["batch_cache_hit_grouped"], ".2f"),
            vs_bound(f["batch_cache_hit_grouped"]),
        ],
    ]
    ratio, bound = f["batch_throughput_ratio"], f["batch_prompt_tokens_vs_bound"]
    headline = table(
        ["figure", "value", "target"],
        [
            [
                "`batch_throughput_ratio` (naive makespan ÷ plait's)",
                x(ratio),
                ">= 3x: " + _at_least(ratio, 3),
            ],
            ["`batch_prompt_tokens_vs_bound`", x(bound), "<= 1.05x: " + _at_most(bound, 1.05)],
        ],
        "lrl",
    )
    header = ["mode (one replica)", "makespan s", "cache hit", "prompt tokens computed ÷ least"]
    return table(header, rows) + "\n\n" + headline + "\n\n" + provenance(record, wall_time=False)


@renders
def jct_sql(results: Results) -> str:
    record = results("jct", JCT)
    f = record["figures"]
    rows = [
        [
            num(r["rate"], ".2f"),
            num(r["naive"]["deadline_attainment"], ".3f"),
            num(r["plait"]["deadline_attainment"], ".3f"),
            num(r["naive"]["mean_jct_s"]),
            num(r["plait"]["mean_jct_s"]),
        ]
        for r in f["sweep"]["sql"]
    ]
    header = [
        "queries/s",
        "naive attainment",
        "plait attainment",
        "naive mean JCT s",
        "plait mean JCT s",
    ]
    return table(header, rows) + "\n\n" + provenance(record, wall_time=False)


@renders
def jct_quick(results: Results) -> str:
    record = results("jct-quick", "python bench/jct.py --quick")
    f = record["figures"]
    rows = [
        [
            "agents over 4 replicas at 0.8 of capacity: mean / p95 JCT, naive ÷ plait",
            f"{x(f['agents_full_mean_jct_ratio'])} / {x(f['agents_full_p95_jct_ratio'])}",
        ],
        [
            "agents on one replica at 0.8 of capacity: mean / p95 JCT, naive ÷ plait",
            f"{x(f['agents_mean_jct_ratio'])} / {x(f['agents_p95_jct_ratio'])}",
        ],
        [
            "batch: naive makespan ÷ plait's, prompt tokens ÷ least",
            f"{x(f['batch_throughput_ratio'])}, {x(f['batch_prompt_tokens_vs_bound'])}",
        ],
        [
            f"text-to-SQL at {f['sql_rate_per_s']:g} queries/s: attainment, naive / plait",
            f"{num(f['sql_deadline_attainment_naive'], '.3f')} / "
            f"{num(f['sql_deadline_attainment_plait'], '.3f')}",
        ],
    ]
    return (
        table(["figure (`--quick`)", "value"], rows) + "\n\n" + provenance(record, wall_time=False)
    )


@renders
def mooncake(results: Results) -> str:
    record = results("jct", JCT)
    ceiling = results("mooncake_ceiling", "python bench/mooncake_ceiling.py")
    f, c = record["figures"], ceiling["figures"]
    rows = []
    syn, syn_imbalance, conv = (
        f["mooncake_syn_hit"],
        f["mooncake_syn_load_imbalance"],
        f["mooncake_conv_hit"],
    )
    targets = {
        "syn": ">= 0.25, <= 1.25: " + met(syn, syn >= 0.25 and syn_imbalance <= 1.25),
        "conv": ">= 0.08: " + _at_least(conv, 0.08),
    }
    for trace, key in (("synthetic", "syn"), ("conversation", "conv")):
        rows.append(
            [
                trace,
                num(f[f"mooncake_{key}_hit_rr"], ".3f"),
                num(f[f"mooncake_{key}_hit"], ".3f"),
                num(f[f"mooncake_{key}_load_imbalance"], ".3f"),
                num(c[trace]["pooled_lru_hit"], ".3f"),
                num(c[trace]["belady_hit"], ".3f"),
                num(f[f"mooncake_{key}_hit_ideal"], ".3f"),
                num(c[trace]["pooled_lru_cold_request_share"], ".0%"),
                num(c[trace]["median_block_reuse_gap_s"], ".0f", " s"),
                targets[key],
            ]
        )
    header = [
        "trace",
        "round-robin",
        "plait router",
        "busiest ÷ mean",
        "one pooled LRU cache",
        "Belady, pooled",
        "unlimited cache",
        "requests with nothing cached (pooled LRU)",
        "median gap between two uses of a block",
        "target (router: hit share, busiest ÷ mean)",
    ]
    replay = f["sim_hour_replay_s"]
    after = table(
        ["figure", "value", "target"],
        [
            [
                "`sim_hour_replay_s` (wall seconds to simulate an hour of agent arrivals)",
                num(replay, ".1f", " s"),
                "< 60 s: " + met(replay, replay < 60, busy(record)),
            ]
        ],
        "lrl",
    )
    return table(header, rows) + "\n\n" + after + "\n\n" + provenance(record, ceiling)


# --- deadlines beside batch work -------------------------------------------------------------

PART1_SEEDS = (0, 1, 2, 3, 4)
PART2_SEEDS = (0, 1, 2, 3, 4, 5)
LIGHT_SEEDS = (0, 1)
PART1_MODES = {
    "naive": ("naive", "interactive_attainment_naive", "batch_throughput_share_naive"),
    "priority-only": (
        "priority-only",
        "interactive_attainment_priority_only",
        "batch_throughput_share_priority_only",
    ),
    "plait": ("plait (**the default**)", "interactive_attainment", "batch_throughput_share"),
    "no lane": (
        "plait, no lane",
        "interactive_attainment_no_lane",
        "batch_throughput_share_no_lane",
    ),
    "lane": (
        "plait + lane (2 batch calls on it)",
        "interactive_attainment_lane",
        "batch_throughput_share_lane",
    ),
    "lane, programs": (
        "lane, programs",
        "interactive_attainment_lane_programs",
        "batch_throughput_share_lane_programs",
    ),
    "lane, paced": (
        "lane, paced",
        "interactive_attainment_lane_paced",
        "batch_throughput_share_lane_paced",
    ),
}
PART2_MODES = {
    "naive": "sql_attainment_naive",
    "priority-only": "sql_attainment_priority_only",
    "plait (**the default**)": "sql_attainment_plait",
    "plait, one late run kept going": "sql_attainment_plait_late_kept_going",
    'plait, `late="cancel"`': "sql_attainment_plait_late_cancel",
    "the same, no deadline gate": "sql_attainment_plait_late_cancel_no_gate",
}


def _deadlines(results: Results, name: str, args: str) -> dict[str, Any]:
    return results(name, f"python bench/deadlines.py {args}")


def _part1_name(seed: int, rate: str = "") -> tuple[str, str]:
    name = "deadlines-part1" + (f"-rate{rate}" if rate else "") + (f"-seed{seed}" if seed else "")
    args = "--part 1" + (f" --rate {rate}" if rate else "") + (f" --seed {seed}" if seed else "")
    return name, args


def _share(f: dict[str, Any], attainment: str, share: str) -> str:
    return f"{num(f[attainment], '.3f')} at {x(f[share], '.3f')}"


def _part1_table(records: list[dict[str, Any]], seeds: tuple[int, ...]) -> str:
    rows = []
    for label, attainment, share in PART1_MODES.values():
        rows.append([label, *(_share(r["figures"], attainment, share) for r in records)])
    rows.append(
        [
            "a replica given whole to the queries",
            *(
                _share(
                    r["figures"],
                    "queries_alone_on_one_replica_attainment",
                    "batch_share_whole_lane",
                )
                for r in records
            ),
        ]
    )
    rows.append(
        [
            "ceiling: most batch share at 0.95 attainment (estimate)",
            *(x(r["figures"]["batch_share_ceiling"], ".3f") for r in records),
        ]
    )
    rows.append(
        [
            "the same, every query due by the batch's end",
            *(x(r["figures"]["batch_share_ceiling_all_due"], ".3f") for r in records),
        ]
    )
    f = records[0]["figures"]
    header = [
        f"{f['queries']} queries at {f['query_rate_per_s']:g}/s: attainment at batch share",
        *(f"seed {s}" for s in seeds),
    ]
    return table(header, rows)


@renders
def deadlines_part1(results: Results) -> str:
    records = [_deadlines(results, *_part1_name(seed)) for seed in PART1_SEEDS]
    f = records[0]["figures"]
    met_all = [
        r["figures"]["interactive_attainment"] >= 0.95
        and r["figures"]["batch_throughput_share"] >= 0.85
        for r in records
    ]
    target = table(
        ["target", "the default"],
        [
            [
                "attainment >= 0.95 with the batch at >= 0.85x of its throughput alone "
                f"({f['batch_rows']:,} rows, {f['queries']} queries at "
                f"{f['query_rate_per_s']:g}/s)",
                f"met on {sum(met_all)} of {len(met_all)} seeds",
            ]
        ],
        "ll",
    )
    return (
        _part1_table(records, PART1_SEEDS)
        + "\n\n"
        + target
        + "\n\n"
        + provenance(*records, wall_time=False)
    )


@renders
def deadlines_light(results: Results) -> str:
    records = [_deadlines(results, *_part1_name(seed, "0.2")) for seed in LIGHT_SEEDS]
    return _part1_table(records, LIGHT_SEEDS) + "\n\n" + provenance(*records, wall_time=False)


@renders
def deadlines_part2(results: Results) -> str:
    records = [
        _deadlines(
            results,
            "deadlines-part2" + (f"-seed{seed}" if seed else ""),
            "--part 2" + (f" --seed {seed}" if seed else ""),
        )
        for seed in PART2_SEEDS
    ]
    rows = [["queries/s", *(f"{r['figures']['sql_rate_per_s']:g}" for r in records)]]
    for label, key in PART2_MODES.items():
        rows.append([label, *(num(r["figures"][key], ".3f") for r in records)])
    met_all = sum(r["figures"]["sql_attainment_plait"] >= 0.8 for r in records)
    header = ["mode: attainment", *(f"seed {s}" for s in PART2_SEEDS)]
    target = table(
        ["target", "the default"],
        [["attainment >= 0.8", f"met on {met_all} of {len(records)} seeds"]],
        "ll",
    )
    return table(header, rows) + "\n\n" + target + "\n\n" + provenance(*records, wall_time=False)


@renders
def deadlines_quick(results: Results) -> str:
    record = _deadlines(results, "deadlines-quick", "--quick")
    f = record["figures"]
    rows = [
        [f"part 1: {label}", _share(f, attainment, share)]
        for label, attainment, share in PART1_MODES.values()
    ]
    rows += [
        [f"part 2 at {f['sql_rate_per_s']:g} queries/s: {label}", num(f[key], ".3f")]
        for label, key in PART2_MODES.items()
    ]
    header = [
        f"`--quick` (part 1: {f['batch_rows']:,} batch rows, {f['queries']} queries)",
        "attainment (at batch share)",
    ]
    return table(header, rows, "lr") + "\n\n" + provenance(record, wall_time=False)


# --- real vLLM and real GPUs -----------------------------------------------------------------


@renders
def sim_vs_vllm(results: Results) -> str:
    record = results("sim_vs_vllm", "make bench-sim-vllm")
    f = record["figures"]
    rows = [
        [
            "prompt tokens queried",
            num(f["prompt_tokens_vllm"], ",d"),
            num(f["prompt_tokens_sim"], ",d"),
            "equal (`make test-vllm` checks it)",
        ],
        [
            "prompt tokens served from cache",
            num(f["cached_tokens_vllm"], ",d"),
            num(f["cached_tokens_sim"], ",d"),
            "within 5% (`make test-vllm` checks it)",
        ],
        [
            "mean request latency",
            num(f["mean_latency_vllm_s"], ".3f", " s"),
            num(f["mean_latency_sim_s"], ".3f", " s"),
            "measured, not tested",
        ],
    ]
    header = ["", "vLLM (CPU build)", "simulator (`cpu-tiny`)", "tolerance"]
    return table(header, rows, "lrrl") + "\n\n" + provenance(record)


VLLM_CPU = "make bench-vllm"


@renders
def vllm_cpu_headline(results: Results) -> str:
    record = results("vllm_cpu", VLLM_CPU)
    f = record["figures"]
    modes = {(m["workload"], m["servers"], m["mode"]): m for m in f["modes"]}
    rows: list[list[str]] = []
    for servers, prefix in ((2, ""), (1, "one_server_")):
        rows.append([f"**{'two servers' if servers == 2 else 'one server'}**", "", "", "", ""])
        agents = modes["agents", servers, "naive"], modes["agents", servers, "plait"]
        batch = modes["batch", servers, "naive"], modes["batch", servers, "plait"]
        mean, p95 = f[f"{prefix}agents_mean_jct_ratio"], f[f"{prefix}agents_p95_jct_ratio"]
        tokens, speedup = f[f"{prefix}agents_computed_tokens_ratio"], f[f"{prefix}batch_speedup"]
        batch_tokens = f[f"{prefix}batch_computed_tokens_ratio"]
        two = servers == 2
        rows += [
            [
                "agents mean JCT",
                *(num(m["mean_jct_s"], ".2f", " s") for m in agents),
                x(mean) + " lower",
                ">= 1.5x: " + _at_least(mean, 1.5) if two else "",
            ],
            [
                "agents p95 JCT",
                *(num(m["p95_jct_s"], ".2f", " s") for m in agents),
                x(p95) + " lower",
                "not worse: " + _at_least(p95, 1.0) if two else "",
            ],
            [
                "agents computed prompt tokens",
                *(num(m["computed_prompt_tokens"], ",d") for m in agents),
                num(tokens, ".2f"),
                "<= 0.5: " + _at_most(tokens, 0.5) if two else "",
            ],
            [
                "batch wall time",
                *(num(m["wall_s"], ".2f", " s") for m in batch),
                x(speedup) + " lower",
                ">= 2x: " + _at_least(speedup, 2) if two else "",
            ],
            [
                "batch computed prompt tokens",
                *(num(m["computed_prompt_tokens"], ",d") for m in batch),
                num(batch_tokens, ".2f"),
                "<= 0.5: " + _at_most(batch_tokens, 0.5) if two else "",
            ],
        ]
    header = ["", "naive", "plait", "ratio", "target"]
    return table(header, rows, "lrrrl") + "\n\n" + provenance(record)


@renders
def vllm_cpu_ablation(results: Results) -> str:
    record = results("vllm_cpu", VLLM_CPU)
    rows = [
        [
            f"{m['workload']}, {m['servers']}",
            m["mode"],
            num(m["mean_jct_s"], ".2f", " s"),
            num(m["p95_jct_s"], ".2f", " s"),
            num(m["wall_s"], ".2f", " s"),
            num(m["computed_prompt_tokens"], ",d"),
        ]
        for m in sorted(
            record["figures"]["modes"],
            key=lambda m: (m["workload"], m["servers"], m["mode"] != "naive", m["mode"] == "plait"),
        )
    ]
    header = ["workload, servers", "mode", "mean JCT", "p95 JCT", "wall", "computed prompt tokens"]
    return table(header, rows, "llrrrr") + "\n\n" + provenance(record)


GPU = "python bench/gpu_profile.py --out DIR"


@renders
def gpu_prefill(results: Results) -> str:
    record = results("gpu_profile", GPU)
    f = record["figures"]
    fresh = [p for p in f["prefill"] if p["past"] == 0 and p["tokens"] >= 1024]
    cached = [p for p in f["prefill"] if p["past"] > 0]
    rows = [
        ["ms", *(num(p["s"] * 1e3, ".1f") for p in fresh)],
        ["tokens/s", *(num(p["tokens_per_s"], ",.0f") for p in fresh)],
    ]
    first = table(["prefill forward", *(f"{p['tokens']:,} tokens" for p in fresh)], rows)
    rows = [
        [
            f"{p['tokens']:,} after {p['past']:,} cached",
            num(p["s"] * 1e3, ".1f"),
            num(p["tokens_per_s"], ",.0f"),
        ]
        for p in cached
    ]
    second = table(["prompt chunk", "ms", "tokens/s"], rows)
    return first + "\n\n" + second + "\n\n" + provenance(record)


@renders
def gpu_decode(results: Results) -> str:
    return _decode_table(results("gpu_profile", GPU))


@renders
def gpu_h200_terms(results: Results) -> str:
    record = results("gpu_profile-h200", GPU)
    chunks = results("gpu_profile-chunks-h200", "python bench/gpu_profile.py --chunks --out DIR")
    f = record["figures"]
    fitted, assumed = f["fitted"], f["assumed_h100_llama3_8b"]
    rows = [
        [
            "step overhead, ms",
            num(fitted["step_overhead_s"] * 1e3, ".2f"),
            num(assumed["step_overhead_s"] * 1e3, ".2f"),
        ],
        [
            "prefill, tokens/s",
            num(fitted["prefill_tokens_per_s"], ",.0f"),
            num(assumed["prefill_tokens_per_s"], ",.0f"),
        ],
        [
            "decode, us per sequence",
            num(fitted["decode_s_per_seq"] * 1e6, ".1f"),
            num(assumed["decode_s_per_seq"] * 1e6, ".1f"),
        ],
        [
            "decode, ns per context token",
            num(fitted["decode_s_per_context_token"] * 1e9, ".1f"),
            num(assumed["decode_s_per_context_token"] * 1e9, ".1f"),
        ],
    ]
    terms = table(["term", "H200, fitted", "`h100-llama3-8b` profile"], rows)
    added: dict[int, dict[int, float]] = {}
    for step in chunks["figures"]["chunk_steps"]:
        if step["context"] == 2048 and step["chunk"] and "chunk_added_s" in step:
            added.setdefault(step["batch"], {})[step["chunk"]] = step["chunk_added_s"]
    sizes = sorted({c for by in added.values() for c in by})
    rows = [
        [f"B = {b}", *(num(added[b][c] * 1e3, ".2f") if c in added[b] else "" for c in sizes)]
        for b in sorted(added)
    ]
    chunk_table = table(
        ["ms a chunk adds on the H200, L = 2,048", *(f"{c:,} tokens" for c in sizes)], rows
    )
    worst = fitted["decode_fit_worst_relative_error"]
    return (
        terms
        + f"\n\nThe fitted decode terms miss the measured steps by at most {worst:.0%}.\n\n"
        + _decode_table(record)
        + "\n\n"
        + chunk_table
        + "\n\n"
        + provenance(record, chunks)
    )


def _decode_table(record: dict[str, Any]) -> str:
    f = record["figures"]
    steps = {(d["batch"], d["context"]): d["s"] for d in f["decode"]}
    fused = {(d["batch"], d["context"]): d["compiled_s"] for d in f.get("compiled_decode", [])}
    batches = sorted({b for b, _ in steps})
    contexts = sorted({c for _, c in steps})
    rows = []
    for b in batches:
        cells = [f"B = {b}"]
        for c in contexts:
            cell = num(steps[b, c] * 1e3, ".2f") if (b, c) in steps else "over memory"
            if (b, c) in fused:
                cell += f" (fused {fused[b, c] * 1e3:.2f})"
            cells.append(cell)
        rows.append(cells)
    header = ["decode step (CUDA graph), ms", *(f"L = {c:,}" for c in contexts)]
    return table(header, rows) + "\n\n" + provenance(record)


@renders
def gpu_chunks(results: Results) -> str:
    plain = results("gpu_profile-chunks", "python bench/gpu_profile.py --chunks --out DIR")
    fused = results(
        "gpu_profile-chunks-compiled", "python bench/gpu_profile.py --chunks --compiled --out DIR"
    )
    chunks = sorted({s["chunk"] for s in plain["figures"]["chunk_steps"] if s["chunk"]})

    def added(record: dict[str, Any], batch: int) -> dict[int, float]:
        return {
            s["chunk"]: s["chunk_added_s"]
            for s in record["figures"]["chunk_steps"]
            if s["batch"] == batch and s["context"] == 2048 and s["chunk"]
        }

    def charged(batch: int) -> dict[int, float]:
        steps = {
            s["chunk"]: s["simulated_s"]
            for s in plain["figures"]["chunk_steps"]
            if s["batch"] == batch and s["context"] == 2048
        }
        return {c: steps[c] - steps[0] for c in chunks if c in steps}

    rows = []
    for label, record, batch in (
        ("plain graphs, B = 8", plain, 8),
        ("plain graphs, B = 32", plain, 32),
        ("plain graphs, B = 128", plain, 128),
        ("fused, B = 32", fused, 32),
        ("fused, B = 128", fused, 128),
        ("**the profile charges**", None, 32),
    ):
        values = charged(batch) if record is None else added(record, batch)
        rows.append([label, *(num(values[c] * 1e3, ".2f") if c in values else "" for c in chunks)])
    header = ["ms a chunk adds, L = 2,048", *(f"{c:,} tokens" for c in chunks)]
    return table(header, rows) + "\n\n" + provenance(plain, fused)


# --- several engines -------------------------------------------------------------------------


@renders
def scale_processes(results: Results) -> str:
    record = results("scale-no-sim", "python bench/scale.py --no-sim")
    f = record["figures"]
    rows = []
    for label, suffix in (
        ("no-op (a chain of 4 steps)", ""),
        ("tool-heavy (4 tool calls of 50 ms and a join)", "_tools"),
    ):
        one = f[f"throughput{suffix}_1"]
        rows.append(
            [
                label,
                *(
                    num(f[f"throughput{suffix}_{n}"], ",.0f", "/s")
                    + ("" if n == 1 else f" ({x(f[f'throughput{suffix}_{n}'] / one)})")
                    for n in (1, 2, 3)
                ),
            ]
        )
    first = table(["workflows", "1 engine", "2 engines", "3 engines"], rows)
    lease, took = f["takeover_lease_s"], f["takeover_s"]
    rows = [
        ["first run claimed after the kill", num(f["takeover_first_s"], ".2f", " s"), ""],
        [
            "every run claimed after the kill",
            num(took, ".2f", " s"),
            f"within twice the lease ({2 * lease:g} s): " + _at_most(took, 2 * lease, busy(record)),
        ],
        ["runs lost", num(f["takeover_lost"], "d"), "0: " + met(0, f["takeover_lost"] == 0)],
        [
            "runs finished twice",
            num(f["takeover_finished_twice"], "d"),
            "0: " + met(0, f["takeover_finished_twice"] == 0),
        ],
    ]
    second = table([f"take-over (lease {lease:g} s)", "measured", "target"], rows, "lrl")
    return first + "\n\n" + second + "\n\n" + provenance(record)


@renders
def scale_cluster(results: Results) -> str:
    record = results(
        "scale_sim-modesshared_takeover", "python bench/scale_sim.py --modes shared,takeover"
    )
    quick = results("scale-quick", "python bench/scale.py --quick")
    f = record["figures"]
    rows = []
    for label, suffix in (
        ("1 engine", "_one_engine"),
        (f"{f['sim64_engines']} engines, shared routing and budget", ""),
        (f"{f['sim64_engines']} engines, one dies 60 s in", "_takeover"),
    ):
        rows.append(
            [
                label,
                num(f[f"sim64_hit_share{suffix}"], ".4f"),
                num(f[f"sim64_load_imbalance{suffix}"], ".3f"),
                num(f[f"sim64_mean_jct{suffix}_s"], ",.1f"),
                num(f[f"sim64_p95_jct{suffix}_s"], ",.1f"),
            ]
        )
    rows.append(["unlimited cache (ceiling)", num(f["sim64_hit_share_ceiling"], ".4f"), "", "", ""])
    header = [
        f"{f['sim64_programs']:,} agent programs ({f['sim64_llm_calls']:,} LLM calls) on "
        f"{f['sim64_replicas']} simulated H100s",
        "hit share",
        "busiest replica ÷ mean (computed tokens)",
        "mean JCT s",
        "p95 JCT s",
    ]
    hit, one = f["sim64_hit_share"], f["sim64_hit_share_one_engine"]
    imbalance, router = f["sim64_load_imbalance"], quick["figures"]["router_us_per_call_64"]
    targets = table(
        ["target", "measured", ""],
        [
            [
                "hit share of 8 engines within 2% of one engine's",
                f"{hit:.4f} against {one:.4f}",
                met(hit, hit >= 0.98 * one),
            ],
            [
                "busiest replica at most 1.25x the mean",
                x(imbalance, ".3f"),
                _at_most(imbalance, 1.25),
            ],
            [
                "the router's decision (choose + record) at 64 replicas under 50 us",
                num(router, ".1f", " us"),
                met(router, router < 50),
            ],
        ],
        "lrl",
    )
    return table(header, rows) + "\n\n" + targets + "\n\n" + provenance(record, quick)


# --- durability ------------------------------------------------------------------------------

DURABILITY = "python bench/durability.py --quick --repeat 3"


@renders
def durability(results: Results) -> str:
    record = results("durability-quick-repeat3", DURABILITY)
    f, slow = record["figures"], busy(record)
    graphs = f["plait"]
    sqlite, postgres = f["added_us_per_task_sqlite"], f["added_us_per_task_postgres"]

    def per_graph(store: str) -> str:
        values = ", ".join(
            f"{GRAPH_NAMES[k]} {g['added_us_per_task'][store]:.1f}" for k, g in graphs.items()
        )
        return f"({values})"

    lg_node, ratio = f["langgraph_checkpoint_us_per_node"], f["langgraph_vs_plait_sqlite_per_node"]
    loop, resume = f["loop_bytes_ratio_160_80"], f["resume_100k_s"]
    rows = [
        [
            "added per task, SQLite (WAL, `synchronous=FULL`)",
            f"{num(sqlite, '.1f', ' us')} {per_graph('sqlite')}",
            "at most 50 us: " + _at_most(sqlite, 50, slow),
        ],
        [
            "added per task, PostgreSQL (local)",
            f"{num(postgres, '.1f', ' us')} {per_graph('postgres')}",
            "at most 100 us: " + _at_most(postgres, 100, slow),
        ],
        [
            "LangGraph + `AsyncSqliteSaver`, added",
            f"{num(lg_node, ',.0f', ' us')} per node, "
            f"{num(f['langgraph_checkpoint_us_per_step'], ',.0f', ' us')} per superstep",
            "",
        ],
        [
            "LangGraph's added cost ÷ plait's (SQLite), per node",
            x(ratio, ".1f"),
            "at least 10x: " + _at_least(ratio, 10, slow, ratio=True),
        ],
        [
            "stored bytes per finished task, SQLite",
            f"{num(f['store_bytes_per_task_sqlite'], ',.0f')}, "
            f"{num(f['store_bytes_per_task_after_compaction'], ',.0f')} after compaction",
            "",
        ],
        [
            "`resume_100k_s`: `engine.resume()` of a stopped 100,000-task run, half done",
            num(resume, ".2f", " s"),
            "under 10 s: " + met(resume, resume is not None and resume < 10, slow),
        ],
        [
            "`loop_bytes_ratio_160_80`: an agent loop's stored bytes, 160 turns ÷ 80",
            num(loop, ".3f"),
            "at most 2.2 (2.0 is linear): " + _at_most(loop, 2.2),
        ],
        ["`loop_bytes_per_turn` (1 KB tool results)", num(f["loop_bytes_per_turn"], ",.0f"), ""],
    ]
    return table(["figure", "measured", "target"], rows, "lll") + "\n\n" + provenance(record)


@renders
def compaction(results: Results) -> str:
    record = results("compaction-quick", "python bench/compaction.py --quick")
    f = record["figures"]
    rows = []
    for store, name in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        before = f.get(f"store_bytes_per_task_{store}")
        after = f.get(f"store_bytes_per_task_after_compaction_{store}")
        change = None if not before or after is None else after / before - 1
        rows.append(
            [
                name,
                num(before, ",.0f"),
                num(after, ",.0f"),
                num(change, "+.0%"),
                num(f.get(f"compact_us_per_task_{store}"), ".1f"),
            ]
        )
    header = ["store", "bytes per task", "after compaction", "change", "compaction us per task"]
    return table(header, rows) + "\n\n" + provenance(record)


@renders
def store_append(results: Results) -> str:
    record = results("store_append", "python bench/store_append.py")
    f = record["figures"]
    rows = []
    for key, name in (
        ("sqlite_full", "SQLite, `synchronous=FULL`"),
        ("sqlite_normal", "SQLite, `synchronous=NORMAL`"),
        ("postgres", "PostgreSQL (local)"),
    ):
        cells = [name]
        for mode in ("stream", "per_task"):
            m = f[f"{key}_{mode}"]
            cells.append(
                f"{num(m['events_per_s'], ',.0f')} events/s ({num(m['us_per_task'], '.1f')} us "
                "a task)"
            )
        rows.append(cells)
    header = [
        f"store ({f['tasks']:,} tasks)",
        "streamed, one `durable()` at the end",
        "32 tasks at a time, each awaiting `durable()`",
    ]
    return table(header, rows) + "\n\n" + provenance(record)


# --- killed and resumed ----------------------------------------------------------------------

CRASH = "python bench/crash.py --workflows 500 --kills 20 --store both --seed 1"
CRASH_COLUMNS = {
    "workflows": "workflows",
    "kills": "kills",
    "completed_once": "completed_once",
    "lost": "lost",
    "duplicated": "duplicated",
    "llm_calls": "LLM calls",
    "llm_requests": "requests",
    "repeated_llm_calls": "repeated_llm_calls",
    "repeated_unrecorded": "repeated_unrecorded",
    "repeated_in_flight": "repeated_in_flight",
}


@renders
def crash(results: Results) -> str:
    full = results("crash-kills20-seed1-workflows500", CRASH)
    quick = results("crash-quick", "python bench/crash.py --quick")
    rows = []
    for label, record in (("", full), (" (`--quick`)", quick)):
        for store, name in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
            r = record["figures"][store]
            cells = [name + label]
            for key in CRASH_COLUMNS:
                value = num(r[key], ",d")
                cells.append(f"**{value}**" if key == "repeated_llm_calls" else value)
            median, most = num(r["commit_ms_median"], ",.1f"), num(r["commit_ms_max"], ",.0f")
            cells.append(f"{median} / {most}")
            rows.append(cells)
    header = ["store", *CRASH_COLUMNS.values(), "commit ms, median / max"]
    return table(header, rows) + "\n\n" + provenance(full, quick)


# --- the REST service ------------------------------------------------------------------------


@renders
def rest(results: Results) -> str:
    quick = results("rest-quick", "python bench/rest.py --quick")
    full = results("rest", "python bench/rest.py")
    rows = []
    for label, record in (("`--quick`", quick), ("full", full)):
        f = record["figures"]
        rows.append(
            [
                label,
                num(f["steady_requests"], ",d"),
                num(f["submissions_per_s"], ",.0f"),
                num(f["p50_ms"], ".1f"),
                num(f["p99_ms"], ".1f"),
                num(f["running_max"], ",d"),
                num(f["accepted"], ",d"),
                num(f["lost"], ",d"),
                num(f["duplicates"], ",d"),
                num(f["resumed"], ",d"),
            ]
        )
    header = ["run", "steady submissions", "accepted/s", "p50 ms", "p99 ms", "running at most",
              "accepted", "lost", "duplicates", "resumed after the kill"]  # fmt: skip
    f = quick["figures"]
    per_s, p99 = f["submissions_per_s"], f["p99_ms"]
    targets = table(
        ["target (the quick run: about 1,000 workflows running)", "measured"],
        [
            ["at least 1,000 accepted submissions/s", _at_least(per_s, 1000, busy(quick))],
            ["p99 under 50 ms", met(p99, p99 < 50, busy(quick))],
            [
                "no accepted submission lost",
                met(0, f["lost"] == 0 and full["figures"]["lost"] == 0),
            ],
        ],
        "ll",
    )
    return table(header, rows) + "\n\n" + targets + "\n\n" + provenance(quick, full)


# --- the blackboard and agent memory ---------------------------------------------------------


def _on_both(sqlite: bool, postgres: bool, busy: bool) -> str:
    if sqlite and postgres:
        return "met on both"
    if busy:
        return "not judged (busy machine)"
    if sqlite or postgres:
        return f"met on {'SQLite' if sqlite else 'PostgreSQL'} only"
    return "**not met**"


@renders
def board(results: Results) -> str:
    record = results("board", "python bench/board.py")
    f, slow = record["figures"], busy(record)
    awards, p99 = f["awards_per_s_sqlite"], f["p99_award_ms"]
    jct, search = f["board_jct_overhead"], f["memory_search_p99_ms"]
    search_pg = f["memory_search_p99_ms_postgres"]
    search_pg_analyzed = f["memory_search_p99_ms_postgres_analyzed"]
    pg_ok = search_pg is not None and search_pg < 10
    rows = [
        [
            "awards per second",
            num(awards, ",.0f"),
            num(f["awards_per_s_postgres"], ",.0f"),
            ">= 2,000 on SQLite: " + _at_least(awards, 2000, slow),
        ],
        [
            "p99 from post to award (offered 1,000 posts/s)",
            num(p99, ".2f", " ms"),
            num(f["p99_award_ms_postgres"], ".2f", " ms"),
            "< 20 ms: " + met(p99, p99 < 20, slow),
        ],
        [
            "mean JCT, board ÷ edges, wall clock",
            f"{num(jct, '.4f')} ({num(f['jct_board_s'], '.3f')} s ÷ "
            f"{num(f['jct_edges_s'], '.3f')} s)",
            "",
            "<= 1.02: " + _at_most(jct, 1.02, slow),
        ],
        [
            f"memory search p99, {f['memory_facts']:,} facts",
            num(search, ".2f", " ms"),
            f"{num(search_pg, '.2f', ' ms')} with no statistics, "
            f"{num(search_pg_analyzed, '.2f', ' ms')} after `ANALYZE`",
            "< 10 ms: " + _on_both(search < 10, pg_ok, slow),
        ],
    ]
    header = ["figure", "SQLite", "PostgreSQL", "target"]
    return table(header, rows, "lrrl") + "\n\n" + provenance(record)
