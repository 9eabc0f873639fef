"""The blackboard: award throughput and latency on SQLite and PostgreSQL, and what the board
costs an agent workload on the simulated H100 against the same work wired as DAG edges.

1. Throughput: `agents` volunteers (two capability tags each out of 50, half bid by a rule)
   join one board; `posts` posts (one tag each) come from 200 concurrent posters; each claim
   answers at once, so posts, awards and answers all go through the store. Figures: awards
   per second (wall time of the whole run) and p99 from `post()` to the award's commit.
   Measured in wall time, on a shared machine: noisy.
   A second, open-loop run offers posts at a fixed rate (`PACED`): its p99 is the latency
   figure (a saturated closed loop measures only its own queue: 200 posters / throughput).
2. JCT: programs on one simulated H100 (Llama-3.1-8B): a planning call, four specialist
   calls, a summary call. "Edges": the specialists are tasks wired after the plan. "Board":
   a task posts the four requests from inside the workflow, specialists volunteer, each
   claim runs as a task of that workflow making the same call. Ratio of mean JCTs, twice:
   - wall time (`board_jct_overhead`, the figure): 12 programs arriving at `WALL_RATE` a
     second, the simulator on the system clock (its GPU steps are real sleeps), the board
     on a SQLite store (synchronous=FULL), so every commit and all the board's CPU time
     reach the JCT; run edges, board (and again, full size) alternately, mean per mode.
     The machine's load moves it by a few tenths of a percent between runs.
   - virtual time (`board_jct_overhead_virtual`): `programs` programs arriving at 0.5 a
     second on a virtual clock, the board on its in-process store. Virtual time stands
     still while Python runs, so this shows only structural overhead (extra tasks and
     hops in the DAG), never the board's CPU or storage time.

    python bench/board.py --quick     # about half a minute
    python bench/board.py             # 1,000 agents, 10,000 posts; about a minute

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _memory_search import measure as measure_memory  # noqa: E402

from agents import Board, BoardStore, Helper, Post  # noqa: E402
from executors import SimServer  # noqa: E402
from memory import SQLBoardStore, SQLStore  # noqa: E402
from orchestrator import (  # noqa: E402
    Clock,
    Engine,
    Limits,
    LLMRequest,
    Message,
    StoreError,
    SystemClock,
    TaskContext,
    VirtualClock,
    Workflow,
)

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
TAGS = [f"skill{i:02d}" for i in range(50)]
POSTERS = 200
PACED = 1000.0
"""Posts per second offered in the latency run."""
WALL_RATE = 2.0
"""Programs a second arriving in the wall-clock JCT runs (virtual time: 0.5)."""


def log(message: str, end: str = "\n") -> None:
    print(message, file=sys.stderr, flush=True, end=end)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


# --- 1. throughput ----------------------------------------------------------------------------


async def throughput(store: BoardStore, agents: int, posts: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    latencies: list[float] = []
    async with Board(store, clock=SystemClock(), lease=300) as board:
        for i in range(agents):
            caps = frozenset(rng.sample(TAGS, 2))
            weight = rng.random()
            bid: Callable[[Post], float] | None = (lambda post, w=weight: w) if i % 2 else None
            board.join(Helper(f"agent{i:04d}", caps, lambda post, ctx: "ok", bid))
        wanted = [rng.choice(TAGS) for _ in range(posts)]
        started = time.perf_counter()

        async def poster(k: int) -> None:
            for n in range(k, posts, POSTERS):
                t0 = time.perf_counter()
                await board.post({"n": n}, capabilities={wanted[n]}, poster=f"p{k}")
                latencies.append(time.perf_counter() - t0)

        async with asyncio.TaskGroup() as tg:
            for k in range(POSTERS):
                tg.create_task(poster(k))
        elapsed = time.perf_counter() - started
        awards, commits = board.stats.awards, board.stats.commits

        # Latency at an offered load (open loop): posts arrive at `PACED` per second,
        # released in 5 ms ticks, whether or not earlier ones were awarded yet.
        paced_latencies: list[float] = []

        async def timed(n: int) -> None:
            t0 = time.perf_counter()
            await board.post({"n": n}, capabilities={wanted[n % posts]}, poster="paced")
            paced_latencies.append(time.perf_counter() - t0)

        count = posts // 2
        async with asyncio.TaskGroup() as tg:
            start, sent = time.perf_counter(), 0
            while sent < count:
                due = min(count, int((time.perf_counter() - start) * PACED) + 1)
                for n in range(sent, due):
                    tg.create_task(timed(n))
                sent = due
                await asyncio.sleep(0.005)
    return {
        "awards": awards,
        "awards_per_s": awards / elapsed,
        "p50_award_ms": percentile(latencies, 0.50) * 1000,
        "p99_award_ms_saturated": percentile(latencies, 0.99) * 1000,
        "p50_award_ms_paced": percentile(paced_latencies, 0.50) * 1000,
        "p99_award_ms": percentile(paced_latencies, 0.99) * 1000,
        "commits": commits,
        "seconds": elapsed,
    }


async def on_sqlite(agents: int, posts: int, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        async with SQLStore(Path(folder) / "board.db") as sql:
            return await throughput(SQLBoardStore(sql), agents, posts, seed)


async def on_postgres(agents: int, posts: int, seed: int) -> dict[str, float] | None:
    schema = f"plait_bench_board_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        import asyncpg

        try:
            async with SQLStore(PG_URL, schema=schema) as sql:
                return await throughput(SQLBoardStore(sql), agents, posts, seed)
        finally:
            conn = await asyncpg.connect(PG_URL.replace("+asyncpg", ""))
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()
    except OSError as exc:
        log(f"PostgreSQL not reachable at {PG_URL}: {exc}")
        return None


# --- 2. JCT on the simulated H100 -------------------------------------------------------------

SPECIALISTS = ("sql", "charts", "stats", "prose")


def request(program: int, role: str, tokens: int, out: int) -> tuple[LLMRequest, int]:
    rng = random.Random(f"{program}/{role}")
    system = f"You are the {role} specialist. " + "context " * 200
    body = " ".join(f"w{rng.randrange(10_000)}" for _ in range(tokens // 2))
    messages = (Message("system", system), Message("user", body))
    return LLMRequest(messages, "m", max_tokens=out), out


def call(program: int, role: str, tokens: int, out: int) -> Callable[[TaskContext], Awaitable[str]]:
    async def run(ctx: TaskContext) -> str:
        req, expected = request(program, role, tokens, out)
        return (await ctx.complete(req, expected_output_tokens=expected)).text

    return run


async def jct(
    clock: Clock,
    programs: int,
    rate: float,
    seed: int,
    store: BoardStore | None,
    with_board: bool,
) -> float:
    """Mean JCT in `clock`'s seconds of `programs` arriving at `rate` a second (Poisson)."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(programs):
        t += rng.expovariate(rate)
        arrivals.append(t)
    done: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            SimServer("h100-llama3-8b", seed=seed, clock=clock)
        )
        limits = {"default": Limits(max_in_flight=256), "local": Limits(max_in_flight=100_000)}
        engine = Engine(backends={"default": server}, clock=clock, limits=limits)
        await stack.enter_async_context(engine)
        board: Board | None = None
        if with_board:
            board = await stack.enter_async_context(Board(store, clock=clock, lease=3600))
            for role in SPECIALISTS:

                async def serve(post: Post, ctx: TaskContext | None, role: str = role) -> str:
                    assert ctx is not None
                    return await call(post.content["program"], role, 1500, 250)(ctx)

                board.join(Helper(role, frozenset({role}), serve))

        def workflow(p: int) -> Workflow:
            wf = Workflow(f"job{p}")
            wf.add("plan", call(p, "planner", 600, 120))
            if board is not None:
                on = board

                async def delegate(ctx: TaskContext) -> list[Any]:
                    posts = [
                        await on.post(
                            {"program": p}, capabilities={role}, poster="planner", ctx=ctx
                        )
                        for role in SPECIALISTS
                    ]
                    return [await on.answer_of(post) for post in posts]

                wf.add("delegate", delegate, after=["plan"])
                wf.add("summary", call(p, "summary", 800, 150), after=["delegate"])
            else:
                for role in SPECIALISTS:
                    wf.add(role, call(p, role, 1500, 250), after=["plan"])
                wf.add("summary", call(p, "summary", 800, 150), after=list(SPECIALISTS))
            return wf

        started = clock.monotonic()

        async def one(p: int) -> None:
            await clock.sleep(max(0.0, started + arrivals[p] - clock.monotonic()))
            start = clock.monotonic()
            result = await engine.run(workflow(p))
            if not result.ok:
                raise RuntimeError(f"job{p} {result.status}: {dict(result.failures)}")
            done.append(clock.monotonic() - start)

        async with asyncio.TaskGroup() as tg:
            for p in range(programs):
                tg.create_task(one(p))
    return sum(done) / len(done)


