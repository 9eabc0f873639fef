"""Event streams' reads of the store, shared: one read per workflow per new event, whatever
the number of streams following it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from .._engine import Engine
from .._errors import PlaitError
from .._journal import Journal, read_records, restore
from .._store import Store


@dataclass(frozen=True, slots=True)
class Frame:
    """One event as a stream sends it (encoded once for all the streams)."""

    seq: int
    data: bytes
    last: bool
    """The workflow's `workflow_finished`: nothing follows it."""


@dataclass(frozen=True, slots=True)
class _Read:
    heard: int
    """Bus events heard when the read began: it has every one of them."""
    after: int
    frames: tuple[Frame, ...]

    def since(self, after: int) -> list[Frame]:
        return [f for f in self.frames if f.seq > after]


class Feed:
    """One workflow's log as its streams read it. A stream asks for the frames after its
    position; a read that began after every event the stream knows of was heard serves it
    (the one in flight, or the last), so N streams at one position cost one read."""

    def __init__(self, run_id: str, store: Store, journal: Journal | None) -> None:
        self.run_id, self.store, self.journal = run_id, store, journal
        self.streams = 0
        self.news: asyncio.Queue[Any] = asyncio.Queue()
        """The workflow's events from the bus (subscribed before the first read)."""
        self._heard = 0
        self._last: _Read | None = None
        self._flight: tuple[int, int, asyncio.Future[_Read | None]] | None = None

    async def frames(self, after: int) -> list[Frame]:
        """The log's frames after `after`, as committed once every event heard so far is."""
        while True:
            while not self.news.empty():
                self.news.get_nowait()
                self._heard += 1
            heard = self._heard
            last = self._last
            if last is not None and last.heard >= heard and last.after <= after:
                return last.since(after)
            flight = self._flight
            if flight is not None and flight[0] >= heard and flight[1] <= after:
                done = await asyncio.shield(flight[2])
                if done is None:
                    continue  # that reader went away or failed: read for ourselves
                return done.since(after)
            return (await self._read(heard, after)).since(after)

    async def _read(self, heard: int, after: int) -> _Read:
        future: asyncio.Future[_Read | None] = asyncio.get_running_loop().create_future()
        flight = self._flight = (heard, after, future)
        try:
            if self.journal is not None:
                # What was recorded is read once committed; a store that has failed has all
                # there will be (the runs stop, and the stream ends after what it has).
                with contextlib.suppress(PlaitError):
                    await self.journal.durable()
            records, payloads = await read_records(self.store, self.run_id, after)
            frames = tuple(
                Frame(
                    r.seq,
                    (
                        f"id: {r.seq}\nevent: {r.kind}\ndata: "
                        + json.dumps(restore(r, payloads), separators=(",", ":"))
                        + "\n\n"
                    ).encode(),
                    r.kind == "workflow_finished",
                )
                for r in records
            )
            read = _Read(heard, after, frames)
        except BaseException:
            future.set_result(None)
            raise
        finally:
            if self._flight is flight:
                self._flight = None
        future.set_result(read)
        if self._last is None or self._last.heard <= heard:
            self._last = read
        return read


class Feeds:
    """The feeds of the workflows that have streams open, and how many each tenant has."""

    def __init__(self, engine: Engine, store: Store) -> None:
        self.engine, self.store = engine, store
        self._feeds: dict[str, Feed] = {}
        self.by_tenant: dict[str, int] = {}

    def open(self, run_id: str, tenant: str) -> Feed:
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = Feed(run_id, self.store, self.engine.journal)
            self.engine.bus.subscribe(run_id, feed.news)
        feed.streams += 1
        self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + 1
        return feed

    def close(self, feed: Feed, tenant: str) -> None:
        feed.streams -= 1
        self.by_tenant[tenant] -= 1
        if not self.by_tenant[tenant]:
            del self.by_tenant[tenant]
        if not feed.streams and self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]
            self.engine.bus.unsubscribe(feed.run_id, feed.news)
