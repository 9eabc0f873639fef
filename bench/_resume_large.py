"""How long resuming a large run takes: a run of `tasks` tasks is stopped with half of them
done (the other half waits on a gate task), then a new engine resumes it from the store.

    python bench/_resume_large.py [--tasks 100000] [--store sqlite|postgres]

`resume_s` is from `engine.resume()` being called to the run going on again (read its log,
rebuild 100,000 tasks through the registry, start it): what a restart costs before work
resumes. `finish_s` adds running the remaining half to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from memory import SQLStore
from orchestrator import Engine, Event, Registry, TaskContext, Workflow

GATE: dict[str, asyncio.Event] = {}


def noop() -> int:
    return 1


async def quick(ctx: TaskContext) -> int:
    return 1


async def gate(ctx: TaskContext) -> str:
    event = GATE.get("open")
    if event is not None:
        await event.wait()
    return "open"


def build(tasks: int) -> Workflow:
    wf = Workflow("large")
    half = tasks // 2
    for i in range(half):
        wf.add(f"done {i}", quick)
    wf.add("gate", gate)
    for i in range(tasks - half - 1):
        wf.add(f"after {i}", quick, after=["gate"])
    return wf


async def stop_midway(store: SQLStore, tasks: int) -> str:
    """Run until the first half is done and committed, then stop as a crash does."""
    GATE["open"] = asyncio.Event()
    async with Engine(store=store) as engine:
        events: asyncio.Queue[Event] = asyncio.Queue()
        engine.bus.listen(events)
        wf = build(tasks)
        handle = engine.submit(wf)
        waiting = {("task_succeeded", f"done {tasks // 2 - 1}"), ("task_started", "gate")}
        while waiting:
            event = await events.get()
            waiting.discard((event.kind, getattr(event, "task", "")))
        assert engine.journal is not None
        await engine.journal.durable()
        run_id = handle.id
    return run_id


async def measure(store: SQLStore, tasks: int) -> dict[str, Any]:
    run_id = await stop_midway(store, tasks)
    GATE.pop("open", None)  # the resumed gate opens at once
    records = len(await store.events(run_id))
    async with Engine(store=store) as engine:
        started = time.perf_counter()
        report = await engine.resume(Registry(quick, gate))
        resumed = time.perf_counter() - started
        (handle,) = report.runs
        result = await handle
        finished = time.perf_counter() - started
    assert result.ok and len(result.results) == tasks, result.status
    return {
        "tasks": tasks,
        "events_read": records,
        "resume_s": round(resumed, 3),
        "finish_s": round(finished, 3),
    }


async def run(tasks: int, store_kind: str, url: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        target = url if store_kind == "postgres" and url else str(Path(tmp) / "large.db")
        schema = f"plait_resume_{int(time.time())}" if store_kind == "postgres" else None
        async with SQLStore(target, schema=schema) as store:
            try:
                return await measure(store, tasks)
            finally:
                if schema is not None:
                    await _drop(store, schema)


async def _drop(store: SQLStore, schema: str) -> None:
    import sqlalchemy as sa

    async with store.engines[0].begin() as conn:
        await conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--url", default=None, help="the PostgreSQL URL for --store postgres")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.tasks, args.store, args.url))))


if __name__ == "__main__":
    main()
