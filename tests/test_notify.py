"""Wake-ups between processes: PostgreSQL LISTEN/NOTIFY and Redis pub/sub carry a hint
from one notifier to another, and peer messages and blackboard posts written through one
store connection reach a receiver waiting on another at once, with polling turned off
(every "process" here has its own connections and notifier)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from conftest import PG_HOST

from agents import Address, Board, Helper, PostOffice
from memory import PgNotifier, RedisNotifier, SQLBoardStore, SQLMailStore, SQLStore
from orchestrator import StoreError
from orchestrator.ext import Notifier

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def pg_url(pg_user: str) -> AsyncIterator[str]:
    schema = f"plait_notify_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    yield f"postgresql+asyncpg://{pg_user}@{PG_HOST}/test?schema={schema}"

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()

    asyncio.run(drop())


def redis_up() -> bool:
    async def ping() -> bool:
        try:
            async with RedisNotifier(REDIS_URL):
                return True
        except StoreError:
            return False

    return asyncio.run(ping())


def notifiers(kind: str, pg_url: str) -> Callable[[], Any]:
    if kind == "redis":
        if not redis_up():
            pytest.skip(f"no Redis at {REDIS_URL}")
        return lambda: RedisNotifier(REDIS_URL)
    return lambda: PgNotifier(pg_url)


@pytest.mark.parametrize("kind", ["postgresql", "redis"])
def test_a_notification_reaches_a_listener_on_another_connection(kind: str, pg_url: str) -> None:
    make = notifiers(kind, pg_url)
    channel = f"plait_test_{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        got: asyncio.Queue[str] = asyncio.Queue()
        async with make() as listener, make() as sender:
            assert isinstance(listener, Notifier)
            await listener.listen(channel, got.put_nowait)
            await sender.notify(channel, "hello")
            assert await asyncio.wait_for(got.get(), 10) == "hello"
            await sender.notify("another-channel", "not for it")
            await sender.notify(channel, "again")
            assert await asyncio.wait_for(got.get(), 10) == "again"

    asyncio.run(main())


class Watched(SQLMailStore):
    """The SQL mail store, saying when a receiver has looked at its mailbox."""

    def __init__(self, store: SQLStore) -> None:
        super().__init__(store)
        self.looked = asyncio.Event()

    async def lease(self, *args: Any, **kw: Any) -> Any:
        found = await super().lease(*args, **kw)
        self.looked.set()
        return found


@contextlib.asynccontextmanager
async def process(url: str, make: Callable[[], Any]) -> AsyncIterator[tuple[SQLStore, Any]]:
    """What one process has: its own store connections and its own notifier."""
    async with SQLStore(url) as store, make() as notifier:
        yield store, notifier


@pytest.mark.parametrize("kind", ["postgresql", "redis"])
def test_a_peer_message_wakes_a_receiver_in_another_process_without_polling(
    kind: str, pg_url: str
) -> None:
    make = notifiers(kind, pg_url)
    alice, bob = Address("acme", "wf-1", "alice"), Address("acme", "wf-1", "bob")

    async def main() -> None:
        async with process(pg_url, make) as (s1, n1), process(pg_url, make) as (s2, n2):
            # poll_s of an hour: only the notification can wake the receiver in time.
            mailbox = Watched(s1)
            receiver = PostOffice(mailbox, poll_s=3600, notifier=n1)
            sender = PostOffice(SQLMailStore(s2), poll_s=3600, notifier=n2)
            waiting = asyncio.ensure_future(receiver.receive(bob, wait_s=30))
            await mailbox.looked.wait()  # it found its mailbox empty: now it waits
            await sender.send(alice, bob, {"q": 1})
            got = await asyncio.wait_for(waiting, 20)
            assert [d.body for d in got] == [{"q": 1}]

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["postgresql", "redis"])
def test_a_post_on_one_board_reaches_a_volunteer_of_another_board_without_polling(
    kind: str, pg_url: str
) -> None:
    make = notifiers(kind, pg_url)

    async def main() -> None:
        async with process(pg_url, make) as (s1, n1), process(pg_url, make) as (s2, n2):
            worker_board = Board(SQLBoardStore(s1), notifier=n1)  # poll None: never
            poster_board = Board(SQLBoardStore(s2), notifier=n2)
            async with worker_board, poster_board:
                worker_board.join(Helper("sql", frozenset({"sql"}), lambda post, ctx: "done"))
                post = await poster_board.post("count rows", capabilities={"sql"})
                assert await asyncio.wait_for(poster_board.answer_of(post), 20) == "done"

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["postgresql", "redis"])
def test_routers_of_two_engines_keep_a_programs_calls_on_one_replica_over_the_network(
    kind: str, pg_url: str
) -> None:
    """As tests/test_router_cluster.py over the in-process hub, but each router has its own
    notifier connection (what `plait serve` sets up in a cluster): turn t of each of eight
    conversations goes through router t % 2, and every conversation stays on one replica.
    The conversations take their turns together: a router moves a prefix off a replica
    whose load or recent work runs ahead of the others' (`PrefixRouter`), and conversations
    left to their own pace on a busy machine were seen moved so, with every placement
    heard."""
    from executors import FunctionLLM, Router
    from orchestrator import Hints, LLMRequest, Message

    make = notifiers(kind, pg_url)
    system = "You are one of many agents sharing this long system prompt. " * 20
    llms = {f"r{i}": FunctionLLM(lambda req, hints, i=i: f"r{i}", latency=0.01) for i in range(4)}
    channel = f"plait_router_test_{uuid.uuid4().hex[:8]}"

    async def main() -> dict[str, list[str]]:
        async with make() as n1, make() as n2:
            routers = [Router(llms, health_interval_s=None), Router(llms, health_interval_s=None)]
            for router, notifier in zip(routers, (n1, n2), strict=True):
                router.join_peers(notifier, channel)
            async with routers[0], routers[1]:
                where: dict[str, list[str]] = {}
                heard = asyncio.Event()  # set on every frame either link hears
                await n1.listen(channel, lambda _: heard.set())
                await n2.listen(channel, lambda _: heard.set())
                turn = asyncio.Barrier(8)

                async def reached(peer: Router, sent: int) -> None:
                    """Wait until `peer` has heard `sent` placements of the other router and
                    the end of each: a call it still counts in flight weighs on its replica's
                    load, and it may move a prefix off that replica."""
                    while True:
                        heard.clear()
                        assert peer.peering is not None
                        seen = peer.peering.stats()
                        if seen.received >= sent and seen.in_flight == 0:
                            return
                        await heard.wait()

                async def talk(name: str) -> None:
                    history = [Message("system", system)]
                    for t in range(6):
                        history.append(Message("user", f"{name} step {t}: " + "details " * 30))
                        request = LLMRequest(tuple(history), "m", max_tokens=8)
                        reply = await asyncio.wait_for(
                            routers[t % 2].complete(request, Hints(program_id=name)), 20
                        )
                        where.setdefault(name, []).append(reply.text)
                        history.append(Message("assistant", f"{name} answer {t}"))
                        # A tool runs between turns, long enough for the turn's placements
                        # and their ends to reach the other engine. Every call of the turn
                        # has ended (and published its end) once all have passed the barrier.
                        await asyncio.wait_for(turn.wait(), 20)
                        me = routers[t % 2].peering
                        assert me is not None
                        await asyncio.wait_for(
                            reached(routers[(t + 1) % 2], me.stats().published), 10
                        )

                await asyncio.gather(*(talk(f"c{c}") for c in range(8)))
                return where

    where = asyncio.run(main())
    assert all(len(set(replicas)) == 1 for replicas in where.values()), where
    assert len({replicas[0] for replicas in where.values()}) >= 3


@pytest.mark.parametrize("kind", ["postgresql", "redis"])
def test_a_long_documents_placement_reaches_the_other_router_in_pieces(
    kind: str, pg_url: str
) -> None:
    """The first call of a conversation over a 60,000-character document adds ~940 blocks:
    its placement (7.5 KB) is larger than a NOTIFY payload, so it travels in pieces. The
    second turn, sent through the other engine's router, finds the replica that holds it."""
    from executors import FunctionLLM, Router
    from orchestrator import Hints, LLMRequest, Message

    make = notifiers(kind, pg_url)
    llms = {f"r{i}": FunctionLLM(lambda req, hints, i=i: f"r{i}", latency=0.01) for i in range(4)}
    channel = f"plait_router_test_{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[dict[str, list[str]], int]:
        async with make() as n1, make() as n2:
            routers = [Router(llms, health_interval_s=None), Router(llms, health_interval_s=None)]
            for router, notifier in zip(routers, (n1, n2), strict=True):
                router.join_peers(notifier, channel)
            async with routers[0], routers[1]:
                heard = asyncio.Event()
                await n2.listen(channel, lambda _: heard.set())
                where: dict[str, list[str]] = {}
                for c in range(4):
                    document = f"document {c}: " + " ".join(f"w{c}x{i:05d}" for i in range(6_000))
                    history = [Message("system", document), Message("user", "summarise")]
                    first = await routers[0].complete(
                        LLMRequest(tuple(history), "m", max_tokens=8), Hints(program_id=f"c{c}")
                    )
                    sent = routers[0].peering.stats().published  # type: ignore[union-attr]
                    while routers[1].peering.stats().received < sent:  # type: ignore[union-attr]
                        heard.clear()
                        await asyncio.wait_for(heard.wait(), 10)
                    history += [Message("assistant", first.text), Message("user", "and then?")]
                    second = await routers[1].complete(
                        LLMRequest(tuple(history), "m", max_tokens=8), Hints(program_id=f"c{c}")
                    )
                    where[f"c{c}"] = [first.text, second.text]
                link = routers[0].peering.link  # type: ignore[union-attr]
                return where, link.pieced

    where, pieced = asyncio.run(main())
    assert pieced >= 4
    assert all(first == second for first, second in where.values()), where
