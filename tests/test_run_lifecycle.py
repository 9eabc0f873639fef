"""How a run ends and how its mutations are heard, now that the engine finishes runs from
its loop: a complete run is never turned 'cancelled', mutations from outside are heard at
once, a removed running task is told before it leaves, and a mutation that ends the run
finishes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from orchestrator import Engine, Event, TaskContext, VirtualClock, Workflow
from orchestrator.durability._replay import rebuild
from orchestrator.model._errors import WorkflowStateError


def sleeps(seconds: float) -> Callable[[TaskContext], Awaitable[float]]:
    async def run(ctx: TaskContext) -> float:
        await ctx.clock.sleep(seconds)
        return seconds

    return run


async def boom() -> None:
    raise ValueError("bad")


def test_a_run_that_completes_at_submit_is_not_cancelled_by_leaving_the_engine(
    clock: VirtualClock,
) -> None:
    async def main() -> tuple[str, str]:
        async with Engine(clock=clock) as engine:
            empty = engine.submit(Workflow("empty"))
            with pytest.raises(WorkflowStateError):
                engine.cancel(empty.id)  # it is done; there is nothing to cancel
            left = engine.submit(Workflow("left at once"))
        return (await empty).status, (await left).status

    assert clock.run(main()) == ("succeeded", "succeeded")


def test_mutations_from_outside_a_task_are_heard_at_once(clock: VirtualClock) -> None:
    async def main() -> list[tuple[float, str]]:
        async with Engine(clock=clock) as engine:
            wf = Workflow("w")
            wf.add("slow", sleeps(10.0))
            wf.add("y", sleeps(1.0), after=["slow"])
            seen: list[tuple[float, str]] = []

            async def listen() -> None:
                async for event in engine.iter(wf):
                    seen.append((event.at, event.kind))

            listener = asyncio.create_task(listen())
            await clock.sleep(1.0)
            wf.add("x", sleeps(1.0), after=["slow"])
            wf.remove("y")
            await clock.sleep(0.5)
            heard = [(at, kind) for at, kind in seen if at == 1.0]
            await listener
            return heard

    assert clock.run(main()) == [
        (1.0, "task_added"),
        (1.0, "task_cancelled"),
        (1.0, "task_removed"),
    ]


def test_a_removed_running_task_is_told_cancelled_before_a_new_one_takes_its_id(
    clock: VirtualClock,
) -> None:
    async def main() -> list[Event]:
        async with Engine(clock=clock) as engine:
            wf = Workflow("w")
            wf.add("a", sleeps(10.0))
            events: list[Event] = []

            async def listen() -> None:
                async for event in engine.iter(wf):
                    events.append(event)

            listener = asyncio.create_task(listen())
            await clock.sleep(1.0)
            wf.remove("a")
            wf.add("a", sleeps(5.0))
            await listener
            return events

    events = clock.run(main())
    told = [(e.kind, getattr(e, "task", "")) for e in events if getattr(e, "task", "") == "a"]
    assert told == [
        ("task_added", "a"), ("task_ready", "a"), ("task_started", "a"),
        ("task_cancelled", "a"), ("task_removed", "a"),
        ("task_added", "a"), ("task_ready", "a"), ("task_started", "a"),
        ("task_succeeded", "a"),
    ]  # fmt: skip
    # Cut anywhere after the new task started: it is unfinished, never 'cancelled'.
    started_again = max(i for i, e in enumerate(events) if e.kind == "task_started")
    image = rebuild(events[: started_again + 1])
    assert image.tasks["a"].state == "running" and image.unfinished() == ["a"]
    assert rebuild(events).tasks["a"].result == 5.0


def test_an_edge_from_a_failed_task_that_skips_the_last_one_finishes_the_run(
    clock: VirtualClock,
) -> None:
    async def main() -> tuple[str, dict[str, str]]:
        from orchestrator import Limits

        async with Engine(clock=clock, limits={"local": Limits(max_in_flight=1)}) as engine:
            hog = Workflow("hog")
            hog.add("hold", sleeps(10.0))
            hog_run = engine.submit(hog)
            wf = Workflow("b")
            wf.add("f", boom, resource="tools")
            wf.add("t", sleeps(1.0))  # ready, waiting for the slot the hog holds
            run = engine.submit(wf)
            await clock.sleep(1.0)
            wf.add_edge("f", "t")  # f failed: t is skipped, nothing is left to run
            result = await asyncio.wait_for(run.result(), timeout=5.0)
            await hog_run
            return result.status, dict(result.skipped)

    assert clock.run(main()) == ("failed", {"t": "dependency 'f' failed"})


def test_a_deadline_is_watched_even_when_the_run_had_completed_at_submit(
    clock: VirtualClock,
) -> None:
    async def main() -> list[str]:
        async with Engine(clock=clock) as engine:
            wf = Workflow("w")
            kinds: list[str] = []
            run = engine.submit(wf, deadline=5.0)
            wf.add("late", sleeps(10.0))  # joins before the loop turns
            async for event in engine.events():
                kinds.append(event.kind)
                if event.kind == "workflow_finished":
                    break
            await run
            return kinds

    kinds = clock.run(main())
    assert "deadline_missed" in kinds
