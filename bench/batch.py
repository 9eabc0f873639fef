"""Batch mode: `plait batch run`'s planning, routing and deduplication against a naive client.

A document-analytics job (documents each asked several questions under one instruction
prefix, a few rows repeated; bench/workloads/batch.py `batch_rows`) runs on 4 simulated
replicas of h100-llama3-8b in virtual time, twice on fresh servers:

- naive: the rows in file order (question-major), every row sent at once, no hints,
  round-robin over the replicas: what a plain client of an OpenAI-compatible pool does;
- plait: the same rows through `orchestrator.batch` (the plan's order, sharers together,
  identical calls once), plait's prefix `Router` over the replicas under a `PrefixGrouper`
  (siblings wait until their prefix is cached); "router": the same without the grouper.

Figures: virtual wall time, prompt tokens the servers computed (not served from cache),
and the offline lower bound of prompt tokens: every distinct prompt's tokens, each full
block of a prefix computed once (an unlimited cache). Targets: plait >= 3x faster than
naive; prompt tokens <= 1.05x the bound.

Then the same kind of job as an OpenAI Batch API file on real vLLM servers (CPU build, the
tiny random model; bench/_batch_vllm.py): naive against `plait batch run` on two servers,
and on one server `plait batch run` against vLLM's own `run-batch` on the same file
(`vllm_speedup`, `vllm_run_batch_ratio`). It sets vLLM up the first time
(bench/vllm/setup.sh, several minutes); measure on a quiet machine. `--no-vllm` skips it.

    python bench/batch.py --quick    # 2,000 rows simulated; 120 on vLLM
    python bench/batch.py            # 10,000 rows simulated; 300 on vLLM

The last line of stdout is one JSON object (`sim_speedup`, `sim_prompt_tokens_vs_bound`...).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _harness import ideal_hit_share  # noqa: E402

from executors import PrefixGrouper, Router, SimServer  # noqa: E402
from orchestrator import Hints, Limits, VirtualClock  # noqa: E402
from orchestrator.batch import BatchJob, JsonlSink, Row, run_batch  # noqa: E402
from orchestrator.batch._rows import _plain_row  # noqa: E402
from workloads import batch_rows  # noqa: E402

PROFILE = "h100-llama3-8b"
REPLICAS = 4
MAX_IN_FLIGHT = 64  # per replica, both modes' servers batch what they are sent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def as_rows(raw: list[dict[str, object]]) -> list[Row]:
    return [_plain_row(i, item) for i, item in enumerate(raw)]


def servers(clock: VirtualClock) -> list[SimServer]:
    return [SimServer(PROFILE, seed=i, clock=clock, record=True) for i in range(REPLICAS)]


def figures(sims: list[SimServer]) -> dict[str, Any]:
    queried = sum(s.stats().prefix_cache_queries for s in sims)
    hits = sum(s.stats().prefix_cache_hits for s in sims)
    return {"prompt_tokens": queried, "computed_prompt_tokens": queried - hits,
            "cache_hit_share": hits / queried if queried else 0.0}  # fmt: skip


def bound(sims: list[SimServer]) -> int:
    """Prompt tokens an unlimited cache computes for the distinct prompts sent."""
    unique: dict[tuple[int, ...], tuple[float, int, list[int]]] = {}
    for s in sims:
        for at, tokens, hashes in s.recorded:
            unique.setdefault((tokens, *hashes), (at, tokens, hashes))
    records = list(unique.values())
    total = sum(tokens for _, tokens, _ in records)
    share = ideal_hit_share(records, sims[0].profile.block_size)
    return round(total * (1 - share))


def run_naive(rows: list[Row]) -> dict[str, Any]:
    clock = VirtualClock()

    async def main() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            sims = [await stack.enter_async_context(s) for s in servers(clock)]
            turn = itertools.cycle(sims)
            start = clock.monotonic()
            async with asyncio.TaskGroup() as tg:
                for row in rows:  # file order, all at once, round-robin, no hints
                    assert row.request is not None
                    tg.create_task(next(turn).complete(row.request, Hints(program_id="")))
            return {"wall_s": clock.monotonic() - start, **figures(sims)}

    return clock.run(main())


def run_plait(rows: list[Row], out: Path, *, group: bool = False) -> dict[str, Any]:
    clock = VirtualClock()

    async def main() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            sims = [await stack.enter_async_context(s) for s in servers(clock)]
            router = Router(  # its block and cache as the servers say them
                {f"replica{i}": s for i, s in enumerate(sims)},
                health_interval_s=None,
                clock=clock,
            )
            job = BatchJob(rows, JsonlSink(str(out)), max_running=4 * MAX_IN_FLIGHT * REPLICAS)
            summary = await run_batch(
                job,
                backends={"default": PrefixGrouper(router) if group else router},
                clock=clock,
                limits={"default": Limits(max_in_flight=MAX_IN_FLIGHT * REPLICAS)},
            )
            return {
                "wall_s": summary.wall_s,
                "failed": summary.failed,
                "deduplicated": summary.deduplicated,
                "plan": dict(summary.plan),
                "bound_prompt_tokens": bound(sims),
                **figures(sims),
            }

    return clock.run(main())


def simulator_section(documents: int, seed: int) -> dict[str, Any]:
    raw = batch_rows(documents, seed=seed)
    rows = as_rows(raw)
    log(f"simulator: {len(rows)} rows over {documents} documents, {REPLICAS} x {PROFILE}")
    started = time.perf_counter()
    naive = run_naive(rows)
    log(f"  naive done in {time.perf_counter() - started:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        plait = run_plait(rows, Path(tmp) / "out.jsonl")
        log(f"  plait done in {time.perf_counter() - started:.1f} s")
        grouped = run_plait(rows, Path(tmp) / "grouped.jsonl", group=True)
    lower = plait["bound_prompt_tokens"]
    print(f"{'mode':<8} {'virtual wall s':>14} {'prompt tok':>12} {'computed':>12} "
          f"{'cache hit':>9} {'vs bound':>8}")  # fmt: skip
    for name, r in (("naive", naive), ("router", plait), ("plait", grouped)):
        print(
            f"{name:<8} {r['wall_s']:>14.1f} {r['prompt_tokens']:>12,} "
            f"{r['computed_prompt_tokens']:>12,} {r['cache_hit_share']:>9.3f} "
            f"{r['computed_prompt_tokens'] / lower:>8.3f}"
        )
    print(f"{'bound':<8} {'':>14} {'':>12} {lower:>12,}")
    return {
        "sim_rows": len(rows),
        # plait batch mode: the plan's order, dedup, the prefix Router and PrefixGrouper
        # (siblings wait until their prefix is cached).
        "sim_speedup": round(naive["wall_s"] / grouped["wall_s"], 3),
        "sim_prompt_tokens_vs_bound": round(grouped["computed_prompt_tokens"] / lower, 4),
        # The same with PrefixGrouper over the router (siblings held until the prefix is in
        # cache): fewer prompt tokens computed, more time (they wait for their leader).
        "sim_grouped_speedup": round(naive["wall_s"] / grouped["wall_s"], 3),
        "sim_grouped_prompt_tokens_vs_bound": round(grouped["computed_prompt_tokens"] / lower, 4),
        "sim_naive_prompt_tokens_vs_bound": round(naive["computed_prompt_tokens"] / lower, 4),
        "sim_naive_wall_s": round(naive["wall_s"], 2),
        "sim_plait_wall_s": round(grouped["wall_s"], 2),
        "sim_naive_cache_hit": round(naive["cache_hit_share"], 4),
        "sim_plait_cache_hit": round(grouped["cache_hit_share"], 4),
        "sim_bound_prompt_tokens": lower,
        "sim_plait_failed_rows": plait["failed"],
        "sim_deduplicated": plait["deduplicated"],
        "sim_plan": plait["plan"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 rows instead of 10,000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-vllm", action="store_true", help="the simulator only (no real vLLM servers)"
    )
    parser.add_argument(
        "--vllm-documents",
        type=int,
        help="documents of the real-vLLM job, 6 questions each (default 50: 300 rows; 20 quick)",
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    documents = 200 if args.quick else 1000  # about 10 questions each
    results: dict[str, Any] = {"quick": args.quick, "seed": args.seed, "profile": PROFILE,
                               "replicas": REPLICAS}  # fmt: skip
    results.update(simulator_section(documents, args.seed))
    if not args.no_vllm:
        from _batch_vllm import cpu_flags, measure_vllm

        documents = args.vllm_documents or (20 if args.quick else 50)
        log(f"real vLLM (CPU): {documents} documents x 6 questions; CPU flags: {cpu_flags()}")
        with tempfile.TemporaryDirectory() as tmp:
            results.update(measure_vllm(Path(tmp), documents, 6, args.seed))
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(results, separators=(",", ":")))
    _results.save("batch", results, parser, args, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
