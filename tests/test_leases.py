"""Several engines on one store: leases, the fence on every write, claiming with SKIP LOCKED,
and take-over by a live engine, on SQLite and PostgreSQL. (Three engine processes and a
SIGKILL: tests/test_cluster.py.)"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import pytest
from conftest import StoreFactory

from orchestrator import Cluster, Engine, Registry, SystemClock, UsageError, Workflow
from orchestrator.cluster._cluster import Leases
from orchestrator.ext import EventRecord, LeaseLostError, StoreBatch, WorkflowRow, rebuild
from orchestrator.model._events import EVENT_ADAPTER


def ev(workflow: str, seq: int, kind: str = "k") -> EventRecord:
    return EventRecord(workflow=workflow, seq=seq, kind=kind, at=float(seq), data="{}")


def row(id: str, status: str = "running", created: float = 1.0) -> WorkflowRow:
    return WorkflowRow(
        id=id,
        name="w",
        status=status,  # type: ignore[arg-type]
        created=created,
        updated=created,
        finished=None if status == "running" else created,
    )


def start(owner: str, *ids: str, lease_s: float = 60.0, created: float = 1.0) -> StoreBatch:
    """What an engine's first commit of new runs looks like: their first event and row."""
    return StoreBatch(
        events=[ev(i, 1) for i in ids],
        workflows=[row(i, created=created + n) for n, i in enumerate(ids)],
        owner=owner,
        lease_s=lease_s,
    )


