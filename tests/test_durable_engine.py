"""An engine with a store: every event of every run is in the store's log, in order, and a
run's result is handed back once its last event is committed. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MemoryStore, StoreFactory

from agents import Agent
from executors import FunctionLLM, echo
from orchestrator import (
    EVENT_ADAPTER,
    Engine,
    StoreError,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.durability._replay import rebuild
from orchestrator.ext import Store, read_events

writer = Agent("writer", "You write.")


async def plan(ctx: TaskContext) -> int:
    for i in range(3):
        ctx.workflow.add(f"part {i}", writer.ask(f"Part {i}"), before=["join"])
    return 3


async def join(ctx: TaskContext) -> str:
    return " / ".join(str(v) for k, v in sorted(ctx.inputs.items()) if k != "plan")


def build(name: str = "durable") -> Workflow:
    wf = Workflow(name)
    wf.add("plan", plan)
    wf.add("join", join, after=["plan"])
    return wf


async def stored_image(store: Store, workflow: str) -> object:
    events = [EVENT_ADAPTER.validate_python(d) for d in await read_events(store, workflow)]
    return rebuild(events)


# A store does real I/O (a driver's thread, a socket), which a VirtualClock would jump over:
# these tests run on the system clock, and wait on events, never on time.


def test_a_durable_run_is_in_the_store_when_it_returns(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            llm = FunctionLLM(echo)
            async with Engine(backends={"default": llm}, store=store) as engine:
                first = await engine.run(build())
                second = await engine.run(build())
                # Returned: its last event is committed, before the engine closes.
                row = await store.workflow(first.workflow)
                assert row is not None and row.status == "succeeded" and row.name == "durable"
            assert first.workflow != second.workflow  # ids are unique in the store for good
            assert first.workflow.startswith("durable-")
            for result in (first, second):
                image = await stored_image(store, result.workflow)
                assert image.status == "succeeded"  # type: ignore[attr-defined]
                assert image.results() == dict(result.results)  # type: ignore[attr-defined]
                assert len(image.tasks) == 5  # type: ignore[attr-defined]
            records = await store.events(first.workflow)
            assert [r.seq for r in records] == list(range(1, len(records) + 1))
            assert records[0].kind == "workflow_started"
            assert records[-1].kind == "workflow_finished"
            assert await store.unfinished() == []

    asyncio.run(main())


def test_a_run_the_engine_left_unfinished_stays_unfinished_in_the_store(
    make_store: StoreFactory,
) -> None:
    """What an engine had committed when it stopped mid-run is what a resume starts from."""

    async def main() -> None:
        started = asyncio.Event()

        async def slow(ctx: TaskContext) -> None:
            started.set()
            await asyncio.Event().wait()  # until the engine stops

        async with make_store() as store:
            async with Engine(store=store) as engine:
                wf = Workflow("cut")
                wf.add("quick", join)
                wf.add("slow", slow, after=["quick"])
                engine.submit(wf)
                await started.wait()
            (unfinished,) = await store.unfinished()
            assert unfinished == wf.id
            image = await stored_image(store, wf.id)
            assert image.status is None  # type: ignore[attr-defined]
            assert image.tasks["quick"].state == "done"  # type: ignore[attr-defined]
            assert image.unfinished() == ["slow"]  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_store_that_fails_mid_run_stops_the_runs_with_a_store_error() -> None:
    async def main() -> tuple[BaseException, int]:
        async def stuck(ctx: TaskContext) -> None:
            await asyncio.Event().wait()  # only the store's failure ends this run

        store = MemoryStore(fail_after=1)
        async with Engine(store=store) as engine:
            wf = Workflow("w")
            wf.add("a", stuck)
            wf.add("b", stuck, after=["a"])
            handle = engine.submit(wf)
            await store.committed.wait()  # the first commit went through
            engine.submit(Workflow("second"))  # its events make the second commit, which fails
            with pytest.raises(StoreError, match="No space left") as info:
                await asyncio.wait_for(handle.result(), timeout=60.0)
            with pytest.raises(StoreError):
                engine.submit(Workflow("after"))
        return info.value, len(store.batches)

    error, committed = asyncio.run(main())
    assert "resume it once the store is writable" in str(error)
    assert committed == 1  # what was committed before the failure stays


def test_a_store_on_a_virtual_clock_is_refused_before_anything_runs() -> None:
    clock = VirtualClock()

    async def main() -> None:
        with pytest.raises(UsageError, match="needs the system clock"):
            async with Engine(clock=clock, store=MemoryStore()):
                pass

    clock.run(main())
