"""LangGraph with and without its SQLite checkpointer, on the overhead benchmark's graphs.

The baseline side of ``bench/durability.py``: the same no-op task graphs as
``bench/overhead.py`` (built by ``_graphs``, compiled by ``_baselines._lg_compile``), run
once with no checkpointer and once with ``AsyncSqliteSaver`` writing to a fresh temporary
file. The difference is what durability costs LangGraph.

LangGraph pays in two units. Each *superstep* ends with one checkpoint (``aput``: the whole
channel state serialised into one row and committed), and each *node* that writes saves its
writes (``aput_writes``: one more commit). A step can run many nodes (fanout runs all its
middle nodes in one step), so the cost is reported per step and per node; see
:attr:`CheckpointCost.us_per_step` for which one a comparison with plait should use.

    python bench/_langgraph_durable.py --quick

Progress goes to stderr; stdout is one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, Literal

_BENCH = Path(__file__).resolve().parent
if str(_BENCH) not in sys.path:
    sys.path.insert(1, str(_BENCH))

from _baselines import _lg_compile  # noqa: E402
from _graphs import Graph, random_dag, scenario  # noqa: E402

Durability = Literal["sync", "async"]
"""LangGraph's modes that save every step. "async" (its default) saves a step's checkpoint
while the next step runs; "sync" waits for it first. "exit" saves only at the end, so it is
not durable per step and is not offered."""


@dataclass(frozen=True)
class CheckpointCost:
    """One scenario run plain and with the SQLite checkpointer (best of the repeats)."""

    nodes: int
    # Checkpoints written, one per superstep plus the input checkpoint LangGraph writes
    # before the first step: the unit its checkpointer pays for ("step" below).
    steps: int
    # Rows in the writes table, one or more per node. Each row repeats its channel's name,
    # and a join's channel is named after all its sources, so a fan-in of k nodes stores
    # k rows of O(k) bytes each: most of fanout's file.
    writes: int
    plain_s: float
    durable_s: float
    db_bytes: int  # the SQLite file after the connection closed (WAL folded in)
    checkpoint_bytes: int  # serialised checkpoints and their metadata
    writes_bytes: int  # serialised writes
    first_checkpoint_bytes: int  # the smallest and largest checkpoint row: a checkpoint
    last_checkpoint_bytes: int  # holds every channel's version, so it grows with the graph
    # Bytes each step adds to its thread's later checkpoints (last minus first checkpoint
    # over the steps between them, summed over threads).
    checkpoint_growth_bytes_per_step: float

    @property
    def added_s(self) -> float:
        return self.durable_s - self.plain_s

    @property
    def us_per_step(self) -> float:
        """Added microseconds per checkpoint, the issue's ``langgraph_checkpoint_us_per_step``.

        On a chain a step is a node, and the two figures agree; on a wide graph one step
        carries many nodes' writes, so per step overstates LangGraph's cost next to a
        per-task figure. plait has no supersteps, so the like-for-like comparison with
        plait's ``added_us_per_task`` is :attr:`us_per_node`.
        """
        return self.added_s / self.steps * 1e6

    @property
    def us_per_node(self) -> float:
        return self.added_s / self.nodes * 1e6

    @property
    def bytes_per_step(self) -> float:
        return self.db_bytes / self.steps

    @property
    def bytes_per_node(self) -> float:
        return self.db_bytes / self.nodes

    def as_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "steps": self.steps,
            "writes": self.writes,
            "plain_s": round(self.plain_s, 6),
            "durable_s": round(self.durable_s, 6),
            "plain_us_per_node": round(self.plain_s / self.nodes * 1e6, 1),
            "durable_us_per_node": round(self.durable_s / self.nodes * 1e6, 1),
            "plain_us_per_step": round(self.plain_s / self.steps * 1e6, 1),
            "durable_us_per_step": round(self.durable_s / self.steps * 1e6, 1),
            "checkpoint_us_per_step": round(self.us_per_step, 1),
            "checkpoint_us_per_node": round(self.us_per_node, 1),
            "db_bytes": self.db_bytes,
            "bytes_per_step": round(self.bytes_per_step, 1),
            "bytes_per_node": round(self.bytes_per_node, 1),
            "checkpoint_bytes": self.checkpoint_bytes,
            "writes_bytes": self.writes_bytes,
            "first_checkpoint_bytes": self.first_checkpoint_bytes,
            "last_checkpoint_bytes": self.last_checkpoint_bytes,
            "checkpoint_growth_bytes_per_step": round(self.checkpoint_growth_bytes_per_step, 1),
        }


def _configs(graphs: list[Graph]) -> list[dict[str, Any]]:
    # One thread per workflow, as a service would run them. Pregel counts supersteps and a
    # chain of n tasks needs n of them; the default limit (25) would abort long graphs.
    return [
        {"configurable": {"thread_id": f"wf{j}"}, "recursion_limit": len(g) + 10}
        for j, g in enumerate(graphs)
    ]


async def _invoke_all(apps: list[Any], graphs: list[Graph], durability: Durability | None) -> float:
    configs = _configs(graphs)
    # Without a checkpointer LangGraph warns that ``durability`` has no effect, and with
    # "sync" it fails (AttributeError: no '_put_checkpoint_fut', langgraph 1.2), so the
    # plain run leaves it out.
    extra = {} if durability is None else {"durability": durability}
    gc.collect()  # do not charge the previous run's garbage to this one
    start = perf_counter()
    await asyncio.gather(
        *(app.ainvoke({"x": 0}, config, **extra) for app, config in zip(apps, configs, strict=True))
    )
    return perf_counter() - start


async def _plain(graphs: list[Graph]) -> float:
    apps = [_lg_compile(g) for g in graphs]  # compile is not timed, as in overhead.py
    return await _invoke_all(apps, graphs, None)


async def _durable(
    graphs: list[Graph], durability: Durability, db: Path
) -> tuple[float, dict[str, int]]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        # Creating the tables is a one-off cost of opening a store, like Engine start-up.
        await saver.setup()
        apps = [_lg_compile(g, saver) for g in graphs]
        run_s = await _invoke_all(apps, graphs, durability)
        async with saver.conn.execute(
            "SELECT COUNT(*), SUM(LENGTH(checkpoint) + LENGTH(metadata)),"
            " MIN(LENGTH(checkpoint) + LENGTH(metadata)),"
            " MAX(LENGTH(checkpoint) + LENGTH(metadata)) FROM checkpoints"
        ) as cur:
            steps, cp_bytes, first, last = await cur.fetchone() or (0, 0, 0, 0)
        async with saver.conn.execute("SELECT COUNT(*), SUM(LENGTH(value)) FROM writes") as cur:
            writes, w_bytes = await cur.fetchone() or (0, 0)
        # How much each step adds to every later checkpoint of its thread: each checkpoint
        # holds all channel versions seen so far, so a thread's store grows quadratically.
        async with saver.conn.execute(
            "SELECT SUM(hi - lo), SUM(n - 1) FROM (SELECT thread_id,"
            " MAX(LENGTH(checkpoint)) AS hi, MIN(LENGTH(checkpoint)) AS lo, COUNT(*) AS n"
            " FROM checkpoints GROUP BY thread_id)"
        ) as cur:
            grown, gaps = await cur.fetchone() or (0, 0)
    stats = {
        "steps": steps,
        "writes": writes,
        "checkpoint_bytes": cp_bytes or 0,
        "writes_bytes": w_bytes or 0,
        "first": first or 0,
        "last": last or 0,
        "grown": grown or 0,
        "gaps": gaps or 0,
    }
    return run_s, stats


async def _measure(
    graphs: list[Graph], durability: Durability, dbs: list[Path]
) -> tuple[list[float], list[float], dict[str, int]]:
    plain_runs: list[float] = []
    durable_runs: list[float] = []
    stats: dict[str, int] = {}
    for db in dbs:
        # Alternate the two so drift in machine load hits both alike.
        plain_runs.append(await _plain(graphs))
        run_s, stats = await _durable(graphs, durability, db)
        durable_runs.append(run_s)
    return plain_runs, durable_runs, stats


def _store_bytes(db: Path) -> int:
    # Closing the last connection folds the WAL into the main file; count any leftover
    # WAL too, so the size is what the store really occupies.
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def langgraph_checkpoint_cost(
    graphs: list[Graph], *, durability: Durability = "async", repeat: int = 1
) -> CheckpointCost:
    """Run ``graphs`` together through LangGraph, plain and with ``AsyncSqliteSaver``.

    ``graphs`` is a scenario as in ``_baselines``: one graph, or many small ones started at
    once (one thread each, sharing one saver and its connection). Each repeat writes a
    fresh temporary file (a thread id already in a store would resume, not start); times
    are the best of the repeats, sizes those of the last file. Compiling and creating the
    tables are not timed. Raises ImportError without the bench extra.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    with tempfile.TemporaryDirectory(prefix="lg-ckpt-") as tmp:
        dbs = [Path(tmp) / f"ckpt{i}.sqlite" for i in range(repeat)]
        plain_runs, durable_runs, stats = asyncio.run(_measure(graphs, durability, dbs))
        db_bytes = _store_bytes(dbs[-1])
    return CheckpointCost(
        nodes=sum(len(g) for g in graphs),
        steps=stats["steps"],
        writes=stats["writes"],
        plain_s=min(plain_runs),
        durable_s=min(durable_runs),
        db_bytes=db_bytes,
        checkpoint_bytes=stats["checkpoint_bytes"],
        writes_bytes=stats["writes_bytes"],
        first_checkpoint_bytes=stats["first"],
        last_checkpoint_bytes=stats["last"],
        checkpoint_growth_bytes_per_step=stats["grown"] / max(stats["gaps"], 1),
    )


