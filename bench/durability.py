"""What durability costs: the overhead graphs run by plait in memory and with a store (SQLite,
PostgreSQL), and by LangGraph without and with its SQLite checkpointer, side by side.

    python bench/durability.py --quick
    python bench/durability.py --only sqlite,postgres

A table goes to stdout, progress to stderr, and the last line of stdout is one JSON object:
`added_us_per_task_sqlite` / `added_us_per_task_postgres` (durable minus in-memory time per
task, same graphs, same process), `langgraph_checkpoint_us_per_step` and `..._per_node`
(checkpointer minus plain), `store_bytes_per_task_sqlite` and `..._after_compaction`
(bench/compaction.py on the same graphs), and `resume_100k_s`: how long `engine.resume()`
takes to put a stopped 100,000-task run (half of it done) back to work, on SQLite
(bench/_resume_large.py; `--resume-tasks` changes the size, 0 skips it). With SQLite it also
runs one agent tool loop of 80 and one of 160 turns (each tool result 1 KB) and reports the
bytes they store: `loop_bytes_per_turn` (at 160 turns) and `loop_bytes_ratio_160_80` (2.0 is
linear in the turns, 4.0 quadratic; the target is at most 2.2).

Each figure is the best of `--repeat` runs; the in-memory and durable runs of one graph
alternate so that a busy machine slows both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _graphs import Graph, scenario  # noqa: E402
from overhead import plait_workflow  # noqa: E402

PG_URL = os.environ.get("PLAIT_BENCH_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
SIZES = {
    "quick": {"chain": 1_000, "fanout": 1_000, "dag": 5_000, "concurrent": (100, 10)},
    "full": {"chain": 5_000, "fanout": 5_000, "dag": 50_000, "concurrent": (500, 10)},
}
LANGGRAPH_SIZES = {
    "quick": {"chain": 200, "fanout": 200, "dag": 400, "concurrent": (40, 10)},
    "full": {"chain": 1_000, "fanout": 1_000, "dag": 2_000, "concurrent": (100, 10)},
}


def _workflows(graphs: list[Graph]) -> list[Any]:
    from orchestrator import Workflow

    return [plait_workflow(Workflow, g, f"wf{j}") for j, g in enumerate(graphs)]


@dataclass
class Run:
    seconds: float
    tasks: int
    store_bytes: int | None = None


async def _run(graphs: list[Graph], store_kind: str | None) -> Run:
    from memory import SQLStore
    from orchestrator import Engine

    workflows = _workflows(graphs)
    tasks = sum(len(g) for g in graphs)
    store = None
    tmp = None
    schema = None
    if store_kind == "sqlite":
        tmp = tempfile.TemporaryDirectory()
        store = SQLStore(Path(tmp.name) / "plait.db")
    elif store_kind == "postgres":
        schema = f"plait_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        store = SQLStore(PG_URL, schema=schema)
    try:
        if store is not None:
            await store.open()
        async with Engine(store=store) as engine:  # start-up untimed, as in overhead.py
            start = perf_counter()
            results = await asyncio.gather(*(engine.run(wf) for wf in workflows))
            seconds = perf_counter() - start
        bad = [r.status for r in results if r.status != "succeeded"]
        if bad:
            raise RuntimeError(f"{len(bad)} workflow(s) did not succeed")
        size = None
        if store is not None:
            stats = await store.size()
            size = stats.event_bytes + stats.payload_bytes
        return Run(seconds, tasks, size)
    finally:
        if store is not None:
            await store.close()
        if schema is not None:
            await _drop_schema(schema)
        if tmp is not None:
            tmp.cleanup()


async def _drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_URL.replace("+asyncpg", ""))
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def measure_plait(
    stores: list[str], quick: bool, seed: int, repeat: int
) -> dict[str, dict[str, Any]]:
    """Per graph: us per task in memory and with each store (best of `repeat`)."""
    out: dict[str, dict[str, Any]] = {}
    for kind, size in SIZES["quick" if quick else "full"].items():
        graphs = scenario(kind, size, seed)
        best: dict[str, float] = {}
        bytes_per_task: dict[str, float] = {}
        for _ in range(repeat):
            for mode in [None, *stores]:
                print(f"plait {kind} {size} {mode or 'memory'}", file=sys.stderr)
                run = asyncio.run(_run(graphs, mode))
                key = mode or "memory"
                us = run.seconds / run.tasks * 1e6
                best[key] = min(best.get(key, us), us)
                if run.store_bytes is not None:
                    bytes_per_task[key] = run.store_bytes / run.tasks
        out[kind] = {
            "size": size,
            "us_per_task": best,
            "added_us_per_task": {m: best[m] - best["memory"] for m in stores},
            "store_bytes_per_task": bytes_per_task,
        }
    return out


def measure_langgraph(quick: bool, seed: int, repeat: int) -> dict[str, Any] | None:
    try:
        from _langgraph_durable import langgraph_checkpoint_cost
    except ImportError as exc:
        print(f"langgraph unavailable, reporting null: {exc}", file=sys.stderr)
        return None
    per: dict[str, Any] = {}
    for kind, size in LANGGRAPH_SIZES["quick" if quick else "full"].items():
        print(f"langgraph {kind} {size}", file=sys.stderr)
        try:
            cost = langgraph_checkpoint_cost(scenario(kind, size, seed), repeat=repeat)
        except Exception as exc:  # a missing saver package: one null, not a traceback
            print(f"langgraph checkpointer unavailable, reporting null: {exc}", file=sys.stderr)
            return None
        per[kind] = {
            "size": size,
            "us_per_step": cost.us_per_step,
            "us_per_node": cost.us_per_node,
            "bytes_per_node": cost.bytes_per_node,
        }
    return per


def measure_compaction(quick: bool, seed: int) -> float | None:
    """Stored bytes per finished task once compacted (SQLite), on the durability graphs."""
    from compaction import measure as compact

    per_task = []
    for kind, size in SIZES["quick" if quick else "full"].items():
        print(f"compaction {kind} {size}", file=sys.stderr)
        per_task.append(asyncio.run(compact(scenario(kind, size, seed), "sqlite")).per_task[1])
    return round(statistics.fmean(per_task), 1)


LOOP_TURNS = (80, 160)
LOOP_RESULT_BYTES = 1024


async def _loop_bytes(turns: int) -> int:
    """Event and payload bytes one agent loop of `turns` turns stores on SQLite: each turn
    but the last calls a tool that returns LOOP_RESULT_BYTES of text."""
    from agents import Agent, LoopLimits, tool
    from executors import FunctionLLM
    from memory import SQLStore
    from orchestrator import Engine, LLMRequest, LLMResponse, ToolCall, Usage, Workflow

    @tool
    def page(number: int) -> str:
        """A page of the book.

        Args:
            number: the page
        """
        return f"{number:08d}".ljust(LOOP_RESULT_BYTES, "x")

    def reply(request: LLMRequest, hints: object) -> LLMResponse | str:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < turns - 1:
            call = ToolCall(f"call{done}", "page", json.dumps({"number": done}))
            return LLMResponse("", Usage(20, 5), "tool_calls", (call,))
        return f"read {done} pages"

    agent = Agent("reader", "You read the book a page at a time.", tools=(page,))
    with tempfile.TemporaryDirectory() as tmp:
        async with SQLStore(Path(tmp) / "plait.db") as store:
            async with Engine(backends={"default": FunctionLLM(reply)}, store=store) as engine:
                wf = Workflow("loop")
                agent.solve(wf, "answer", "Read the book.", limits=LoopLimits(max_turns=turns))
                result = await engine.run(wf)
            if result.status != "succeeded":
                raise RuntimeError(f"the {turns}-turn loop failed: {result.failures}")
            stats = await store.size()
    return stats.event_bytes + stats.payload_bytes


def measure_loop() -> dict[str, Any]:
    """Stored bytes of agent loops of LOOP_TURNS turns: per turn, and how they grow."""
    stored = {}
    for turns in LOOP_TURNS:
        print(f"agent loop of {turns} turns", file=sys.stderr)
        stored[turns] = asyncio.run(_loop_bytes(turns))
    short, long = LOOP_TURNS
    return {
        "turns": list(LOOP_TURNS),
        "result_bytes": LOOP_RESULT_BYTES,
        "bytes": [stored[t] for t in LOOP_TURNS],
        "bytes_per_turn": round(stored[long] / long, 1),
        "ratio": round(stored[long] / stored[short], 3),
    }


def measure_resume(tasks: int) -> dict[str, float]:
    from _resume_large import run as resume_large

    print(f"resume of a {tasks}-task run", file=sys.stderr)
    result: dict[str, float] = asyncio.run(resume_large(tasks, "sqlite", None))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller graphs (about a minute)")
    parser.add_argument("--only", default="sqlite,postgres,langgraph", help="what to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per graph")
    parser.add_argument(
        "--resume-tasks", type=int, default=100_000, help="size of the run resumed (0: skip)"
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {"sqlite", "postgres", "langgraph"}
    if unknown:
        parser.error(f"--only takes sqlite, postgres, langgraph; not {', '.join(sorted(unknown))}")
    stores = [s for s in ("sqlite", "postgres") if s in only]
    plait = measure_plait(stores, args.quick, args.seed, args.repeat)
    langgraph = (
        measure_langgraph(args.quick, args.seed, args.repeat) if "langgraph" in only else None
    )

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 1) if values else None

    print(f"{'graph':<11}{'memory us':>11}" + "".join(f"{s + ' +us':>14}" for s in stores))
    for kind, row in plait.items():
        added = "".join(f"{row['added_us_per_task'][s]:>14.1f}" for s in stores)
        print(f"{kind:<11}{row['us_per_task']['memory']:>11.1f}{added}")
    if langgraph:
        for kind, row in langgraph.items():
            print(
                f"langgraph {kind:<11} +{row['us_per_step']:.0f} us/step "
                f"+{row['us_per_node']:.0f} us/node {row['bytes_per_node']:.0f} B/node"
            )
    added = {s: mean([r["added_us_per_task"][s] for r in plait.values()]) for s in stores}
    lg_node = mean([r["us_per_node"] for r in langgraph.values()]) if langgraph else None
    lg_step = mean([r["us_per_step"] for r in langgraph.values()]) if langgraph else None
    sqlite_added = added.get("sqlite")
    compacted = measure_compaction(args.quick, args.seed) if "sqlite" in stores else None
    loop = measure_loop() if "sqlite" in stores else None
    if loop is not None:
        print(
            f"agent loop  {loop['bytes_per_turn']:.0f} B/turn, "
            f"{loop['turns'][1]} vs {loop['turns'][0]} turns x{loop['ratio']:.2f}"
        )
    resume = measure_resume(args.resume_tasks) if args.resume_tasks else None
    summary = {
        "added_us_per_task_sqlite": sqlite_added,
        "added_us_per_task_postgres": added.get("postgres"),
        "langgraph_checkpoint_us_per_step": lg_step,
        "langgraph_checkpoint_us_per_node": lg_node,
        "langgraph_vs_plait_sqlite_per_node": (
            round(lg_node / sqlite_added, 1) if lg_node and sqlite_added else None
        ),
        "store_bytes_per_task_sqlite": mean(
            [r["store_bytes_per_task"]["sqlite"] for r in plait.values()]
        )
        if "sqlite" in stores
        else None,
        "store_bytes_per_task_after_compaction": compacted,
        "loop_bytes_per_turn": loop["bytes_per_turn"] if loop else None,
        "loop_bytes_ratio_160_80": loop["ratio"] if loop else None,
        "loop": loop,
        "resume_100k_s": resume["resume_s"] if resume and resume["tasks"] == 100_000 else None,
        "resume": resume,
        "quick": args.quick,
        "plait": plait,
        "langgraph": langgraph,
    }
    print(json.dumps(summary))
    _results.save("durability", summary, parser, args, argv)


if __name__ == "__main__":
    main()
