"""The journal groups appends into few commits, says exactly when they are durable, hands a
writer failure to whoever waits, and bounds how far the store may fall behind.

`MemoryStore` is a real (in-memory) `Store` that records each batch and can hold a commit
open until the test lets it go, so every ordering below is set up with events, not sleeps.
"""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, get_args

import pytest
from conftest import MemoryStore

from orchestrator import (
    EVENT_ADAPTER,
    CallRetrying,
    DeadlineHopeless,
    DeadlineMissed,
    EdgeRemoved,
    Event,
    OverloadedError,
    StoreError,
    TaskReplaced,
    TaskSucceeded,
    Usage,
    UsageError,
    WorkflowResumed,
)
from orchestrator.durability._journal import Journal
from orchestrator.durability._store import payload_digest
from orchestrator.ext import ActionSpec, WorkflowRow, WorkflowStatus, read_events

T = TypeVar("T")


Body = Callable[[Journal, MemoryStore], Coroutine[Any, Any, T]]


def with_journal(body: Body[T], **options: Any) -> T:
    """Run `body` with a journal whose writer runs in the body's task group."""

    async def main() -> T:
        store = MemoryStore()
        journal = Journal(store, **options)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            result = await body(journal, store)
            await journal.close()
        return result

    return asyncio.run(main())


def test_appends_while_a_commit_is_in_flight_share_the_next_commit() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        store.hold()
        journal.append("w", "k", 0.0, {"i": 0})
        await store.entered.wait()  # the writer took the first event and is committing it
        for i in range(1, 100):
            journal.append("w" if i % 2 else "v", "k", float(i), {"i": i})
        store.release()
        await journal.durable()
        assert [len(b.events) for b in store.batches] == [1, 99]
        assert journal.stats.commits == 2
        assert journal.stats.committed == journal.stats.appended == 100
        assert [e.seq for e in store.log["w"]] == list(range(1, 52))
        assert [json.loads(e.data)["i"] for e in store.log["v"]] == list(range(2, 100, 2))

    with_journal(body)


def test_durable_waits_for_what_was_appended_before_it_and_no_more() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        await journal.durable()  # nothing appended: returns at once
        store.hold()
        journal.append("w", "k", 0.0, {"n": 1})
        first = asyncio.ensure_future(journal.durable())
        await store.entered.wait()
        journal.append("w", "k", 1.0, {"n": 2})
        second = asyncio.ensure_future(journal.durable())
        await asyncio.sleep(0)
        assert not first.done()
        store.release()
        await first
        # The first event is committed; the second may not be yet, and `second` waits for it.
        assert store.committed_events >= 1
        await second
        assert store.committed_events == 2

    with_journal(body)


def test_rows_are_coalesced_and_calls_recorded() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        store.hold()
        journal.append("w", "k", 0.0, {})
        await store.entered.wait()
        statuses: tuple[WorkflowStatus, ...] = ("pending", "running", "succeeded")
        for status in statuses:
            journal.upsert(WorkflowRow(id="w", name="n", status=status, created=1.0, updated=2.0))
        digest = journal.record_call("p", "h", b"answer", workflow="w")
        store.release()
        await journal.durable()
        assert [len(b.workflows) for b in store.batches] == [0, 1]
        assert store.rows["w"].status == "succeeded"
        assert digest == payload_digest(b"answer")
        assert await store.find_call("p", "h") == b"answer"

    with_journal(body)


def test_large_fields_go_to_payloads_once_and_read_back_whole() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        output = {"text": "x" * 600}
        for i in range(3):
            journal.append("w", "task_succeeded", float(i), {"task": f"t{i}", "result": output})
        journal.append("w", "task_started", 3.0, {"task": "small", "result": "ok"})
        await journal.durable()
        records = store.log["w"]
        digest = payload_digest(json.dumps(output, separators=(",", ":")).encode())
        assert [r.refs for r in records] == [{"result": digest}] * 3 + [{}]
        assert json.loads(records[0].data) == {"task": "t0", "result": {"$ref": digest}}
        assert len(store.blobs) == 1
        events = await read_events(store, "w")
        assert events[2] == {"task": "t2", "result": output}
        assert events[3] == {"task": "small", "result": "ok"}
        assert await read_events(store, "w", after_seq=3) == [events[3]]

    with_journal(body, inline_limit=512)


def test_seq_continues_a_stored_workflow() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        assert journal.append("w", "k", 0.0, {}) == 1
        await journal.durable()
        journal.forget("w")
        journal.start_at("w", await store.last_seq("w"))
        assert journal.append("w", "k", 0.0, {}) == 2

    with_journal(body)


