"""Text a store cannot keep is refused whole at append, a row holding such text (written
before that check) poisons no other row's query, and a store error names no part of the
database's URL. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import re

import asyncpg
import pytest
from conftest import PG_HOST, StoreFactory
from test_service import Api, B, on_stores

from memory import SQLStore
from memory import _schema as schema
from orchestrator import StoreError
from orchestrator.durability._journal import Journal
from orchestrator.ext import EventRecord, StoreBatch, TextNotStorableError, WorkflowRow, unstorable


def row(id: str, tenant: str, **labels: str) -> WorkflowRow:
    return WorkflowRow(
        id=id, name="n", status="running", created=1.0, updated=1.0, tenant=tenant, labels=labels
    )


def ev(workflow: str, seq: int, data: str = "{}") -> EventRecord:
    return EventRecord(workflow, seq, "k", float(seq), data)


def test_text_no_store_can_keep_is_refused_whole_at_append(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            bad_batches = [
                StoreBatch(events=[ev("nul", 1)], workflows=[row("nul", "a", job="x\x00y")]),
                StoreBatch(events=[ev("sur", 1)], workflows=[row("sur", "a", key="\udcff")]),
                StoreBatch(events=[ev("ok", 1), ev("data", 1, '{"t":"\udcff"}')]),
                StoreBatch(workflows=[row("named\x00", "a")]),
            ]
            for batch, workflow in zip(
                bad_batches, ["nul", "sur", "data", "named\x00"], strict=True
            ):
                with pytest.raises(TextNotStorableError) as caught:
                    await store.append(batch)
                assert caught.value.workflows == (workflow,)
                assert "which the store cannot keep" in str(caught.value)
                assert unstorable(str(caught.value)) is None  # the message itself is storable
            # Nothing of any refused batch was written, the good event in one included.
            assert await store.workflows() == []
            assert await store.events("ok") == []
            # Text that only looks odd is kept as it is.
            odd = row("odd", "a", job='say "hi" \\u0000 ü 😀', **{"ключ": "\\"})
            await store.append(
                StoreBatch(events=[ev("odd", 1, '{"t":"\\u0000"}')], workflows=[odd])
            )
            assert (await store.workflow("odd")) == odd
            assert (await store.events("odd"))[0].data == '{"t":"\\u0000"}'

    asyncio.run(main())


def test_a_row_postgresql_cannot_parse_poisons_no_other_query(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            await store.append(StoreBatch(workflows=[row("b1", "b", job="batch-1", x='a"b')]))
            await store.append(StoreBatch(workflows=[row("b2", "b", job="batch-12")]))
            # Rows as a store without the append check wrote them: labels PostgreSQL's JSON
            # functions cannot read (an escaped NUL, a lone surrogate).
            async with store.engines[0].begin() as conn:
                for i, value in enumerate(["x\x00", "\udcff", "\ud83d"]):
                    await conn.execute(
                        schema.workflows.insert().values(
                            id=f"old{i}",
                            name="n",
                            status="running",
                            priority="batch",
                            created=2.0,
                            updated=2.0,
                            tenant="a",
                            labels={"job": value},
                        )
                    )
            found = await store.workflows(labels={"job": "batch-1"})
            assert [r.id for r in found] == ["b1"]  # exact: not batch-12
            found = await store.workflows(tenant="b", labels={"job": "batch-12"})
            assert [r.id for r in found] == ["b2"]
            assert [r.id for r in await store.workflows(labels={"x": 'a"b'})] == ["b1"]
            assert await store.workflows(labels={"x": "a"}) == []
            assert len(await store.workflows()) == 5

    asyncio.run(main())


def test_a_store_error_names_no_part_of_the_database_url(pg_user: str) -> None:
    name = f"plait_redact_{os.getpid()}"

    async def main() -> None:
        url = f"postgresql+asyncpg://{pg_user}@{PG_HOST}/test"
        admin = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
        try:
            async with SQLStore(url, schema=name) as store:
                await admin.execute(f'DROP SCHEMA "{name}" CASCADE')  # the tables go away
                with pytest.raises(StoreError) as caught:
                    await store.events("w")
            message = str(caught.value)
            assert "does not exist" in message
            host, port = PG_HOST.split(":")
            for part in (pg_user, host, port, "test"):
                assert not re.search(rf"(?<![\w.-]){re.escape(part)}(?![\w.-])", message), (
                    part,
                    message,
                )
        finally:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            await admin.close()

        unreachable = SQLStore("postgresql+asyncpg://nobody:pw@127.0.0.1:1/secretdb")
        with pytest.raises(StoreError, match="cannot be reached") as caught:
            await unreachable.open()
        message = str(caught.value)
        for part in ("nobody", "pw", "127.0.0.1", "secretdb", ":1"):
            assert part not in message, (part, message)

    asyncio.run(main())


def test_a_refused_workflow_leaves_the_rest_of_its_group_commit(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store, asyncio.TaskGroup() as tg:
            refused: list[tuple[str, ...]] = []
            journal = Journal(store, on_refused=lambda ws, _: refused.append(tuple(ws)))
            writer = tg.create_task(journal.run())
            journal.append("good", "k", 1.0, {"n": 1})
            journal.upsert(row("good", "a", job="1"))
            journal.append("bad", "k", 1.0, {"n": 1})
            journal.upsert(row("bad", "b", job="x\x00"))
            await journal.durable()  # one group commit; the bad workflow is refused in it
            journal.append("good", "k", 2.0, {"n": 2})
            journal.append("bad", "k", 2.0, {"n": 2})  # let go: dropped
            await journal.close()
            await writer
            assert refused == [("bad",)]
            assert isinstance(journal.refusal("bad"), TextNotStorableError)
            assert [e.seq for e in await store.events("good")] == [1, 2]
            assert await store.events("bad") == [] and await store.workflow("bad") is None
            assert [r.id for r in await store.workflows(labels={"job": "1"})] == ["good"]

    asyncio.run(main())


def test_one_tenants_unstorable_label_stops_no_other_tenant(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        spec = {"name": "w", "tasks": [{"id": "a", "function": "join"}]}
        status, error, _ = await api.call(
            "POST", "/v1/workflows", {**spec, "labels": {"t": "a\x00"}}
        )
        refused = status, error
        status, accepted, _ = await api.call(
            "POST", "/v1/workflows", {**spec, "labels": {"t": "b"}}, B
        )
        assert status == 202, accepted
        status, listed, _ = await api.call("GET", "/v1/workflows?label=t=b", headers=B)
        assert status == 200 and [w["id"] for w in listed["workflows"]] == [accepted["id"]]
        status, listed, _ = await api.call("GET", "/v1/workflows?label=t=a", headers=B)
        assert status == 200 and listed["workflows"] == []
        # A batch looks its rows up by label across every workflow in the store.
        rows = {"rows": [{"custom_id": "q", "prompt": "hi"}]}
        status, batch, _ = await api.call("POST", "/v1/batches", rows, B)
        assert status == 202, batch
        job = api.service.batches.get("beta", batch["id"]).task
        assert job is not None
        await asyncio.shield(job)
        status, batch, _ = await api.call("GET", f"/v1/batches/{batch['id']}", headers=B)
        assert status == 200 and batch["state"] == "completed", batch
        status, ready, _ = await api.call("GET", "/readyz")
        assert status == 200, ready
        assert refused[0] == 400, refused  # refused, not stored where it poisons reads

    on_stores(make_store, body)


def test_an_idempotency_key_no_store_can_keep_is_refused(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            for key in ("k\x00", "k\udcff"):
                with pytest.raises(TextNotStorableError, match="idempotency key"):
                    await store.reserve_key("a", key, "d" * 64, stale_s=10)
            assert await store.reserve_key("a", "k", "d" * 64, stale_s=10) == (True, "d" * 64, None)

    asyncio.run(main())
