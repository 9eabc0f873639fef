"""Events per second appended through the journal to SQLite and to PostgreSQL.

A task is four events (added, ready, started, succeeded with a small result), the shape the
engine writes. Two ways of writing:

- stream: the caller appends and only waits for room (the journal's bound), then waits once
  for everything at the end: the journal's best case, one commit per writer pass;
- per-task: `--concurrency` tasks at a time each append their four events and await
  `durable()` before the next, as a task handing its result to dependents would.

Prints one line per store and mode, then one JSON line with every figure.
Usage: python bench/store_append.py [--quick] [--tasks N] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _results

from memory import SQLStore
from orchestrator.durability._journal import Journal

RESULT = {"text": "a short answer " * 8, "usage": {"prompt": 120, "completion": 30}}


def task_events(workflow: str, i: int) -> list[tuple[str, dict[str, Any]]]:
    task = f"t{i}"
    return [
        ("task_added", {"workflow": workflow, "task": task, "action": "llm:answer", "after": []}),
        ("task_ready", {"workflow": workflow, "task": task}),
        ("task_started", {"workflow": workflow, "task": task, "attempt": 1}),
        ("task_succeeded", {"workflow": workflow, "task": task, "result": RESULT}),
    ]


async def stream(journal: Journal, tasks: int, workflows: int) -> None:
    for i in range(tasks):
        workflow = f"w{i % workflows}"
        for kind, data in task_events(workflow, i):
            await journal.room()
            journal.append(workflow, kind, float(i), data)
    await journal.durable()


async def per_task(journal: Journal, tasks: int, concurrency: int) -> None:
    async def worker(w: int) -> None:
        workflow = f"w{w}"
        for i in range(w, tasks, concurrency):
            await journal.room()
            for kind, data in task_events(workflow, i):
                journal.append(workflow, kind, float(i), data)
            await journal.durable()

    async with asyncio.TaskGroup() as tg:
        for w in range(concurrency):
            tg.create_task(worker(w))


async def measure(store: SQLStore, mode: str, tasks: int, concurrency: int) -> dict[str, Any]:
    async with store:
        journal = Journal(store)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            start = time.perf_counter()
            if mode == "stream":
                await stream(journal, tasks, workflows=concurrency)
            else:
                await per_task(journal, tasks, concurrency)
            elapsed = time.perf_counter() - start
            await journal.close()
        stats = journal.stats
    events = tasks * 4
    return {
        "events_per_s": round(events / elapsed),
        "us_per_task": round(elapsed / tasks * 1e6, 1),
        "events_per_commit": round(stats.committed / max(stats.commits, 1), 1),
    }


async def drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    await conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 tasks instead of 20,000")
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--postgres", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure_all(args))
    print(json.dumps(figures))
    _results.save("store_append", figures, parser, args, argv, ignore=("postgres",))


async def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    tasks = args.tasks or (2_000 if args.quick else 20_000)
    figures: dict[str, Any] = {"tasks": tasks, "events_per_task": 4}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("stream", "per_task"):
            for sync in ("FULL", "NORMAL"):
                path = Path(tmp) / f"{mode}-{sync}.db"
                store = SQLStore(path, synchronous=sync)  # type: ignore[arg-type]
                result = await measure(store, mode, tasks, args.concurrency)
                figures[f"sqlite_{sync.lower()}_{mode}"] = result
                print(f"sqlite synchronous={sync:6} {mode:8}: {result}", flush=True)
            schema = f"plait_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            try:
                result = await measure(
                    SQLStore(args.postgres, schema=schema), mode, tasks, args.concurrency
                )
            finally:
                await drop_schema(args.postgres, schema)
            figures[f"postgres_{mode}"] = result
            print(f"postgres                 {mode:8}: {result}", flush=True)
    return figures


if __name__ == "__main__":
    main()
