"""One contract for every `MailStore`, through the `PostOffice` that uses it: the same tests
on the in-process store, on SQLite (a file under tmp_path) and on the local PostgreSQL (a
schema of its own per test). Leases run on a `HandClock` the test sets: the SQL stores do
real I/O, which a VirtualClock would jump over, and these tests never wait (`wait_s=0`).
How a waiting `receive` wakes is tested at the end, on the virtual clock."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from conftest import PG_HOST, StoreFactory

from agents import (
    Address,
    Delivery,
    InProcessMailStore,
    MailScopeError,
    MailStore,
    MessageId,
    MessageNotJSONError,
    MessageTooLargeError,
    PostOffice,
)
from memory import SQLMailStore, SQLStore
from orchestrator import Engine, TaskContext, UsageError, VirtualClock, Workflow

T = TypeVar("T")

EPOCH = 1_800_000_000.0
VIS = 30.0


class HandClock:
    """A `Clock` whose time the test sets (`advance`); it keeps the system loop's time for
    waits, which these tests do not do."""

    def __init__(self) -> None:
        self.t = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def monotonic(self) -> float:
        return self.t

    def now(self) -> float:
        return EPOCH + self.t

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("contract tests never sleep")

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    def check_running_loop(self) -> None:
        raise AssertionError("contract tests never wait")


Stores = Callable[[], AbstractAsyncContextManager[MailStore]]


@pytest.fixture(params=["in-process", "sqlite", "postgresql"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """Opens mail stores on one database: every one sees the same messages (in-process: the
    same object)."""
    if request.param == "in-process":
        shared = InProcessMailStore()

        @asynccontextmanager
        async def local() -> AsyncIterator[MailStore]:
            yield shared

        yield local
        return
    user = ""
    if request.param == "sqlite":
        target, schema = str(tmp_path / "mail.db"), None
    else:
        user = request.getfixturevalue("pg_user")
        target = f"postgresql+asyncpg://{user}@{PG_HOST}/test"
        schema = f"plait_mail_{os.getpid()}_{uuid.uuid4().hex[:10]}"

    @asynccontextmanager
    async def sql() -> AsyncIterator[MailStore]:
        async with SQLStore(target, schema=schema) as store:
            yield SQLMailStore(store)

    yield sql
    if schema is not None:

        async def drop() -> None:
            import asyncpg

            conn = await asyncpg.connect(f"postgresql://{user}@{PG_HOST}/test")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

        asyncio.run(drop())


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


A = Address("acme", "wf-1", "alice")
B = A.peer("bob")
C = A.peer("carol")
R = A.peer("reader")


def bodies(deliveries: list[Delivery]) -> list[Any]:
    return [d.body for d in deliveries]


def test_the_sql_store_satisfies_the_protocol_structurally() -> None:
    assert isinstance(InProcessMailStore(), MailStore)
    assert isinstance(SQLMailStore(SQLStore("unused.db")), MailStore)


# --- order and acknowledgement -----------------------------------------------------------------


def test_messages_come_in_each_senders_order_with_their_fields(stores: Stores) -> None:
    async def main() -> None:
        clock = HandClock()
        async with stores() as store:
            office = PostOffice(store, clock=clock)
            sent = []
            for i in range(5):
                sent.append(await office.send(A, "reader", {"n": i}, kind="note"))
                clock.advance(1)
                sent.append(await office.send(B, R, [i, "b"]))
            assert [m.seq for m in sent if m.sender == A] == [1, 2, 3, 4, 5]
            got = await office.receive(R, limit=100, wait_s=0)
        assert [d.id for d in got] == sent  # oldest first; each sender's own order
        first = got[0]
        assert first == Delivery(
            id=MessageId(A, 1),
            to=R,
            body={"n": 0},
            kind="note",
            topic=None,
            sent_at=EPOCH,
            attempt=1,
            leased_until=EPOCH + 5 + VIS,
            receipt=first.receipt,
        )
        assert bodies(got)[1] == [0, "b"]
        assert office.stats.sent == 10 and office.stats.delivered == 10

    run(main())


def test_acked_messages_never_return_and_the_rest_come_again_after_the_lease(
    stores: Stores,
) -> None:
    async def main() -> None:
        clock = HandClock()
        async with stores() as store:
            office = PostOffice(store, clock=clock)
            for i in range(4):
                await office.send(A, R, i)
            got = await office.receive(R, limit=10, visibility_s=VIS, wait_s=0)
            assert bodies(got) == [0, 1, 2, 3]
            assert await office.ack(got[0], got[2]) == 2
            assert await office.ack(got[0]) == 0  # already acknowledged
            assert await office.receive(R, wait_s=0) == []  # still leased
            clock.advance(VIS - 0.5)
            assert await office.receive(R, wait_s=0) == []
            clock.advance(0.5)
            again = await office.receive(R, limit=10, visibility_s=VIS, wait_s=0)
            assert [(d.body, d.attempt) for d in again] == [(1, 2), (3, 2)]
            assert [d.id for d in again] == [got[1].id, got[3].id]  # de-duplicate on the id
            assert await office.ack(*again) == 2
            clock.advance(2 * VIS)
            assert await office.receive(R, wait_s=0) == []
        assert office.stats.redelivered == 2 and office.stats.acked == 4

    run(main())


def test_a_redelivery_is_never_overtaken_by_a_later_message_of_its_sender(
    stores: Stores,
) -> None:
    """While a sender's messages are leased, its later ones wait; other senders' do not."""

    async def main() -> None:
        clock = HandClock()
        async with stores() as store:
            office = PostOffice(store, clock=clock)
            for i in range(1, 6):
                await office.send(A, R, f"a{i}")
            await office.send(B, R, "b1")
            first = await office.receive(R, limit=2, visibility_s=VIS, wait_s=0)
            assert bodies(first) == ["a1", "a2"]
            # a3.. wait behind the leased a1, a2; bob's stream is free.
            from_bob = await office.receive(R, limit=10, wait_s=0)
            assert bodies(from_bob) == ["b1"]
            await office.ack(*from_bob)
            await office.ack(first[0])  # a2 is never acknowledged: its receiver failed
            assert await office.receive(R, limit=10, wait_s=0) == []
            clock.advance(VIS)
            second = await office.receive(R, limit=2, visibility_s=VIS, wait_s=0)
            assert [(d.body, d.attempt) for d in second] == [("a2", 2), ("a3", 1)]
            await office.ack(*second)
            third = await office.receive(R, limit=10, visibility_s=VIS, wait_s=0)
            assert bodies(third) == ["a4", "a5"]

    run(main())


def test_two_receivers_of_one_mailbox_share_it_without_breaking_a_stream(
    stores: Stores,
) -> None:
    """Two offices, each on its own connection to the database, receive at once."""

    async def main() -> None:
        clock = HandClock()
        async with stores() as s1, stores() as s2:
            one, two = PostOffice(s1, clock=clock), PostOffice(s2, clock=clock)
            for sender in (A, B, C):
                for i in range(3):
                    await one.send(sender, R, f"{sender.agent}{i}")
            got = await asyncio.gather(
                *(office.receive(R, limit=3, wait_s=0) for office in (one, two, one, two))
            )
        everything = [d for batch in got for d in batch]
        ids = [d.id for d in everything]
        assert len(ids) == len(set(ids))  # nothing handed out twice while leased
        for batch in got:
            # Whoever took a sender's stream took its messages in order from the first.
            by_sender: dict[Address, list[int]] = {}
            for d in batch:
                by_sender.setdefault(d.id.sender, []).append(d.id.seq)
            for seqs in by_sender.values():
                assert seqs == list(range(1, len(seqs) + 1))
        senders = [d.id.sender for d in everything]
        assert all(senders.count(s) in (0, 3) for s in (A, B, C))  # never split while leased

    run(main())


def test_senders_in_two_processes_get_distinct_sequence_numbers(stores: Stores) -> None:
    async def main() -> None:
        clock = HandClock()
        async with stores() as s1, stores() as s2:
            one, two = PostOffice(s1, clock=clock), PostOffice(s2, clock=clock)
            ids = await asyncio.gather(
                *(office.send(A, R, i) for i in range(10) for office in (one, two))
            )
            got = await one.receive(R, limit=100, wait_s=0)
        assert sorted(m.seq for m in ids) == list(range(1, 21))
        assert [d.id.seq for d in got] == list(range(1, 21))

    run(main())


# --- topics --------------------------------------------------------------------------------------


def test_a_topic_reaches_every_subscriber_once_under_one_id(stores: Stores) -> None:
    async def main() -> None:
        clock = HandClock()
        async with stores() as store:
            office = PostOffice(store, clock=clock)
            for agent in (B, C, R):
                await office.subscribe(agent, "news")
            await office.subscribe(R, "news")  # twice: still one copy
            published = await office.publish(A, "news", {"headline": "x"})
            late = A.peer("late")
            await office.subscribe(late, "news")  # after the publish: does not get it
            assert await office.unsubscribe(C, "news")
            assert not await office.unsubscribe(C, "news")
            second = await office.publish(A, "news", "second")
            for agent in (B, R):
                got = await office.receive(agent, limit=10, wait_s=0)
                assert [(d.id, d.topic, d.to) for d in got] == [
                    (published, "news", agent),
                    (second, "news", agent),
                ]
            assert bodies(await office.receive(C, wait_s=0)) == [{"headline": "x"}]
            assert bodies(await office.receive(late, wait_s=0)) == ["second"]
            assert await office.receive(A, wait_s=0) == []
            assert (published.seq, second.seq) == (1, 2)
        assert office.stats.published == 2 and office.stats.copies == 3 + 3

    run(main())


def test_direct_messages_and_publishes_of_a_sender_share_one_order(stores: Stores) -> None:
    async def main() -> None:
        async with stores() as store:
            office = PostOffice(store, clock=HandClock())
            await office.subscribe(R, "t")
            await office.send(A, R, "direct 1")
            await office.publish(A, "t", "topic 2")
            await office.send(A, R, "direct 3")
            got = await office.receive(R, limit=10, wait_s=0)
        assert [(d.id.seq, d.body) for d in got] == [
            (1, "direct 1"),
            (2, "topic 2"),
            (3, "direct 3"),
        ]

    run(main())


# --- isolation -----------------------------------------------------------------------------------


def test_workflows_do_not_see_each_others_mail(stores: Stores) -> None:
    async def main() -> None:
        async with stores() as store:
            office = PostOffice(store, clock=HandClock())
            other = Address("acme", "wf-2", "reader")  # same agent name, another workflow
            await office.send(A, R, "for wf-1")
            await office.subscribe(R, "t")
            await office.subscribe(other, "t")
            await office.publish(Address("acme", "wf-2", "alice"), "t", "wf-2's topic")
            assert bodies(await office.receive(other, limit=10, wait_s=0)) == ["wf-2's topic"]
            assert bodies(await office.receive(R, limit=10, wait_s=0)) == ["for wf-1"]
            with pytest.raises(MailScopeError, match=r"across_workflows=True"):
                await office.send(A, other, "oops")
            sent = await office.send(A, other, "on purpose", across_workflows=True)
            got = await office.receive(other, wait_s=0)
            assert [(d.body, d.id) for d in got] == [("on purpose", sent)]
            assert got[0].id.sender == A  # the receiver sees which workflow wrote
            assert await office.receive(R, wait_s=0) == []

    run(main())


def test_nothing_crosses_tenants(stores: Stores) -> None:
    async def main() -> None:
        async with stores() as store:
            office = PostOffice(store, clock=HandClock())
            rival = Address("rival", "wf-1", "reader")  # same workflow id and agent name
            with pytest.raises(MailScopeError, match=r"never cross tenants"):
                await office.send(A, rival, "leak", across_workflows=True)
            for agent in (R, rival):
                await office.subscribe(agent, "t")
                await office.subscribe(agent, "s", shared=True)
            await office.send(A, R, "mine")
            await office.publish(A, "t", "mine too")
            await office.publish(A, "s", "shared, mine", shared=True)
            assert await office.receive(rival, limit=10, wait_s=0) == []
            assert len(await office.receive(R, limit=10, wait_s=0)) == 3

    run(main())


def test_a_shared_topic_spans_the_tenants_workflows_and_no_further(stores: Stores) -> None:
    async def main() -> None:
        async with stores() as store:
            office = PostOffice(store, clock=HandClock())
            w2 = Address("acme", "wf-2", "reader")
            rival = Address("rival", "wf-2", "reader")
            plain = Address("acme", "wf-2", "plain")
            for agent in (R, w2, rival):
                await office.subscribe(agent, "alerts", shared=True)
            await office.subscribe(plain, "alerts")  # wf-2's own topic of that name
            sent = await office.publish(A, "alerts", "fire", shared=True)
            for agent in (R, w2):
                assert [d.id for d in await office.receive(agent, wait_s=0)] == [sent]
            assert await office.receive(rival, wait_s=0) == []
            assert await office.receive(plain, wait_s=0) == []
            await office.publish(Address("acme", "wf-2", "x"), "alerts", "wf-2 only")
            assert bodies(await office.receive(plain, wait_s=0)) == ["wf-2 only"]
            assert await office.receive(w2, wait_s=0) == []

    run(main())


# --- bad input -----------------------------------------------------------------------------------


def test_an_oversized_body_is_refused_naming_size_and_limit(stores: Stores) -> None:
    async def main() -> None:
        async with stores() as store:
            office = PostOffice(store, clock=HandClock(), max_bytes=100)
            await office.subscribe(R, "t")
            with pytest.raises(MessageTooLargeError, match=r"is 112 bytes .* limit of 100"):
                await office.send(A, R, "x" * 110)
            with pytest.raises(MessageTooLargeError) as info:
                await office.publish(A, "t", ["é" * 60])  # 120 bytes as UTF-8
            assert isinstance(info.value, UsageError)
            assert (info.value.size, info.value.limit) == (124, 100)
            fits = await office.send(A, R, "x" * 98)  # exactly 100 bytes
            got = await office.receive(R, limit=10, wait_s=0)
        assert [d.id for d in got] == [fits]  # nothing refused was kept, no seq spent
        assert fits.seq == 1
        assert office.stats.refused == 2

    run(main())


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({1, 2}, "body is a set"),
        ({"a": [1, float("nan")]}, r"body\['a'\]\[1\] is nan"),
        ({1: "x"}, "the key 1, a int"),
        ((1, 2), "body is a tuple"),
        ({"when": object()}, r"body\['when'\] is a object"),
    ],
)
def test_a_body_that_is_not_json_is_refused_naming_where(body: Any, where: str) -> None:
    async def main() -> None:
        office = PostOffice(clock=HandClock())
        with pytest.raises(MessageNotJSONError, match=where):
            await office.send(A, R, body)
        assert await office.receive(R, wait_s=0) == []
        assert office.stats.refused == 1

    run(main())


def test_bad_arguments_are_usage_errors() -> None:
    async def main() -> None:
        office = PostOffice(clock=HandClock())
        with pytest.raises(UsageError, match="Address.agent must be a string of 1 to 200"):
            Address("acme", "wf", "")
        with pytest.raises(UsageError, match="topic must be"):
            await office.subscribe(R, "x" * 201)
        with pytest.raises(UsageError, match="kind"):
            await office.send(A, R, 1, kind="")
        with pytest.raises(UsageError, match=r"receive\(limit=0\)"):
            await office.receive(R, limit=0)
        with pytest.raises(UsageError, match=r"ack\(\) takes the Delivery objects"):
            await office.ack("receipt-1")  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="needs a MailStore"):
            PostOffice(store=object())  # type: ignore[arg-type]

    run(main())


# --- durability ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stores", ["sqlite", "postgresql"], indirect=True)
def test_a_sent_message_is_there_for_a_store_opened_later(stores: Stores) -> None:
    async def main() -> None:
        clock = HandClock()
        async with stores() as store:
            await PostOffice(store, clock=clock).send(A, R, "kept")
            await PostOffice(store, clock=clock).subscribe(R, "t")
        async with stores() as store:
            office = PostOffice(store, clock=clock)
            await office.publish(A, "t", "after reopening")
            got = await office.receive(R, limit=10, wait_s=0)
        assert [(d.id.seq, d.body) for d in got] == [(1, "kept"), (2, "after reopening")]

    run(main())


# --- waiting (in-process store, virtual clock) ----------------------------------------------------


def test_a_waiting_receive_wakes_when_a_message_is_sent(clock: VirtualClock) -> None:
    async def main() -> None:
        office = PostOffice(clock=clock)

        async def later() -> None:
            await asyncio.sleep(7)
            await office.send(A, R, "hello")

        async with asyncio.TaskGroup() as group:
            group.create_task(later())
            got = await office.receive(R)
        assert bodies(got) == ["hello"]
        assert clock.monotonic() == 7

    clock.run(main())


def test_a_waiting_receive_gets_a_redelivery_when_the_lease_ends(clock: VirtualClock) -> None:
    async def main() -> None:
        office = PostOffice(clock=clock)
        await office.send(A, R, "again")
        await office.receive(R, visibility_s=12)  # never acknowledged
        got = await office.receive(R)
        assert [(d.body, d.attempt) for d in got] == [("again", 2)]
        assert clock.monotonic() == 12

    clock.run(main())


def test_a_receive_that_finds_nothing_returns_after_its_wait(clock: VirtualClock) -> None:
    async def main() -> None:
        office = PostOffice(clock=clock)
        assert await office.receive(R, wait_s=5) == []
        assert clock.monotonic() == 5
        assert await office.receive(R, wait_s=0) == []
        assert clock.monotonic() == 5

    clock.run(main())


# --- in a workflow -------------------------------------------------------------------------------


def test_tasks_message_each_other_and_an_oversized_message_fails_only_its_task(
    clock: VirtualClock,
) -> None:
    """A function task sends, another receives; a task whose message is too large fails
    with the error recorded, and the workflow carries on with everything else."""
    office = PostOffice(clock=clock, max_bytes=1000)

    async def producer(ctx: TaskContext) -> str:
        me = Address.of(ctx, "producer", tenant="acme")
        sent = await office.send(me, "consumer", {"rows": [1, 2, 3]})
        return str(sent.sender)

    async def oversized(ctx: TaskContext) -> None:
        await office.send(Address.of(ctx, "dumper", tenant="acme"), "consumer", "x" * 5000)

    async def consumer(ctx: TaskContext) -> int:
        me = Address.of(ctx, "consumer", tenant="acme")
        (delivery,) = await office.receive(me, limit=1)
        await office.ack(delivery)
        return sum(delivery.body["rows"])

    async def main() -> Any:
        wf = Workflow("mail")
        wf.add("consumer", consumer)
        wf.add("dump", oversized)
        wf.add("produce", producer)
        async with Engine(clock=clock) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert result.results == {"consumer": 6, "produce": "acme/mail/producer"}
    assert set(result.failures) == {"dump"}
    assert "5002 bytes of JSON, over the post office's limit of 1000" in result.failures["dump"]
    assert isinstance(result.errors["dump"], MessageTooLargeError)
    assert office.stats.refused == 1


def test_the_example_in_docs_messaging_runs(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "messaging.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/messaging.md", "exec"), namespace)
    results = asyncio.run(namespace["main"](str(tmp_path / "store.db")))
    assert results == {"plan": None, "code": "parse the CSV"}


def test_deleting_a_workflow_deletes_its_mail_and_keeps_what_it_sent(
    make_store: StoreFactory,
) -> None:
    # Retention (`store.retain`) and `plait runs delete` go through `store.delete`.
    async def main() -> None:
        old, live = Address("acme", "wf-old", "alice"), Address("acme", "wf-live", "bob")
        async with make_store() as store:
            office = PostOffice(SQLMailStore(store), clock=HandClock())
            await office.subscribe(old, "news")
            await office.send(live, old, "to the old one", across_workflows=True)
            await office.send(old, live, "from the old one", across_workflows=True)
            assert await _rows(store, "wf-old") == (1, 1, 1)
            assert await store.delete(["wf-old"]) == 0  # no workflow row: mail only
            assert await office.receive(old, wait_s=0) == []
            (kept,) = await office.receive(live, wait_s=0)
            assert kept.body == "from the old one" and kept.id.sender == old
            assert await _rows(store, "wf-old") == (0, 0, 1)  # the sender's numbering stays
            await office.ack(kept)
            await store.delete(["wf-old"])
            assert await _rows(store, "wf-old") == (0, 0, 0)

    run(main())


async def _rows(store: SQLStore, workflow: str) -> tuple[int, ...]:
    """Rows of `workflow` in the mail tables: its mailboxes, subscriptions, senders."""
    counts = []
    async with store.engines[0].begin() as conn:
        for table in ("plait_mail", "plait_mail_topics", "plait_mail_senders"):
            query = sa.text(f"SELECT count(*) FROM {table} WHERE workflow = :w")
            counts.append((await conn.execute(query, {"w": workflow})).scalar_one())
    return tuple(counts)


def test_a_closed_office_stops_listening_to_its_notifier() -> None:
    """Offices made and dropped on one long-lived notifier do not pile up listeners; a
    notified send still wakes a receiver waiting on another office (which never polls)."""
    from orchestrator.cluster._notify import LocalNotifier

    class Counting(LocalNotifier):
        def __init__(self) -> None:
            super().__init__()
            self.listening = 0

        async def listen(self, channel: str, listener: Callable[[str], None]) -> None:
            self.listening += 1
            await super().listen(channel, listener)

        def unlisten(self, channel: str, listener: Callable[[str], None]) -> None:
            self.listening -= 1
            super().unlisten(channel, listener)

    async def main() -> None:
        notifier = Counting()
        store = InProcessMailStore()
        async with PostOffice(store, notifier=notifier, poll_s=3600) as receiving:
            waiting = asyncio.create_task(receiving.receive(A.peer("bob"), wait_s=None))
            for _ in range(5):
                async with PostOffice(store, notifier=notifier) as office:
                    await office.receive(A, wait_s=0)
            await PostOffice(store, notifier=notifier).send(A, "bob", "hello")
            delivered = await asyncio.wait_for(waiting, 10)
            assert [d.body for d in delivered] == ["hello"]
            assert notifier.listening == 1  # the receiving office's
        assert notifier.listening == 0

    asyncio.run(main())