def test_data_that_is_not_json_fails_at_append_and_is_not_accepted() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        with pytest.raises(TypeError):
            journal.append("w", "k", 0.0, {"bad": object()})
        assert journal.append("w", "k", 0.0, {}) == 1
        assert journal.stats.appended == 1

    with_journal(body)


def test_a_failed_commit_reaches_every_waiter_and_later_callers() -> None:
    async def main() -> None:
        store = MemoryStore()
        journal = Journal(store)
        cause = StoreError("disk full")
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(journal.run())
            store.hold()
            store.fail_with = cause
            journal.append("w", "k", 0.0, {})
            waiters = [asyncio.ensure_future(journal.durable()) for _ in range(3)]
            store.release()
            for waiter in waiters:
                with pytest.raises(StoreError, match="could not commit 1 record.*disk full") as got:
                    await waiter
                assert got.value.__cause__ is cause
            await writer  # the writer ends quietly: the error is not lost, it is handed over
            with pytest.raises(StoreError, match="disk full"):
                journal.append("w", "k", 1.0, {})
            with pytest.raises(StoreError, match="disk full"):
                await journal.durable()
            with pytest.raises(StoreError, match="disk full"):
                await journal.close()

    asyncio.run(main())


def test_a_cancelled_writer_fails_its_waiters() -> None:
    async def main() -> None:
        store = MemoryStore()
        journal = Journal(store)
        store.hold()
        with pytest.raises(ExceptionGroup):
            async with asyncio.TaskGroup() as tg:
                tg.create_task(journal.run())
                journal.append("w", "k", 0.0, {})
                await store.entered.wait()
                waiter = asyncio.ensure_future(journal.durable())
                await asyncio.sleep(0)
                raise RuntimeError("the engine failed")  # cancels the writer mid-commit
        with pytest.raises(StoreError, match="cancelled"):
            await waiter

    asyncio.run(main())


def test_backpressure_refuses_appends_beyond_the_bound_until_there_is_room() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        store.hold()
        for i in range(3):
            journal.append("w", "k", float(i), {})
        with pytest.raises(OverloadedError, match="journal.*3 waiting"):
            journal.append("w", "k", 9.0, {})
        assert journal.stats.pending == 3
        room = asyncio.ensure_future(journal.room())
        await store.entered.wait()
        assert not room.done()
        store.release()
        await room
        assert journal.stats.pending < 3
        assert journal.append("w", "k", 3.0, {}) == 4

    with_journal(body, max_pending=3)


def test_bad_options_and_appending_after_close_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="max_pending"):
        Journal(MemoryStore(), max_pending=0)

    async def main() -> None:
        journal = Journal(MemoryStore())
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            await journal.close()
        with pytest.raises(UsageError, match="closed"):
            journal.append("w", "k", 0.0, {})

    asyncio.run(main())


def test_append_json_keeps_small_events_as_given_and_moves_large_fields() -> None:
    async def main() -> None:
        store = MemoryStore()
        journal = Journal(store, inline_limit=64)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            small = '{"task":"a","at":1.0}'
            assert journal.append_json("w", "k", 1.0, small) == 1
            big = json.dumps({"task": "b", "result": "x" * 500})
            assert journal.append_json("w", "k", 2.0, big) == 2
            await journal.close()
        events = [e for batch in store.batches for e in batch.events]
        assert events[0].data == small and not events[0].refs
        assert set(events[1].refs) == {"result"}
        assert json.loads(events[1].data)["result"] == {"$ref": events[1].refs["result"]}

    asyncio.run(main())


GOLDEN = Path(__file__).parent / "golden" / "replay_run.jsonl"


def test_append_event_writes_what_the_event_adapter_writes() -> None:
    """The journal encodes with a serializer per event class; the text must be the union's."""
    events: list[Any] = [
        EVENT_ADAPTER.validate_json(line) for line in GOLDEN.read_text().splitlines()
    ]
    events += [
        DeadlineMissed(workflow="w", deadline=2.5, at=3.0),
        DeadlineHopeless(workflow="w", deadline=2.5, remaining=4.0, at=1.0),
        CallRetrying(workflow="w", task="t", backend="b", attempt=1, error="e", delay=0.5, at=1),
        TaskReplaced(workflow="w", task="t", action=ActionSpec("tool", "search", {"q": "x"}), at=1),
        EdgeRemoved(workflow="w", source="a", target="b", at=1.0),
        WorkflowResumed(workflow="w", program=3, deadline=None, rerun=("a", "b"), at=2.0),
        TaskSucceeded(
            workflow="w",
            task="t",
            duration=0.1,
            result={"text": "\u00e9\n", "n": [1, 2.5, None]},
            usage=Usage(prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=2),
            at=1.0,
        ),
    ]
    every_kind = {cls.__dataclass_fields__["kind"].default for cls in get_args(get_args(Event)[0])}
    assert {event.kind for event in events} == every_kind

    async def body(journal: Journal, store: MemoryStore) -> None:
        for event in events:
            journal.append_event("w", event)
        await journal.durable()
        written = [record.data for record in store.log["w"]]
        assert written == [EVENT_ADAPTER.dump_json(event).decode() for event in events]

    with_journal(body)


