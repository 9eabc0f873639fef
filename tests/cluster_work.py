"""What the engines of tests/test_cluster.py may run (their `registry` module)."""

from __future__ import annotations

import asyncio
import os

from orchestrator import TaskContext


async def nap(ctx: TaskContext) -> str:
    """A step that takes a while (the workload: 1 to 4 x PLAIT_TEST_NAP seconds, by the
    run's random id), so that an engine killed mid-run leaves runs half done."""
    base = float(os.environ.get("PLAIT_TEST_NAP", "0.3"))
    await asyncio.sleep(base * (1 + int(ctx.workflow.id[-2:], 16) % 4))
    return f"{ctx.task_id} after {sorted(ctx.inputs)}"


async def hold(ctx: TaskContext) -> str:
    """Waits until the file PLAIT_TEST_GATE exists (the test opens the gate)."""
    gate = os.environ["PLAIT_TEST_GATE"]
    # The gate is a file another process writes: polled, as a task waits on outside work.
    while not os.path.exists(gate):  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.05)
    return "through"
