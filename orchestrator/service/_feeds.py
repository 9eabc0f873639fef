"""Event streams' reads of the store, shared: one read per workflow per new event, whatever
the number of streams following it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..durability._journal import Journal, read_records, restore
from ..durability._store import EventRecord, Store
from ..engine._engine import Engine
from ..model._errors import PlaitError


@dataclass(frozen=True, slots=True)
class Frame:
    """One event as a stream sends it (encoded once for all the streams)."""

    seq: int
    data: bytes
    last: bool
    """The workflow's `workflow_finished`: nothing follows it."""


PAGE = 200
"""Records a read takes from the store at most: a long log (a 10,000-task workflow's is
tens of thousands of events, megabytes) is read, encoded and sent a page at a time, with
the event loop free between pages."""
_THREAD_BYTES = 256 * 1024
"""A page holding more than this (large results) is encoded in a worker thread."""


@dataclass(frozen=True, slots=True)
class _Read:
    heard: int
    """Bus events heard when the read began: it has every one of them."""
    after: int
    frames: tuple[Frame, ...]
    whole: bool
    """The read reached the end of the log (a page that was not full)."""

    def serves(self, after: int) -> bool:
        """Whether this read has what follows `after` (all of it, or its next page)."""
        if self.after > after:
            return False
        return self.whole or (bool(self.frames) and after < self.frames[-1].seq)

    def since(self, after: int) -> list[Frame]:
        return [f for f in self.frames if f.seq > after]


def _encode(records: list[EventRecord], payloads: dict[str, bytes]) -> tuple[Frame, ...]:
    return tuple(
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


class Feed:
    """One workflow's log as its streams read it. A stream asks for the frames after its
    position; a read that began after every event the stream knows of was heard serves it
    (the one in flight, or the last), so N streams at one position cost one read. A read
    takes at most PAGE records: `replay` goes on page by page."""

    def __init__(self, run_id: str, store: Store, journal: Journal | None) -> None:
        self.run_id, self.store, self.journal = run_id, store, journal
        self.streams = 0
        self.news: asyncio.Queue[Any] = asyncio.Queue()
        """The workflow's events from the bus (subscribed before the first read)."""
        self._heard = 0
        self._last: _Read | None = None
        self._flight: tuple[int, int, asyncio.Future[_Read | None]] | None = None

    async def replay(self, after: int) -> AsyncIterator[Frame]:
        """Every frame after `after`, as committed once every event heard so far is: a page
        at a time, yielding the loop between pages."""
        while True:
            frames, whole = await self.frames(after)
            for frame in frames:
                yield frame
            if whole or not frames:
                return
            after = frames[-1].seq
            await asyncio.sleep(0)

    async def frames(self, after: int) -> tuple[list[Frame], bool]:
        """The next page of the log's frames after `after`, and whether it reaches the end
        of the log, as committed once every event heard so far is."""
        while True:
            while not self.news.empty():
                self.news.get_nowait()
                self._heard += 1
            heard = self._heard
            last = self._last
            if last is not None and last.heard >= heard and last.serves(after):
                return last.since(after), last.whole
            flight = self._flight
            if flight is not None and flight[0] >= heard and flight[1] <= after:
                done = await asyncio.shield(flight[2])
                if done is None or not done.serves(after):
                    continue  # that reader went away, failed or read too little: read again
                return done.since(after), done.whole
            read = await self._read(heard, after)
            return read.since(after), read.whole

    async def _read(self, heard: int, after: int) -> _Read:
        future: asyncio.Future[_Read | None] = asyncio.get_running_loop().create_future()
        flight = self._flight = (heard, after, future)
        try:
            if self.journal is not None:
                # What was recorded is read once committed; a store that has failed has all
                # there will be (the runs stop, and the stream ends after what it has).
                with contextlib.suppress(PlaitError):
                    await self.journal.durable()
            records, payloads = await read_records(self.store, self.run_id, after, PAGE)
            size = sum(len(r.data) for r in records) + sum(map(len, payloads.values()))
            if size > _THREAD_BYTES:
                frames = await asyncio.to_thread(_encode, records, payloads)
            else:
                frames = _encode(records, payloads)
            read = _Read(heard, after, frames, len(records) < PAGE)
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
