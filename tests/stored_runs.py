"""Whole runs written to a store the way the engine writes them (through the journal), from
the golden log of tests/test_replay.py: tasks added at run time, a retry, a failure, a skip,
a removed task. For retention, compaction and `plait runs` tests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from orchestrator import EVENT_ADAPTER
from orchestrator.durability._journal import Journal
from orchestrator.ext import RunImage, Store, WorkflowRow, WorkflowStatus, read_events, rebuild

GOLDEN = Path(__file__).parent / "golden" / "replay_run.jsonl"

BIG_ERROR = "ConnectionError: " + "the first try fails " * 200
"""A retry's error over the inline limit: its payload is referenced by task_retrying only."""
BIG_RESULT = "written " * 500
"""A result over the inline limit: its payload is referenced by task_succeeded."""


def golden_events(workflow: str, *, big: bool = False) -> list[dict[str, Any]]:
    """The golden run's events as the journal takes them, renamed to `workflow`; `big` puts
    a large retry error and a large result in them."""
    events = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    for event in events:
        event["workflow"] = workflow
        if big and event["kind"] == "task_retrying":
            event["error"] = BIG_ERROR
        if big and event["kind"] == "task_succeeded" and event["task"] == "write":
            event["result"] = BIG_RESULT
    return events


async def put_run(
    store: Store,
    workflow: str,
    *,
    status: WorkflowStatus = "failed",
    created: float = 1.0,
    finished: float | None = 2.0,
    big: bool = False,
    name: str = "replayed",
) -> int:
    """Write the golden run as `workflow` (status "failed", as it ended); an unfinished
    status leaves out its workflow_finished. Returns how many events were written."""
    events = golden_events(workflow, big=big)
    done = status in ("succeeded", "failed", "cancelled")
    if not done:
        events = events[:-1]
        finished = None
    journal = Journal(store)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(journal.run())
        for event in events:
            journal.append(workflow, event["kind"], event["at"], event)
        journal.upsert(
            WorkflowRow(
                id=workflow,
                name=name,
                status=status,
                created=created,
                updated=finished or created,
                finished=finished,
            )
        )
        await journal.close()
    return len(events)


async def stored_image(store: Store, workflow: str) -> RunImage:
    events = [EVENT_ADAPTER.validate_python(d) for d in await read_events(store, workflow)]
    return rebuild(events)


def same_run(image: RunImage) -> RunImage:
    """The image with its event count left out: the one thing compaction changes."""
    image.events = 0
    return image
