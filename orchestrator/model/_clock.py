"""Injected time: a `Clock` protocol, the system clock and a virtual clock.

The virtual clock is an event loop whose `time()` is virtual. When every task on the loop is
waiting for a timer (nothing ready, no I/O event, no worker thread running), the loop jumps
straight to the next timer instead of sleeping. `asyncio.sleep`, `asyncio.timeout` and
tenacity's waits therefore all run on virtual time, and an hour of simulated work replays in
as long as the CPU needs to compute it.
"""

from __future__ import annotations

import asyncio
import re
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future as ThreadFuture
from typing import Any, Protocol, TypeVar, runtime_checkable

from ._errors import ClockMismatchError, DeadlockError

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """What plait asks of time. Inject one into the engine, retries and simulators."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def now(self) -> float:
        """Seconds since the Unix epoch, for timestamps shown to people."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""
        ...

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """An event loop that keeps this clock's time."""
        ...

    def check_running_loop(self) -> None:
        """Raise `ClockMismatchError` if the running loop does not keep this clock's time."""
        ...


class SystemClock:
    """Wall time: the running loop's monotonic clock and the system's epoch clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    def check_running_loop(self) -> None:
        if isinstance(asyncio.get_running_loop(), _VirtualLoop):
            raise ClockMismatchError(
                "a SystemClock was given, but a VirtualClock drives the running loop; "
                "pass that VirtualClock (or no clock: the engine takes the loop's own)"
            )


class VirtualClock:
    """Virtual time that jumps to the next deadline whenever everything waits.

    Run code on it with `clock.run(main())` (or `run_sync(..., clock=clock)`); the loop it
    creates reads `clock.monotonic()` as its time. While a worker thread runs (a sync task
    function), virtual time follows wall time, so timeouts still fire on a stuck thread.
    """

    def __init__(self, start: float = 0.0, *, epoch: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._epoch = epoch
        self._threads_running = 0

    def monotonic(self) -> float:
        return self._now

    def now(self) -> float:
        return self._epoch + self._now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _VirtualLoop(self)

    def check_running_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if not (isinstance(loop, _VirtualLoop) and loop.clock is self):
            raise ClockMismatchError()

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run `main` to completion on a fresh loop that keeps this clock's time."""
        with asyncio.Runner(loop_factory=self.new_event_loop) as runner:
            return runner.run(main)

    # Called by the loop only.
    def _advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds


def running_clock() -> Clock:
    """The clock that keeps the running loop's time: its VirtualClock, or the system's."""
    loop = asyncio.get_running_loop()
    return loop.clock if isinstance(loop, _VirtualLoop) else SystemClock()


class _VirtualSelector(selectors.BaseSelector):
    """Wraps the real selector: real I/O still wakes the loop, but idle waits cost no time."""

    def __init__(self, clock: VirtualClock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None and self._clock._threads_running == 0 and len(self._real.get_map()) <= 1:
            # Only the loop's own wake-up pipe is watched: no timer, no thread, no socket
            # can ever wake a task again. Say so instead of hanging.
            raise DeadlockError(self._waiting_tasks())
        if self._clock._threads_running > 0 or timeout is None:
            # Real work is under way (or nothing is scheduled at all): wait for it in real
            # time, and let virtual time follow so that timeouts on a stuck thread fire.
            started = time.monotonic()
            ready = self._real.select(timeout)
            elapsed = time.monotonic() - started
            self._clock._advance(elapsed if timeout is None else min(elapsed, timeout))
            return ready
        self._clock._advance(timeout)
        return []

    def _waiting_tasks(self) -> list[str]:
        if self.loop is None:
            return []
        # Tasks named by their owner (the engine names each one `workflow/task`) read as
        # that name; plait's own machinery (`plait-...`) is not what the user waits on.
        waiting = []
        for t in asyncio.all_tasks(self.loop):
            name = t.get_name()
            if name.startswith("plait-"):
                continue
            if _DEFAULT_TASK_NAME.fullmatch(name):
                name = f"an asyncio task in {getattr(t.get_coro(), '__qualname__', '?')}"
            waiting.append(name)
        return sorted(waiting)


_DEFAULT_TASK_NAME = re.compile(r"Task-\d+")


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        selector = _VirtualSelector(clock)
        super().__init__(selector=selector)
        selector.loop = self
        self.clock = clock

    def time(self) -> float:
        return self.clock._now

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        # Count running threads so the selector knows the loop is not idle while they work.
        self.clock._threads_running += 1
        future = super().run_in_executor(executor, func, *args)
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any] | ThreadFuture[Any]) -> None:
        self.clock._threads_running -= 1

    async def shutdown_default_executor(self, *args: Any) -> None:
        # asyncio joins the executor from a thread of its own: count it as working.
        self.clock._threads_running += 1
        try:
            await super().shutdown_default_executor(*args)
        finally:
            self.clock._threads_running -= 1