def test_records_without_references_share_one_empty_mapping_that_pickles() -> None:
    async def body(journal: Journal, store: MemoryStore) -> None:
        journal.append_event("w", DeadlineMissed(workflow="w", deadline=2.5, at=3.0))
        await journal.durable()
        (record,) = store.log["w"]
        assert record.refs == {} and not record.refs
        assert pickle.loads(pickle.dumps(record)) == record
        assert copy.deepcopy(record).refs is record.refs

    with_journal(body)


class Outage:
    """The writer's clock while the store is down: each wait the writer makes moves time on
    by its length, and the store comes back after `back_after` waits (never, if None)."""

    def __init__(self, store: MemoryStore, back_after: int | None) -> None:
        self.store, self.back_after = store, back_after
        self.time = 0.0
        self.waits: list[float] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.time += seconds
        if self.back_after is not None and len(self.waits) >= self.back_after:
            self.store.fail_with = None
        await asyncio.sleep(0)


def test_a_store_that_comes_back_loses_nothing_and_the_waiters_just_wait() -> None:
    async def main() -> None:
        store = MemoryStore()
        outage = Outage(store, back_after=4)
        journal = Journal(store, patience_s=60.0, sleep=outage.sleep, now=outage.now)
        store.fail_with = StoreError("the database cannot be reached", transient=True)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            for i in range(3):
                journal.append("w", "k", float(i), {"i": i})
            await journal.durable()  # waits out the outage, then returns
            assert len(outage.waits) == 4 and outage.waits == sorted(outage.waits)
            assert journal.outages == 1 and not journal.outage
            journal.append("w", "k", 3.0, {"i": 3})
            await journal.close()
        assert [r.seq for r in store.log["w"]] == [1, 2, 3, 4]

    asyncio.run(main())


def test_a_commit_whose_answer_was_lost_is_not_written_twice() -> None:
    # The connection broke after COMMIT: the batch is in, the writer was told it failed.
    class LostAnswer(MemoryStore):
        async def append(self, batch: Any) -> None:
            await super().append(batch)
            if len(self.batches) == 1:
                raise StoreError("server closed the connection unexpectedly", transient=True)

    async def main() -> None:
        store = LostAnswer()
        outage = Outage(store, back_after=None)
        journal = Journal(store, sleep=outage.sleep, now=outage.now)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            journal.append("w", "k", 0.0, {})
            journal.append("w", "k", 1.0, {})
            await journal.durable()
            journal.append("w", "k", 2.0, {})
            await journal.close()
        assert [r.seq for r in store.log["w"]] == [1, 2, 3]  # MemoryStore asserts no gap
        assert len(outage.waits) == 1

    asyncio.run(main())


def test_an_outage_longer_than_the_patience_fails_as_before() -> None:
    async def main() -> None:
        store = MemoryStore()
        outage = Outage(store, back_after=None)
        journal = Journal(store, patience_s=5.0, sleep=outage.sleep, now=outage.now)
        store.fail_with = StoreError("No space left on device", transient=True)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            journal.append("w", "k", 0.0, {})
            with pytest.raises(StoreError, match="could not commit 1 record.*No space left"):
                await journal.durable()
        assert 5.0 <= outage.time < 5.0 + 2.0 * 2  # gave up after its patience, not before

    asyncio.run(main())


def test_a_failure_that_will_not_pass_is_not_waited_for() -> None:
    async def main() -> None:
        store = MemoryStore()
        outage = Outage(store, back_after=None)
        journal = Journal(store, sleep=outage.sleep, now=outage.now)
        store.fail_with = StoreError("event 3 of 'w' does not follow 1")  # not transient
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            journal.append("w", "k", 0.0, {})
            with pytest.raises(StoreError, match="does not follow"):
                await journal.durable()
        assert outage.waits == []

    asyncio.run(main())
