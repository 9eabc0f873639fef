from __future__ import annotations

import asyncio
import threading
import time

import pytest

from orchestrator import DeadlockError, SystemClock, VirtualClock
from orchestrator.model._errors import ClockMismatchError


def test_virtual_sleep_jumps_to_the_deadline_at_once() -> None:
    clock = VirtualClock()

    async def main() -> float:
        await clock.sleep(3600)
        return clock.monotonic()

    started = time.perf_counter()
    assert clock.run(main()) == 3600
    assert time.perf_counter() - started < 5  # an hour of virtual time, not of wall time


def test_concurrent_sleepers_wake_in_deadline_order_at_exact_times() -> None:
    clock = VirtualClock(start=10.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((name, clock.monotonic()))

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(sleeper("c", 3))
            tg.create_task(sleeper("a", 1))
            tg.create_task(sleeper("b", 2.5))

    clock.run(main())
    assert woke == [("a", 11.0), ("b", 12.5), ("c", 13.0)]
    assert clock.now() - clock.monotonic() == pytest.approx(1_800_000_000.0)


def test_asyncio_timeout_fires_in_virtual_time() -> None:
    clock = VirtualClock()

    async def main() -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.Event().wait()
        return clock.monotonic()

    assert clock.run(main()) == 30


def test_time_follows_wall_time_while_a_thread_works() -> None:
    clock = VirtualClock()
    release = threading.Event()

    def worker() -> str:
        release.wait(timeout=10)
        return "done"

    async def main() -> tuple[str, float]:
        future = asyncio.get_running_loop().run_in_executor(None, worker)
        # A pending timer must not be jumped to while the thread is still working.
        timer = asyncio.create_task(asyncio.sleep(1000))
        await asyncio.sleep(0)
        release.set()
        result = await future
        at = clock.monotonic()
        timer.cancel()
        return result, at

    result, at = clock.run(main())
    assert result == "done"
    assert at < 1000


def test_a_virtual_clock_refuses_a_loop_it_does_not_drive() -> None:
    clock = VirtualClock()

    async def main() -> None:
        clock.check_running_loop()

    with pytest.raises(ClockMismatchError, match="run_sync"):
        asyncio.run(main())


def test_system_clock_refuses_a_virtual_loop() -> None:
    async def main() -> None:
        SystemClock().check_running_loop()

    with pytest.raises(ClockMismatchError):
        VirtualClock().run(main())


def test_a_wait_nothing_can_end_is_reported_as_a_deadlock() -> None:
    clock = VirtualClock()

    async def forever() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        await asyncio.gather(asyncio.create_task(forever(), name="stuck-one"))

    with pytest.raises(DeadlockError, match="stuck-one") as info:
        clock.run(main())
    assert "stuck-one" in info.value.waiting
    # An unnamed task is described by its coroutine, not by asyncio's Task-N.
    assert any("an asyncio task in" in name and "main" in name for name in info.value.waiting)


def test_a_deadlocked_workflow_names_plaits_workflow_and_task() -> None:
    from orchestrator import TaskContext, Workflow, run_sync

    async def stuck(ctx: TaskContext) -> None:
        await asyncio.Event().wait()

    wf = Workflow("research")
    wf.add("write", stuck)
    with pytest.raises(DeadlockError) as info:
        run_sync(wf, clock=VirtualClock())
    assert "research/write" in info.value.waiting
    assert not any(
        "Engine._execute" in name or "plait-engine" in name for name in info.value.waiting
    )
