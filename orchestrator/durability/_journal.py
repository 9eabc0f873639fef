"""The journal: group commit in front of a `Store`.

The engine calls `append` (synchronous, no I/O) for every event; one writer task takes
everything appended since its last commit and writes it as one `StoreBatch`, so while one
transaction is in flight the next one fills up and many events share a commit. Nothing is
durable until `await journal.durable()` returns; what the engine must wait for before it
goes on (a result handed to dependents, an LLM call sent) is the engine's decision.

The engine appends its typed events (`append_event`, which encodes them); other callers
append plain JSON-able data, so the journal does not depend on the events' fields. A
top-level field whose JSON is longer than `inline_limit` bytes goes to the payloads table
under its sha256 and the event keeps a reference; the same bytes are stored once however
many events carry them.

Usage, inside the task group that owns the engine:

    journal = Journal(store)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(journal.run())
        ...                      # journal.append(...), await journal.durable()
        await journal.close()    # flushes, stops the writer, raises its error if any
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic import TypeAdapter
from pydantic_core import SchemaSerializer

from ..model._errors import OverloadedError, UsageError
from ..model._events import EVENT_ADAPTER, Event
from ._store import (
    NO_REFS,
    BatchRefusedError,
    CallRecord,
    EventRecord,
    LeaseLostError,
    Store,
    StoreBatch,
    StoreError,
    WorkflowRow,
    payload_digest,
)

_log = logging.getLogger("plait.store")

_DUMPS = json.JSONEncoder(separators=(",", ":")).encode
"""ASCII-only JSON (the default escaping), so a text's length is its size in bytes."""

_SERIALIZERS: dict[type, SchemaSerializer] = {}
"""pydantic's serializer per event class. `EVENT_ADAPTER.dump_json` writes the same text,
but finding the union's member first costs it more than the encoding itself."""


def event_json(event: Event) -> str:
    """The event's JSON text, as `EVENT_ADAPTER.dump_json(event)` writes it."""
    cls = type(event)
    serializer = _SERIALIZERS.get(cls)
    if serializer is None:
        serializer = _SERIALIZERS[cls] = TypeAdapter(cls).serializer
    return serializer.to_json(event).decode()


class JournalStats(NamedTuple):
    """A snapshot of the journal's counters (a named tuple: the engine's loop reads one on
    every turn, and a frozen dataclass costs several times more to build)."""

    appended: int
    """Records accepted so far (events, workflow rows, call results)."""
    committed: int
    """Records of those that are durable."""
    commits: int
    """Transactions written; `committed / commits` is the grouping achieved."""
    max_pending: int

    @property
    def pending(self) -> int:
        return self.appended - self.committed