# ---------------------------------------------------------------------------- command

# LangGraph costs about 0.3-1 ms per node plain and a few times that durable, and a
# chain's checkpoints grow with its length (every channel's version is in each one), so
# these stay well below overhead.py's LangGraph sizes to keep a run short on 2 cores.
SIZES: dict[str, dict[str, int | tuple[int, int]]] = {
    "quick": {"chain": 200, "fanout": 200, "dag": 400, "concurrent": (40, 10)},
    "full": {"chain": 1_000, "fanout": 1_000, "dag": 2_000, "concurrent": (100, 10)},
}


def _saver_installed() -> bool:
    try:
        importlib.import_module("langgraph.checkpoint.sqlite.aio")
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller graphs (a few seconds)")
    parser.add_argument("--durability", choices=["async", "sync", "both"], default="both")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random DAGs")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per graph")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not _saver_installed():
        print(
            "_langgraph_durable.py: error: langgraph-checkpoint-sqlite not installed; run "
            "`make bench` (installs the bench extra) or pip install -e '.[bench]'",
            file=sys.stderr,
        )
        raise SystemExit(2)

    started = perf_counter()
    modes: list[Durability] = ["async", "sync"] if args.durability == "both" else [args.durability]
    # The first calls pay for imports and code-path warm-up that a service would not.
    langgraph_checkpoint_cost([random_dag(50, 0)], durability=modes[0])
    out: dict[str, Any] = {}
    for mode in modes:
        graphs: dict[str, dict[str, Any]] = {}
        for kind, size in SIZES["quick" if args.quick else "full"].items():
            print(f"  {mode:<5} {kind:<10} {size} ...", file=sys.stderr, flush=True)
            cost = langgraph_checkpoint_cost(
                scenario(kind, size, args.seed), durability=mode, repeat=args.repeat
            )
            graphs[kind] = cost.as_json()

        def mean(field: str, graphs: dict[str, dict[str, Any]] = graphs) -> float:
            return round(statistics.fmean(g[field] for g in graphs.values()), 1)

        out[mode] = {
            "checkpoint_us_per_step": mean("checkpoint_us_per_step"),
            "checkpoint_us_per_node": mean("checkpoint_us_per_node"),
            "bytes_per_step": mean("bytes_per_step"),
            "bytes_per_node": mean("bytes_per_node"),
            "graphs": graphs,
        }
    # Headline: LangGraph's default mode ("async"), what its users get unless they ask.
    # The means over graphs follow overhead.py; the per-step one is dominated by the wide
    # graphs (fanout's 1,000 nodes run in 5 steps), hence the per-node one beside it.
    head = out[modes[0]]
    summary = {
        "langgraph_checkpoint_us_per_step": head["checkpoint_us_per_step"],
        "langgraph_checkpoint_us_per_node": head["checkpoint_us_per_node"],
        "langgraph_bytes_per_step": head["bytes_per_step"],
        "langgraph_bytes_per_node": head["bytes_per_node"],
        "durability": modes[0],
        "quick": args.quick,
        "seed": args.seed,
        "sizes": SIZES["quick" if args.quick else "full"],
        "modes": out,
    }
    print(f"total wall time: {perf_counter() - started:.1f} s", file=sys.stderr)
    print(json.dumps(summary, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
