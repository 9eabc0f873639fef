"""`run_sync`: the one synchronous entry point, for scripts and notebooks' cells."""

from __future__ import annotations

import asyncio
from typing import Any

from ..admission._scheduler import PriorityClass
from ..model._clock import Clock, SystemClock
from ..model._workflow import Workflow
from ._engine import Engine
from ._run import RunResult


def run_sync(
    workflow: Workflow,
    *,
    clock: Clock | None = None,
    deadline: float | None = None,
    priority: PriorityClass = "batch",
    **engine_options: Any,
) -> RunResult:
    """Run one workflow to its end on a fresh event loop and return its `RunResult`.

    `engine_options` go to `Engine` (backends, policy, limits, ...). With a `VirtualClock`
    the run takes virtual time: it finishes as fast as the CPU allows.
    """
    clock = clock or SystemClock()

    async def main() -> RunResult:
        async with Engine(clock=clock, **engine_options) as engine:
            return await engine.run(workflow, deadline=deadline, priority=priority)

    with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
        return runner.run(main())