class Journal:
    """Groups appended records into few transactions; see the module docstring.

    `patience_s`: how long a commit that failed in a way that may pass (a database away, a
    full disk) is tried again before the writer gives up (`sleep` and `now` are the clock
    it waits on).

    `max_pending` bounds how far the store may fall behind, in records: `append` raises
    `OverloadedError` (accepting nothing) when that many are not yet committed. The engine
    avoids it by awaiting `room()` before it starts more work; the error is there so that a
    caller that does not wait fails loudly instead of growing memory without bound.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_pending: int = 10_000,
        inline_limit: int = 1024,
        patience_s: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        now: Callable[[], float] = time.monotonic,
        owner: str | None = None,
        lease_s: float = 0.0,
        on_lost: Callable[[Sequence[str]], None] | None = None,
        on_refused: Callable[[Sequence[str], BatchRefusedError], None] | None = None,
    ):
        if max_pending < 1:
            raise UsageError(f"max_pending must be at least 1, not {max_pending}")
        if inline_limit < 0:
            raise UsageError(f"inline_limit must be 0 or more bytes, not {inline_limit}")
        self._store = store
        self._patience_s = patience_s
        self._sleep = sleep
        self._now = now
        self.outage = False
        """The store is failing and the writer waits for it to come back."""
        self.outages = 0
        """Outages ridden out so far."""
        self._max_pending = max_pending
        self._inline_limit = inline_limit
        self._seqs: dict[str, int] = {}
        self._events: list[EventRecord] = []
        self._rows: dict[str, WorkflowRow] = {}
        self._payloads: dict[str, bytes] = {}
        self._calls: list[CallRecord] = []
        self._appended = 0
        self._committed = 0
        self._commits = 0
        # Waiters sorted by nothing in particular: few at a time, each woken once.
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._stopped = False
        self._error: BaseException | None = None
        self._owner = owner
        self._lease_s = lease_s
        self._on_lost = on_lost
        self._on_refused = on_refused
        self._refused: dict[str, BatchRefusedError] = {}
        """Workflows the store refused (`BatchRefusedError`), with why."""
        self._lost: set[str] = set()
        """Workflows another engine took over (`LeaseLostError`): nothing more is written."""

    # --- the engine's side: synchronous, no I/O ------------------------------------------------

    def start_at(self, workflow: str, last_seq: int) -> None:
        """Continue a stored workflow: its next event gets `last_seq + 1`."""
        self._lost.discard(workflow)  # taken back after it was lost: this engine's again
        self._refused.pop(workflow, None)
        self._seqs[workflow] = last_seq

    def let_go(self, workflow: str) -> None:
        """Append nothing more of this workflow (another engine runs it, or will). What is
        pending of it still goes to the store, fenced: written while this engine holds the
        lease (the log stays whole), dropped if another engine took the workflow over."""
        self._lost.add(workflow)
        self._seqs.pop(workflow, None)

    def lost(self, workflow: str) -> bool:
        """Whether this engine let the workflow go (`let_go`, or taken over)."""
        return workflow in self._lost

    def forget(self, workflow: str) -> None:
        """Drop a finished workflow's sequence counter (appending to it again starts at 1)."""
        self._seqs.pop(workflow, None)

    def append(self, workflow: str, kind: str, at: float, data: Mapping[str, Any]) -> int:
        """Accept one event and return its `seq`. `data` must be JSON-able; it is encoded
        now, so a bad value fails here, at the call that passed it."""
        self._accept()
        text, refs = self._encode(data)
        return self._add(workflow, kind, at, text, refs)

    def append_event(self, workflow: str, event: Event) -> int:
        """`append` for one of the engine's events: encoded by its class's serializer."""
        return self.append_json(workflow, event.kind, event.at, event_json(event))

    def append_json(self, workflow: str, kind: str, at: float, text: str) -> int:
        """`append` for an event already encoded as JSON text (pydantic's encoder is several
        times faster than `json`'s); a text longer than `inline_limit` is decoded once so its
        large fields can go to the payloads table."""
        if len(text) > self._inline_limit:
            return self.append(workflow, kind, at, json.loads(text))
        self._accept()
        return self._add(workflow, kind, at, text, NO_REFS)

    def _add(self, workflow: str, kind: str, at: float, text: str, refs: Mapping[str, str]) -> int:
        if workflow in self._lost:
            return 0  # another engine runs it now: what this one still says is dropped
        seq = self._seqs.get(workflow, 0) + 1
        self._seqs[workflow] = seq
        self._events.append(EventRecord(workflow, seq, kind, at, text, refs))
        self._accepted()
        return seq

    def withdraw(self, workflow: str) -> None:
        """Take back every record of `workflow` not yet being written: a run refused while it
        was being started leaves nothing in the store (its events are appended with no await
        between them, so none of them can be in a commit already)."""
        kept = [e for e in self._events if e.workflow != workflow]
        gone = len(self._events) - len(kept)
        if self._rows.pop(workflow, None) is not None:
            gone += 1
        if not gone:
            return
        self._events = kept
        self._appended -= gone
        self._seqs.pop(workflow, None)
        if self._appended - self._committed < self._max_pending:
            self._room.set()

    def upsert(self, row: WorkflowRow) -> None:
        """Accept a workflow row; of several for one id in a batch, the last is written."""
        if row.id in self._lost:
            return
        self._accept()
        self._rows[row.id] = row
        self._accepted()

    def record_call(
        self, program: str, request_hash: str, result: bytes, *, workflow: str | None = None
    ) -> str:
        """Accept an LLM call's result; return its payload digest."""
        self._accept()
        digest = payload_digest(result)
        self._payloads[digest] = result
        self._calls.append(
            CallRecord(program=program, request_hash=request_hash, digest=digest, workflow=workflow)
        )
        self._accepted()
        return digest

    @property
    def stats(self) -> JournalStats:
        return JournalStats(self._appended, self._committed, self._commits, self._max_pending)

    # --- waiting --------------------------------------------------------------------------------

    @property
    def appended(self) -> int:
        """Records accepted so far: a mark to pass to `durable(upto=...)` later."""
        return self._appended

    @property
    def committed(self) -> int:
        return self._committed

    async def durable(self, upto: int | None = None) -> None:
        """Return once every record appended before this call (or the first `upto` ones)
        is committed. Raises the writer's failure as a `StoreError` (to every waiter, now
        and later)."""
        self._raise_if_failed()
        target = self._appended if upto is None else min(upto, self._appended)
        if self._committed >= target:
            return
        if self._stopped:
            raise StoreError("the journal's writer is not running; nothing more can commit")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, future))
        await future

    async def room(self) -> None:
        """Return once fewer than `max_pending` records wait for a commit."""
        while not self._room.is_set():
            self._raise_if_failed()
            await self._room.wait()
        self._raise_if_failed()

    # --- the writer -----------------------------------------------------------------------------

    async def run(self) -> None:
        """The writer: commit whatever is pending, one transaction at a time, until `close()`.
        Run it as a task of the caller's TaskGroup. A failed write stops it; the error goes to
        `durable()`, `append()` and `close()` callers, and `run` itself returns quietly so it
        does not cancel the caller's other tasks."""
        try:
            while True:
                if not self._has_pending():
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                batch, upto = self._take()
                while True:
                    try:
                        await self._store.append(batch)
                    except LeaseLostError as exc:
                        batch = self._let_go(batch, exc.workflows)
                        continue  # the rest of the batch is this engine's: write it
                    except BatchRefusedError as exc:
                        kept = self._refuse(batch, exc)
                        if len(kept) == len(batch):  # refused for what it cannot drop
                            self._fail(exc)
                            return
                        batch = kept
                        continue
                    except Exception as exc:
                        if not await self._ride_out(batch, exc):
                            return
                    break
                self._committed = upto
                self._commits += 1
                self._release()
        except asyncio.CancelledError:
            self._fail(StoreError("the journal's writer was cancelled before committing"))
            raise
        finally:
            self._stopped = True

    async def _ride_out(self, batch: StoreBatch, error: Exception) -> bool:
        """A commit failed. If the failure may pass (`StoreError.transient`: the database
        is away, the disk is full), wait and commit the same batch again, for up to
        `patience_s`; meanwhile nothing more commits, so whoever waits for `durable()`
        waits (the engine's runs pause). True once the batch is in; else the writer fails."""
        started = self._now()
        delay = 0.05
        while isinstance(error, StoreError) and (
            error.transient or isinstance(error, LeaseLostError)
        ):
            if self._now() - started >= self._patience_s:
                break
            if not self.outage:
                self.outage = True
                _log.warning("store unavailable; waiting up to %.0f s: %s", self._patience_s, error)
            await self._sleep(delay)
            delay = min(delay * 2, 2.0)
            try:
                if not await self._landed(batch):  # a commit whose answer was lost
                    await self._store.append(batch)
            except LeaseLostError as exc:  # taken over meanwhile: the rest is still ours
                batch = self._let_go(batch, exc.workflows)
                error = exc
                continue
            except Exception as exc:
                error = exc
                continue
            self.outage = False
            self.outages += 1
            _log.warning("store available again after %.1f s", self._now() - started)
            return True
        self._fail(error)
        return False

    async def _landed(self, batch: StoreBatch) -> bool:
        """Whether `batch` was committed after all (the connection broke after COMMIT):
        its last event is in the store. A batch without events is safe to write again."""
        if not batch.events:
            return False
        last = batch.events[-1]
        if await self._store.last_seq(last.workflow) < last.seq:
            return False
        if self._owner is None:
            return True  # only this engine writes its workflows
        # With several engines the log may have grown past it under another owner: it
        # landed only if the workflow is still this engine's (the fence sorts out the rest).
        row = await self._store.workflow(last.workflow)
        return row is not None and row.owner == self._owner

    async def close(self) -> None:
        """Commit what is pending and stop the writer; raise its failure if there was one."""
        self._closing = True
        self._wake.set()
        if not self._stopped or self._has_pending():
            await self.durable()
        self._raise_if_failed()

    # --- inside ---------------------------------------------------------------------------------

    def _accept(self) -> None:
        self._raise_if_failed()
        if self._closing:
            raise UsageError("the journal is closed; append before close()")
        if self._appended - self._committed >= self._max_pending:
            raise OverloadedError("the journal (the store is behind)", self._max_pending)

    def _accepted(self) -> None:
        self._appended += 1
        if self._appended - self._committed >= self._max_pending:
            self._room.clear()
        self._wake.set()

    def _encode(self, data: Mapping[str, Any]) -> tuple[str, Mapping[str, str]]:
        text = _DUMPS(data)
        # A field's JSON is part of the whole, so a small event has no large field.
        if len(text) <= self._inline_limit:
            return text, NO_REFS
        fields: dict[str, Any] = {}
        refs: dict[str, str] = {}
        for name, value in data.items():
            encoded = _DUMPS(value)
            if len(encoded) > self._inline_limit:
                raw = encoded.encode()
                digest = payload_digest(raw)
                self._payloads[digest] = raw
                refs[name] = digest
                fields[name] = {"$ref": digest}
            else:
                fields[name] = value
        return (_DUMPS(fields), refs) if refs else (text, refs)

    def _has_pending(self) -> bool:
        return bool(self._events or self._rows or self._payloads or self._calls)

    def _take(self) -> tuple[StoreBatch, int]:
        batch = StoreBatch(
            events=self._events,
            workflows=list(self._rows.values()),
            payloads=self._payloads,
            calls=self._calls,
            owner=self._owner,
            lease_s=self._lease_s,
        )
        self._events, self._rows, self._payloads, self._calls = [], {}, {}, []
        return batch, self._appended

    def refusal(self, workflow: str) -> BatchRefusedError | None:
        """Why the store refused this workflow's records, if it did (nothing more of it is
        written: it is let go)."""
        return self._refused.get(workflow)

    def _refuse(self, batch: StoreBatch, error: BatchRefusedError) -> StoreBatch:
        """The store refused these workflows (a new one's id is taken, or text it cannot
        keep): drop what this batch and later appends say of them, tell the engine, and
        keep the rest."""
        _log.error("the store refused %d workflow(s): %s", len(error.workflows), error)
        gone = set(error.workflows)
        for workflow in gone:
            self.let_go(workflow)
            self._refused[workflow] = error
        # What was appended of them since this batch was taken goes too.
        self._events = [e for e in self._events if e.workflow not in gone]
        self._rows = {k: row for k, row in self._rows.items() if k not in gone}
        self._calls = [c for c in self._calls if c.workflow not in gone]
        if self._on_refused is not None:
            self._on_refused(error.workflows, error)
        return _without(batch, gone)

    def _let_go(self, batch: StoreBatch, workflows: Sequence[str]) -> StoreBatch:
        """Another engine took these workflows over: drop what this batch and later appends
        say of them, tell the engine, and keep the rest."""
        lost = set(workflows)
        for workflow in lost:
            self.let_go(workflow)
        _log.warning("lost the lease of %d workflow(s); another engine runs them now", len(lost))
        if self._on_lost is not None:
            self._on_lost(sorted(lost))
        return _without(batch, lost)

    def _release(self) -> None:
        if self._appended - self._committed < self._max_pending:
            self._room.set()
        still: list[tuple[int, asyncio.Future[None]]] = []
        for target, future in self._waiters:
            if target <= self._committed:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((target, future))
        self._waiters = still

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._room.set()
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(self._failure())
        self._waiters = []

    def _failure(self) -> StoreError:
        error = self._error
        assert error is not None
        lost = self._appended - self._committed
        failure = StoreError(
            f"the journal could not commit {lost} record(s): {error}; the run cannot be "
            "made durable, so stop it and resume it once the store is writable again"
        )
        failure.__cause__ = error
        return failure

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._failure()


