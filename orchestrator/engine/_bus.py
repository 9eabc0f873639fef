"""The event bus: events of every run, delivered to its subscribers and to listeners.

Events are buffered while the loop applies a batch of outcomes and delivered together when
it turns (`flush`), so a listener sees a consistent order without being woken per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from ..model._events import Event


class EventBus:
    """Owned by the engine; runs and the call path emit into it."""

    __slots__ = ("_listeners", "_pending", "_subscribers", "recorder", "tracer")

    def __init__(self) -> None:
        self.recorder: Callable[[str, Event], None] | None = None
        """Hears every event as it is emitted, watched or not (the engine's journal)."""
        self.tracer: Callable[[str, Event], None] | None = None
        """Hears every event as it is emitted, when the engine traces (`Tracing.hear`)."""
        self._pending: list[tuple[str, Event]] = []
        self._listeners: list[asyncio.Queue[Event]] = []
        self._subscribers: dict[str, Sequence[asyncio.Queue[Event]]] = {}

    @property
    def has_listeners(self) -> bool:
        return bool(self._listeners)

    def observed(self, run: str) -> bool:
        """Whether anyone reads `run`'s events. Hot paths build events only if so: on a
        100,000-task graph that nobody watches, building them would be a third of the cost."""
        return (
            self.recorder is not None
            or self.tracer is not None
            or bool(self._listeners)
            or run in self._subscribers
        )

    def subscribe(self, run: str, queue: asyncio.Queue[Event]) -> None:
        self._subscribers[run] = (*self._subscribers.get(run, ()), queue)

    def unsubscribe(self, run: str, queue: asyncio.Queue[Event]) -> None:
        """Stop delivering `run`'s events to `queue` (nothing if it was not subscribed)."""
        left = tuple(q for q in self._subscribers.get(run, ()) if q is not queue)
        if left:
            self._subscribers[run] = left
        else:
            self._subscribers.pop(run, None)

    def listen(self, queue: asyncio.Queue[Event]) -> None:
        self._listeners.append(queue)

    def unlisten(self, queue: asyncio.Queue[Event]) -> None:
        self._listeners.remove(queue)

    def emit(self, run: str, event: Event) -> None:
        if self.recorder is not None:
            self.recorder(run, event)
        if self.tracer is not None:
            self.tracer(run, event)
        if self._listeners or run in self._subscribers:
            self._pending.append((run, event))

    def drop(self, run: str) -> None:
        """Forget `run`'s undelivered events and subscribers (a run refused at submit)."""
        self._pending = [(r, e) for r, e in self._pending if r != run]
        self._subscribers.pop(run, None)

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        listeners = self._listeners
        subscribers = self._subscribers
        for run, event in pending:
            for queue in subscribers.get(run, ()):
                queue.put_nowait(event)
            for queue in listeners:
                queue.put_nowait(event)
            if event.kind == "workflow_finished":
                subscribers.pop(run, None)  # its story is told