def run_jct(programs: int, rate: float, seed: int, with_board: bool) -> float:
    """Mean JCT in virtual seconds: a fresh simulated H100 and clock for each mode; the
    board on its in-process store."""
    clock = VirtualClock()
    return clock.run(jct(clock, programs, rate, seed, None, with_board))


def run_jct_wall(programs: int, rate: float, seed: int, with_board: bool) -> float:
    """Mean JCT in wall seconds: the simulated H100 on the system clock (its GPU steps are
    real sleeps), the board on a SQLite store (synchronous=FULL) in a fresh file."""

    async def main() -> float:
        clock = SystemClock()
        if not with_board:
            return await jct(clock, programs, rate, seed, None, with_board)
        with tempfile.TemporaryDirectory() as folder:
            async with SQLStore(Path(folder) / "jct.db") as sql:
                return await jct(clock, programs, rate, seed, SQLBoardStore(sql), with_board)

    return asyncio.run(main())


async def _memory_on_postgres(facts: int) -> dict[str, Any] | None:
    try:
        return await measure_memory(PG_URL, facts=facts)
    except (OSError, StoreError) as exc:
        log(f"memory search on PostgreSQL skipped: {exc}")
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--seed", type=int, default=0)
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    agents, posts, programs = (200, 2000, 60) if args.quick else (1000, 10_000, 300)
    wall_programs, wall_pairs = (12, 1) if args.quick else (12, 2)
    figures: dict[str, Any] = {"agents": agents, "posts": posts}

    sqlite = asyncio.run(on_sqlite(agents, posts, args.seed))
    log(f"SQLite: {json.dumps(sqlite)}")
    postgres = asyncio.run(on_postgres(agents, posts, args.seed))
    log(f"PostgreSQL: {json.dumps(postgres)}")
    plain = run_jct(programs, 0.5, args.seed, with_board=False)
    boarded = run_jct(programs, 0.5, args.seed, with_board=True)
    log(f"JCT, simulated H100, {programs} programs, virtual time: edges {plain:.3f} s, ", end="")
    log(f"board {boarded:.3f} s")
    # Wall time: edges, board, edges, board..., so that a change in the machine's load
    # falls on both modes alike; each mode's figure is the mean of its runs.
    walls: dict[bool, list[float]] = {False: [], True: []}
    for with_board in (False, True) * wall_pairs:
        walls[with_board].append(run_jct_wall(wall_programs, WALL_RATE, args.seed, with_board))
    wall_plain, wall_boarded = (sum(walls[b]) / len(walls[b]) for b in (False, True))
    log(
        f"JCT, simulated H100, {wall_programs} programs, wall time: edges {walls[False]} s, "
        f"board {walls[True]} s"
    )

    figures.update(
        awards_per_s_sqlite=round(sqlite["awards_per_s"], 1),
        awards_per_s_postgres=None if postgres is None else round(postgres["awards_per_s"], 1),
        p99_award_ms=round(sqlite["p99_award_ms"], 2),
        p99_award_ms_postgres=None if postgres is None else round(postgres["p99_award_ms"], 2),
        jct_edges_s=round(wall_plain, 4),
        jct_board_s=round(wall_boarded, 4),
        board_jct_overhead=round(wall_boarded / wall_plain, 4),
        jct_edges_virtual_s=round(plain, 4),
        jct_board_virtual_s=round(boarded, 4),
        board_jct_overhead_virtual=round(boarded / plain, 4),
    )
    # Memory search over 100,000 facts (20,000 with --quick): bench/_memory_search.py.
    facts = 20_000 if args.quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        search = asyncio.run(measure_memory(str(Path(tmp) / "memory.db"), facts=facts))
    log(f"memory search, SQLite: {json.dumps(search)}")
    search_pg = asyncio.run(_memory_on_postgres(facts))
    log(f"memory search, PostgreSQL: {json.dumps(search_pg)}")
    figures.update(
        memory_facts=facts,
        memory_search_p99_ms=search["p99_ms"],
        memory_search_p99_ms_postgres=None if search_pg is None else search_pg["p99_ms"],
        memory_search_p99_ms_postgres_analyzed=(
            None if search_pg is None else search_pg.get("p99_ms_analyzed")
        ),
    )
    print(json.dumps(figures))
    _results.save("board", figures, parser, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
