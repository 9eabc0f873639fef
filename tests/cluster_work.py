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