def test_a_new_run_is_leased_to_the_engine_that_wrote_it(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            before = time.time()
            await store.append(start("a", "w1"))
            stored = await store.workflow("w1")
            assert stored is not None and stored.owner == "a"
            assert stored.lease_until is not None and stored.lease_until > before + 50
            # Its later writes are the owner's: they go in, and the lease stays.
            await store.append(StoreBatch(events=[ev("w1", 2)], owner="a", lease_s=60.0))
            assert await store.last_seq("w1") == 2

    asyncio.run(main())


def test_nothing_is_claimed_while_its_lease_holds_and_renewing_keeps_it(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with make_store() as store:
            await store.append(start("a", "w1", "w2"))
            assert await store.claim("b", 60.0, 10) == []
            assert await store.renew("a", 60.0) == 2
            assert await store.renew("nobody", 60.0) == 0
            assert await store.claim("b", 60.0, 10) == []

    asyncio.run(main())


def test_a_run_whose_lease_ran_out_is_claimed_and_its_old_owner_is_fenced_out(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with make_store() as store:
            # A lease of -1 s has run out already: what an engine that died leaves.
            await store.append(start("a", "w1", lease_s=-1.0))
            await store.append(start("a", "w2", lease_s=60.0, created=5.0))
            claimed = await store.claim("b", 60.0, 10)
            assert [(c.workflow, c.previous) for c in claimed] == [("w1", "a")]
            stored = await store.workflow("w1")
            assert stored is not None and stored.owner == "b"
            # "a" comes back and writes to both: the whole batch is refused, naming w1.
            batch = StoreBatch(events=[ev("w1", 2), ev("w2", 2)], owner="a", lease_s=60.0)
            with pytest.raises(LeaseLostError, match="1 workflow") as caught:
                await store.append(batch)
            assert caught.value.workflows == ("w1",)
            assert await store.last_seq("w1") == 1 and await store.last_seq("w2") == 1
            # The new owner writes; renewing is per owner.
            await store.append(StoreBatch(events=[ev("w1", 2)], owner="b", lease_s=60.0))
            assert await store.renew("a", 60.0) == 1 and await store.renew("b", 60.0) == 1

    asyncio.run(main())


def test_finished_runs_are_never_claimed_and_released_ones_are_at_once(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with make_store() as store:
            await store.append(start("a", "w1", "w2", "w3"))
            done = row("w3", "succeeded")
            await store.append(
                StoreBatch(events=[ev("w3", 2)], workflows=[done], owner="a", lease_s=60.0)
            )
            assert await store.release("a", ["w1"]) == 1
            claimed = await store.claim("b", 60.0, 10)
            assert [(c.workflow, c.previous) for c in claimed] == [("w1", None)]
            assert await store.release("a") == 1  # w2; w3 is finished
            assert [c.workflow for c in await store.claim("b", 60.0, 10)] == ["w2"]
            assert await store.claim("c", 60.0, 10) == []

    asyncio.run(main())


def test_engines_claiming_at_once_split_the_runs_without_overlap(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with make_store() as store:
            ids = [f"w{i:03d}" for i in range(90)]
            await store.append(start("dead", *ids, lease_s=-1.0))
            async with make_store() as other, make_store() as third:
                stores = ((store, "a"), (other, "b"), (third, "c"))
                got = await asyncio.gather(*(s.claim(o, 60.0, 40) for s, o in stores))
            taken = [c.workflow for batch in got for c in batch]
            assert len(taken) == len(set(taken)) == 90
            for owner, batch in zip("abc", got, strict=True):
                for c in batch:
                    stored = await store.workflow(c.workflow)
                    assert stored is not None and stored.owner == owner

    asyncio.run(main())


# --- engines ---------------------------------------------------------------------------------


class Gate:
    """Where the first engine's task waits; counts how often each step ran."""

    opened: ClassVar[asyncio.Event]
    reached: ClassVar[asyncio.Event]
    ran: ClassVar[dict[str, int]]

    @classmethod
    def reset(cls) -> None:
        cls.opened, cls.reached, cls.ran = asyncio.Event(), asyncio.Event(), {}


def first() -> str:
    Gate.ran["first"] = Gate.ran.get("first", 0) + 1
    return "one"


async def held(ctx: object) -> str:
    Gate.ran["held"] = Gate.ran.get("held", 0) + 1
    Gate.reached.set()
    await Gate.opened.wait()
    return "two"


def flow() -> Workflow:
    wf = Workflow("leased")
    wf.add("first", first)
    wf.add("held", held, after=["first"])
    return wf


def test_an_engine_that_stops_renewing_loses_its_run_to_another_that_finishes_it_once(
    make_store: StoreFactory,
) -> None:
    """Engine a runs a workflow to its second task and stops renewing (as a stalled
    process would); engine b claims it once the lease ran out and resumes it; a then wakes
    up and finishes its task: its write is refused, its caller told, and the store holds one
    finish, b's."""

    async def main() -> None:
        Gate.reset()
        async with make_store() as sa_, make_store() as sb:
            a = Engine(store=sa_, cluster=Cluster(lease_s=0.4, engine_id="a", take_over=False))
            b = Engine(store=sb, cluster=Cluster(lease_s=0.4, engine_id="b", registry=Registry()))
            async with a, b:
                handle = a.submit(flow())
                await Gate.reached.wait()
                assert a._lease_task is not None
                a._lease_task.cancel()  # a stalls: no more heartbeats
                assert b.leases is not None
                await asyncio.wait_for(b.leases.claimed.wait(), 20)
                resumed = b.handle(handle.id)
                assert resumed is not None
                Gate.opened.set()
                with pytest.raises(LeaseLostError, match="another engine took them over"):
                    await asyncio.wait_for(handle.result(), 20)
                result = await asyncio.wait_for(resumed.result(), 20)
                assert result.ok and result.results["held"] == "two"
                assert b.leases.stats.claimed == 1
                assert a.leases is not None and a.leases.stats.lost == 1
            finished = [e for e in await sb.events(handle.id) if e.kind == "workflow_finished"]
            assert len(finished) == 1
            stored = await sb.workflow(handle.id)
            assert stored is not None and stored.status == "succeeded" and stored.owner == "b"
            assert Gate.ran == {"first": 1, "held": 2}  # the held task ran again, first did not

    asyncio.run(main())


def test_a_clean_shutdown_hands_the_runs_left_to_another_engine_at_once(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        Gate.reset()
        async with make_store() as sa_, make_store() as sb:
            async with Engine(store=sa_, cluster=Cluster(lease_s=60, engine_id="a")) as a:
                handle = a.submit(flow())
                await Gate.reached.wait()
            stored = await sb.workflow(handle.id)
            assert stored is not None and stored.owner is None and stored.status == "running"
            Gate.reset()
            Gate.opened.set()
            b = Engine(store=sb, cluster=Cluster(lease_s=60, engine_id="b"))
            async with b:
                assert b.leases is not None
                await asyncio.wait_for(b.leases.claimed.wait(), 20)
                resumed = b.handle(handle.id)
                assert resumed is not None and (await resumed.result()).ok
                assert b.leases.stats.claimed == 1

    asyncio.run(main())


def test_a_cancel_asked_through_the_store_reaches_the_engine_that_holds_or_claims_it(
    make_store: StoreFactory,
) -> None:
    """No notifier: a cancel asked of a run engine a holds is found at a's next heartbeat;
    one asked of a run that waits to be taken over is ended as cancelled by the engine that
    claims it, without running any of it. A run that finished cannot be asked."""

    async def main() -> None:
        Gate.reset()
        async with make_store() as sa_, make_store() as sb:
            async with Engine(store=sa_, cluster=Cluster(lease_s=0.4, engine_id="a")) as a:
                handle = a.submit(flow())
                await Gate.reached.wait()
                assert a.journal is not None
                await a.journal.durable()  # its row is in the store
                assert await sb.ask_cancel(handle.id, "asked elsewhere")
                assert await sb.cancels("b") == []
                result = await asyncio.wait_for(handle.result(), 20)
                assert result.status == "cancelled"
                assert result.cancelled["held"] == "asked elsewhere"
                assert not await sb.ask_cancel(handle.id, "too late")
                Gate.reset()
                second = a.submit(flow())
                await Gate.reached.wait()
            stored = await sb.workflow(second.id)
            assert stored is not None and stored.owner is None  # released at shutdown
            assert await sb.ask_cancel(second.id, "asked while nobody held it")
            Gate.reset()
            # b cannot even resume it (no registry): it ends it as cancelled without running it.
            b = Engine(store=sb, cluster=Cluster(lease_s=0.4, engine_id="b"))
            async with b:
                assert b.leases is not None
                await asyncio.wait_for(b.leases.claimed.wait(), 20)
                assert b.handle(second.id) is None
                assert b.leases.stats.cancelled == 1
            assert Gate.ran == {}  # nothing of it ran again
            stored = await sb.workflow(second.id)
            assert stored is not None and stored.status == "cancelled"
            kinds = [(e.kind, e.seq) for e in await sb.events(second.id)]
            assert kinds[-2][0] == "task_cancelled" and kinds[-1][0] == "workflow_finished"
            assert [seq for _, seq in kinds] == list(range(1, len(kinds) + 1))
            image = rebuild(
                [EVENT_ADAPTER.validate_json(e.data) for e in await sb.events(second.id)]
            )
            assert image.status == "cancelled"
            assert image.tasks["held"].state == "cancelled"
            assert image.tasks["first"].state == "done"
            assert not await sb.ask_cancel(second.id, "again")

    asyncio.run(main())


def test_a_cancel_that_fails_does_not_stop_the_heartbeat(make_store: StoreFactory) -> None:
    """A run that cannot be cancelled (here the callback raises) is logged; the heartbeat
    goes on renewing."""

    async def main() -> None:
        async with make_store() as store:
            await store.append(start("a", "w1", "w2"))
            assert await store.ask_cancel("w1", "stop")
            tried: list[str] = []

            def cancel(workflow: str, reason: str) -> None:
                tried.append(workflow)
                raise RuntimeError("no such run here")

            async def resume(ids: object) -> list[str]:
                return []

            leases = Leases(
                Cluster(lease_s=5, engine_id="a", take_over=False),
                store,
                store,
                SystemClock(),
                room=lambda: 0,
                resume=resume,
                let_go=lambda workflow: None,
                mine=lambda: ["w1", "w2"],
                cancel=cancel,
            )
            await leases.beat()
            await leases.beat()
            assert tried == ["w1", "w1"] and leases.stats.renewals == 2
            assert await store.cancels("a") == [("w1", "stop")]

    asyncio.run(main())


def test_a_cluster_needs_a_store_and_sane_settings() -> None:
    with pytest.raises(UsageError, match="store="):
        Engine(cluster=Cluster())
    with pytest.raises(UsageError, match="lease_s"):
        Cluster(lease_s=0)
    with pytest.raises(UsageError, match="claim_batch"):
        Cluster(claim_batch=0)


def test_an_idempotency_key_is_taken_once_across_engines(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as one, make_store() as two:
            assert await one.reserve_key("t", "k", "d1", stale_s=60) == (True, "d1", None)
            # Another engine, while the first is starting its workflow: not yet named.
            assert await two.reserve_key("t", "k", "d1", stale_s=60) == (False, "d1", None)
            await one.name_key("t", "k", "wf-1")
            assert await two.reserve_key("t", "k", "d1", stale_s=60) == (False, "d1", "wf-1")
            assert await two.reserve_key("t", "k", "d2", stale_s=60) == (False, "d1", "wf-1")
            assert await two.reserve_key("u", "k", "d2", stale_s=60) == (True, "d2", None)
            # A request refused after taking its key frees it; one whose engine died
            # before naming its workflow frees it after stale_s.
            await two.name_key("u", "k", None)
            assert await one.reserve_key("u", "k", "d3", stale_s=60) == (True, "d3", None)
            assert await two.reserve_key("u", "k", "d3", stale_s=-1) == (True, "d3", None)

    asyncio.run(main())


@pytest.mark.parametrize("make_store", ["postgresql"], indirect=True)  # a cluster's store
def test_engines_opening_a_fresh_store_together_do_not_trip_on_each_other(
    make_store: StoreFactory,
) -> None:
    """A cluster's engines start at once: each creates the schema and tables if missing
    (before the migration lock came first, CREATE SCHEMA IF NOT EXISTS failed in one)."""

    async def main() -> None:
        stores = [make_store() for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        try:
            assert await stores[0].unfinished() == []
        finally:
            for s in stores:
                await s.close()

    asyncio.run(main())