def _without(batch: StoreBatch, workflows: set[str]) -> StoreBatch:
    """The batch less what it says of `workflows`."""
    return replace(
        batch,
        events=[e for e in batch.events if e.workflow not in workflows],
        workflows=[w for w in batch.workflows if w.id not in workflows],
        calls=[c for c in batch.calls if c.workflow not in workflows],
    )


async def read_events(store: Store, workflow: str, after_seq: int = 0) -> list[dict[str, Any]]:
    """The workflow's events after `after_seq`, as the JSON-able dicts that were appended,
    with every field that went to the payloads table put back (one payload query)."""
    records, payloads = await read_records(store, workflow, after_seq)
    return [restore(record, payloads) for record in records]


async def read_log(store: Store, workflow: str) -> tuple[list[Event], int]:
    """The workflow's whole log as typed events, and its last `seq` (0 when empty). An event
    without payload references is decoded straight from its JSON text (pydantic's parser,
    several times faster than `json` and validation in two steps: resume reads 250,000 for
    a 100,000-task run)."""
    records, payloads = await read_records(store, workflow, 0)
    events = [
        EVENT_ADAPTER.validate_python(restore(r, payloads))
        if r.refs
        else EVENT_ADAPTER.validate_json(r.data)
        for r in records
    ]
    return events, records[-1].seq if records else 0


async def read_records(
    store: Store, workflow: str, after_seq: int = 0, limit: int | None = None
) -> tuple[list[EventRecord], dict[str, bytes]]:
    """The workflow's stored records after `after_seq` (each with its `seq`; the first
    `limit`) and the payloads they refer to, in two queries; `restore` puts a record's
    fields back."""
    records = await store.events(workflow, after_seq, limit)
    wanted = sorted({digest for record in records for digest in record.refs.values()})
    return records, await store.payloads(wanted) if wanted else {}


def restore(record: EventRecord, payloads: Mapping[str, bytes]) -> dict[str, Any]:
    """One event's data with its referenced fields read back from `payloads`."""
    data: dict[str, Any] = json.loads(record.data)
    for name, digest in record.refs.items():
        try:
            data[name] = json.loads(payloads[digest])
        except KeyError:
            raise StoreError(
                f"event {record.seq} of workflow {record.workflow!r} refers to payload "
                f"{digest} for its field {name!r}, which the store does not have; the store "
                "was damaged or garbage-collected while in use: restore it from a backup"
            ) from None
    return data
