"""Wake-ups between processes: "something was written on this channel, look again".

Several engines on one store keep blackboard posts and peer messages in the database; an
agent waiting in one process learns of a post written by another from a notification
instead of reading the store every few seconds. A notification carries no data (a short
hint at most): whoever is woken reads the store, which stays the one truth; a lost or
repeated notification costs a read, never a message. `memory.PgNotifier` uses PostgreSQL's
LISTEN/NOTIFY, `memory.RedisNotifier` Redis pub/sub; `LocalNotifier` is for one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

Listener = Callable[[str], None]
"""Called on the event loop with the notification's payload."""


@runtime_checkable
class Notifier(Protocol):
    async def notify(self, channel: str, payload: str = "") -> None:
        """Tell every listener of `channel`, in every process (this one included)."""
        ...

    async def listen(self, channel: str, listener: Listener) -> None:
        """Call `listener` for each notification on `channel` once this returns."""
        ...

    def unlisten(self, channel: str, listener: Listener) -> None: ...


class LocalNotifier:
    """A `Notifier` within one process (tests, and engines sharing a process)."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[Listener]] = {}
        self.sent = 0

    async def notify(self, channel: str, payload: str = "") -> None:
        self.sent += 1
        for listener in list(self._listeners.get(channel, ())):
            listener(payload)

    async def listen(self, channel: str, listener: Listener) -> None:
        self._listeners.setdefault(channel, []).append(listener)

    def unlisten(self, channel: str, listener: Listener) -> None:
        listeners = self._listeners.get(channel, [])
        if listener in listeners:
            listeners.remove(listener)
