"""One contract for every `Store`: the same tests on SQLite (a file under tmp_path) and on the
local PostgreSQL (a schema of its own per test, dropped afterwards, since other processes
test against the same database at the same time)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from conftest import StoreFactory
from sqlalchemy import event
from stored_runs import BIG_ERROR, BIG_RESULT, put_run, same_run, stored_image

from memory import SQLStore
from memory import _schema as schema
from orchestrator import StoreError, StoreVersionError
from orchestrator.durability._journal import Journal
from orchestrator.durability._store import payload_digest
from orchestrator.ext import EventRecord, StoreBatch, WorkflowRow, read_events

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@asynccontextmanager
async def opened(make_store: StoreFactory, **kw: Any) -> AsyncIterator[SQLStore]:
    async with make_store(**kw) as store:
        yield store


def ev(workflow: str, seq: int, data: str = "{}", **refs: str) -> EventRecord:
    return EventRecord(workflow=workflow, seq=seq, kind="k", at=float(seq), data=data, refs=refs)


def row(id: str, status: Any = "running", *, created: float = 1.0, **kw: Any) -> WorkflowRow:
    return WorkflowRow(
        id=id, name=f"name-{id}", status=status, created=created, updated=created, **kw
    )


# --- events ---------------------------------------------------------------------------------


def test_events_read_back_in_order_with_gap_free_seq(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            await store.append(StoreBatch(events=[ev("a", 1), ev("b", 1), ev("a", 2)]))
            await store.append(StoreBatch(events=[ev("a", 3, '{"x":1}')]))
            assert [e.seq for e in await store.events("a")] == [1, 2, 3]
            assert [e.seq for e in await store.events("a", after_seq=2)] == [3]
            assert [e.seq for e in await store.events("a", 0, limit=2)] == [1, 2]
            assert [e.seq for e in await store.events("a", 1, limit=5)] == [2, 3]
            assert (await store.events("a"))[2].data == '{"x":1}'
            assert await store.last_seq("a") == 3
            assert await store.last_seq("nobody") == 0
            # A gap, a duplicate, or a repeated seq inside one batch: refused, nothing written.
            for events in ([ev("a", 5)], [ev("a", 3)], [ev("b", 2), ev("b", 2)]):
                with pytest.raises(StoreError, match="gap or a duplicate"):
                    await store.append(StoreBatch(events=events, workflows=[row("a")]))
            assert await store.last_seq("b") == 1
            assert await store.workflow("a") is None

    run(main())


def test_a_large_batch_reads_back_event_by_event(make_store: StoreFactory) -> None:
    """Appends write many rows per statement (SQLite) or by COPY (PostgreSQL); reads still
    return every event on its own, in order, with its fields and references."""

    async def main() -> None:
        async with opened(make_store) as store:
            events = [ev(w, seq, f'{{"n":{seq}}}') for seq in range(1, 301) for w in "ab"]
            events.append(ev("c", 1, p="e" * 64))
            await store.append(StoreBatch(events=events))
            await store.append(StoreBatch(events=[ev("a", 301), ev("c", 2)]))
            got = await store.events("a")
            assert [e.seq for e in got] == list(range(1, 302))
            assert got[:300] == [e for e in events if e.workflow == "a"]
            assert (await store.events("c"))[0].refs == {"p": "e" * 64}
            assert (await store.size()).events == 603

    run(main())


def test_a_batch_is_one_transaction(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            await store.append(StoreBatch(events=[ev("a", 1)]))
            # The duplicate is only found by the database (another journal wrote seq 2 first).
            await store.append(StoreBatch(events=[ev("a", 2)]))
            bad = StoreBatch(events=[ev("c", 1), ev("a", 1)], payloads={"d" * 64: b"x"})
            with pytest.raises(StoreError):
                await store.append(bad)
            assert await store.events("c") == []
            assert (await store.size()).payloads == 0

    run(main())


def test_payloads_are_stored_once(make_store: StoreFactory) -> None:
    async def main() -> None:
        big = b"x" * 5000
        digest = payload_digest(big)
        async with opened(make_store) as store:
            for workflow in ("a", "b"):
                await store.append(
                    StoreBatch(events=[ev(workflow, 1, p=digest)], payloads={digest: big})
                )
            size = await store.size()
            assert (size.payloads, size.payload_bytes) == (1, 5000)
            assert await store.payloads([digest, "0" * 64]) == {digest: big}
            assert (await store.events("b"))[0].refs == {"p": digest}

    run(main())


def test_journal_round_trip_restores_large_fields(make_store: StoreFactory) -> None:
    async def main() -> None:
        prompt = "long prompt " * 200
        async with opened(make_store) as store:
            journal = Journal(store, inline_limit=256)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(journal.run())
                for i in range(3):
                    journal.append("w", "task_added", float(i), {"i": i, "prompt": prompt})
                await journal.close()
            assert await read_events(store, "w") == [{"i": i, "prompt": prompt} for i in range(3)]
            size = await store.size()
            assert (size.events, size.payloads) == (3, 1)
            assert size.event_bytes < 3 * 200

    run(main())


# --- workflows ------------------------------------------------------------------------------


def test_workflow_rows_upsert_and_list_in_one_query(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            rows = [
                row("w1", "running", created=1.0, tenant="acme", labels={"team": "x"}),
                row("w2", "succeeded", created=2.0, finished=3.0),
                row("w3", "pending", created=3.0, tenant="acme"),
                row("w4", "failed", created=4.0, finished=5.0, priority="interactive"),
            ]
            await store.append(StoreBatch(workflows=rows))
            later = WorkflowRow(
                id="w1",
                name="name-w1",
                status="succeeded",
                created=99.0,
                updated=7.0,
                finished=7.0,
                tenant="acme",
                labels={"team": "x"},
            )
            await store.append(StoreBatch(workflows=[later]))
            got = await store.workflow("w1")
            assert got is not None
            assert (got.status, got.created, got.updated, got.finished) == (
                "succeeded",
                1.0,
                7.0,
                7.0,
            )
            assert await store.workflow("w4") == rows[3]
            assert await store.workflow("nope") is None

            statements: list[str] = []

            def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
                statements.append(statement)

            for engine in store.engines:
                event.listen(engine.sync_engine, "before_cursor_execute", count)
            listed = await store.workflows()
            assert len(statements) == 1
            assert [w.id for w in listed] == ["w4", "w3", "w2", "w1"]
            assert listed[3].labels == {"team": "x"}
            assert [w.id for w in await store.workflows(status="succeeded")] == ["w2", "w1"]
            assert [w.id for w in await store.workflows(tenant="acme")] == ["w3", "w1"]
            assert [w.id for w in await store.workflows(limit=2, offset=1)] == ["w3", "w2"]
            assert await store.unfinished() == ["w3"]
            assert len(statements) == 5
            labelled = [
                row("w5", created=6.0, tenant="acme", labels={"team": "x", "env": "prod"}),
                row("w6", created=7.0, tenant="beta", labels={"team": "x"}),
                row("w7", created=8.0, labels={"team": "y", "note": 'it\'s "quoted"'}),
            ]
            await store.append(StoreBatch(workflows=labelled))

            async def ids(**kw: Any) -> list[str]:
                return [w.id for w in await store.workflows(**kw)]

            assert await ids(labels={"team": "x"}) == ["w6", "w5", "w1"]
            assert await ids(labels={"team": "x", "env": "prod"}) == ["w5"]
            assert await ids(labels={"team": "x"}, tenant="acme") == ["w5", "w1"]
            assert await ids(labels={"note": 'it\'s "quoted"'}) == ["w7"]
            assert await ids(labels={"team": "z"}) == []
            assert await ids(labels={"no such key": "x"}) == []

    run(main())


# --- calls ----------------------------------------------------------------------------------


def test_call_results_are_found_by_program_and_request(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            assert await store.find_call("p1", "h") is None
            digest = await store.record_call("p1", "h", b'{"text":"hi"}', workflow="w")
            assert digest == payload_digest(b'{"text":"hi"}')
            assert await store.find_call("p1", "h") == b'{"text":"hi"}'
            assert await store.find_call("p2", "h") is None
            # Answered once: a second result for the same call does not replace the first.
            await store.record_call("p1", "h", b"other")
            assert await store.find_call("p1", "h") == b'{"text":"hi"}'

    run(main())


# --- retention ------------------------------------------------------------------------------


def test_retention_deletes_finished_workflows_and_gc_their_payloads(
    make_store: StoreFactory,
) -> None:
    shared, own = b"s" * 2000, b"o" * 2000
    ds, do = payload_digest(shared), payload_digest(own)

    async def main() -> None:
        async with opened(make_store) as store:
            for i in range(5):
                w = f"f{i}"
                refs = {"a": ds, "b": do} if i == 0 else {"a": ds}
                await store.append(
                    StoreBatch(
                        events=[ev(w, 1, **refs)],
                        workflows=[row(w, "succeeded", created=i, finished=10.0 + i)],
                        payloads={ds: shared, do: own},
                    )
                )
            await store.append(StoreBatch(events=[ev("run", 1)], workflows=[row("run")]))
            await store.record_call("prog", "h", b"c" * 3000, workflow="f1")
            assert (await store.size()).payloads == 3

            assert await store.retain(finished_before=11.0) == 1  # f0
            assert await store.retain(keep_last=2) == 2  # f1, f2; f3 and f4 stay
            assert await store.retain(keep_last=0, finished_before=0.0) == 2
            assert [w.id for w in await store.workflows()] == ["run"]
            assert await store.find_call("prog", "h") is None
            assert (await store.size()).payloads == 3
            assert await store.collect_garbage() == 3
            size = await store.size()
            assert (size.workflows, size.events, size.payloads, size.calls) == (1, 1, 0, 0)

    run(main())


def test_gc_keeps_payloads_still_referenced(make_store: StoreFactory) -> None:
    data = b"k" * 100
    digest = payload_digest(data)

    async def main() -> None:
        async with opened(make_store) as store:
            for w in ("a", "b"):
                batch = StoreBatch(events=[ev(w, 1, p=digest)], payloads={digest: data})
                await store.append(batch)
            await store.record_call("p", "h", b"call")
            assert await store.delete(["a", "missing"]) == 0  # no workflow rows, events gone
            assert await store.events("a") == []
            assert await store.collect_garbage() == 0
            assert await store.delete(["b"]) == 0
            assert await store.collect_garbage() == 1
            assert await store.find_call("p", "h") == b"call"

    run(main())


# --- compaction -----------------------------------------------------------------------------


def test_compaction_keeps_what_rebuilds_a_finished_run(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            written = await put_run(store, "done", big=True)
            await put_run(store, "live", status="running", big=True)
            await store.record_call("p-done", "h", b"c" * 3000, workflow="done")
            await store.record_call("p-live", "h", b"l" * 3000, workflow="live")
            before, live = await stored_image(store, "done"), await stored_image(store, "live")
            live_records = await store.events("live")
            size = await store.size()

            assert await store.compact() == 1  # "live" is not finished: untouched
            assert await store.compact() == 0  # done once
            image = await stored_image(store, "done")
            assert same_run(image) == same_run(before)
            assert image.tasks["write"].result == BIG_RESULT
            assert image.tasks["flaky"].attempts == 2
            assert image.edges == before.edges and image.status == "failed"
            records = await store.events("done")
            assert len(records) == written - 15
            assert records[-1].seq == written  # its seqs keep their numbers: gaps before
            assert await store.last_seq("done") == written
            assert [w.id for w in await store.workflows() if w.compacted] == ["done"]
            # Its call records go (only an unfinished run is resumed); the other run's stay.
            assert await store.find_call("p-done", "h") is None
            assert await store.find_call("p-live", "h") == b"l" * 3000

            # The unfinished run is as it was, and appends continue it without a gap.
            assert await store.events("live") == live_records
            assert same_run(await stored_image(store, "live")) == same_run(live)
            last = live_records[-1].seq
            await store.append(StoreBatch(events=[ev("live", last + 1)]))
            with pytest.raises(StoreError, match="gap or a duplicate"):
                await store.append(StoreBatch(events=[ev("live", last + 3)]))

            # The retry's big error was the only reference to its payload from "done", but
            # "live" still has it; once "live" goes, it and the call result are collected.
            assert await store.collect_garbage() == 1  # the call result of "done"
            await store.delete(["live"])
            assert await store.collect_garbage() == 2  # "live"'s retry error and call result
            assert (await stored_image(store, "done")).tasks["write"].result == BIG_RESULT
            after = await store.size()
            assert after.events == size.events - 15 - len(live_records)
            assert after.event_bytes < size.event_bytes

    run(main())


def test_compaction_alone_drops_what_only_the_dropped_events_held(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            await put_run(store, "done", big=True)
            size = await store.size()
            assert (size.payloads, size.calls) == (2, 0)  # the retry's error, the result
            assert await store.compact(["done"]) == 1
            assert await store.collect_garbage() == 1  # the error: only task_retrying had it
            after = await store.size()
            assert after.payload_bytes == size.payload_bytes - len(json.dumps(BIG_ERROR))
            assert (await stored_image(store, "done")).tasks["write"].result == BIG_RESULT

    run(main())


def test_compaction_selects_by_name_age_and_count(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store:
            for i, name in enumerate(["a", "b", "c", "d"]):
                await put_run(store, name, finished=10.0 * (i + 1))  # 10, 20, 30, 40
            await put_run(store, "r", status="running")

            async def compacted() -> list[str]:
                return sorted(w.id for w in await store.workflows() if w.compacted)

            assert await store.compact(["c", "r", "missing"]) == 1
            assert await compacted() == ["c"]
            assert await store.compact(finished_before=20.0) == 1  # "a" (finished at 10)
            assert await store.compact(limit=1) == 1  # the earliest finished left: "b"
            assert await compacted() == ["a", "b", "c"]
            assert await store.compact(["d"], finished_before=40.0) == 0
            assert await store.compact() == 1
            assert await compacted() == ["a", "b", "c", "d"]
            assert (await store.workflow("r")).compacted is False  # type: ignore[union-attr]

            # An append of a compacted workflow's row (a late writer) does not unmark it.
            again = await store.workflow("a")
            assert again is not None
            await store.append(StoreBatch(workflows=[replace(again, compacted=False)]))
            assert (await store.workflow("a")).compacted is True  # type: ignore[union-attr]

    run(main())


def test_concurrent_compactions_compact_once(make_store: StoreFactory) -> None:
    """Two stores (two processes, as far as the database knows) compact the same runs."""

    async def main() -> None:
        async with opened(make_store) as first, opened(make_store) as second:
            for i in range(6):
                await put_run(first, f"w{i}", big=True)
            counts = await asyncio.gather(first.compact(), second.compact(), first.compact())
            assert sum(counts) == 6
            for i in range(6):
                image = await stored_image(second, f"w{i}")
                assert image.tasks["write"].result == BIG_RESULT
                assert len(await second.events(f"w{i}")) == 40 - 15

    run(main())


# --- schema versions --------------------------------------------------------------------------


def test_a_store_from_a_newer_plait_is_refused(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as store, store.engines[0].begin() as conn:
            await conn.execute(sa.update(schema.meta).values(value="99"))
        with pytest.raises(
            StoreVersionError, match=rf"schema version 99.*versions up to {schema.SCHEMA_VERSION}\b"
        ):
            await make_store().open()

    run(main())


def test_a_store_from_an_older_plait_is_migrated_forward(make_store: StoreFactory) -> None:
    async def main() -> None:
        # What plait with schema version 1 left behind: no calls table, no tenant column.
        old = make_store()
        old._connect()
        await old._migrate("v1")
        async with old.engines[0].begin() as conn:
            await conn.execute(
                sa.text(
                    "INSERT INTO plait_workflows (id, name, status, priority, created, updated)"
                    " VALUES ('w', 'old', 'running', 'batch', 1.0, 1.0)"
                )
            )
            await conn.execute(
                sa.text(
                    "INSERT INTO plait_events (workflow_id, seq, kind, at, data)"
                    " VALUES ('w', 1, 'k', 0.5, '{}')"
                )
            )
            assert (await conn.execute(sa.select(schema.meta.c.value))).scalar_one() == "1"
        await old.close()

        async with opened(make_store) as store:
            got = await store.workflow("w")
            assert got is not None
            assert (got.name, got.tenant, got.labels, got.compacted) == ("old", None, {}, False)
            assert [e.seq for e in await store.events("w")] == [1]
            await store.record_call("p", "h", b"r")
            assert await store.find_call("p", "h") == b"r"
            async with store.engines[0].begin() as conn:
                version = (await conn.execute(sa.select(schema.meta.c.value))).scalar_one()
                assert version == str(schema.SCHEMA_VERSION)
                tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
                # The migrations build exactly the tables the store's code uses.
                for table in schema.metadata.sorted_tables:
                    assert table.name in tables
                    columns = await conn.run_sync(
                        lambda c, n=table.name: [
                            col["name"] for col in sa.inspect(c).get_columns(n)
                        ]
                    )
                    assert sorted(columns) == sorted(table.columns.keys())
        # Opening an up-to-date store again changes nothing.
        async with opened(make_store) as store:
            assert [e.seq for e in await store.events("w")] == [1]

    run(main())


# --- faults ---------------------------------------------------------------------------------


def test_a_file_that_is_not_sqlite_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"notes\.db.*not a SQLite database"):
        run(SQLStore(path).open())


def test_a_truncated_or_damaged_sqlite_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def fill() -> None:
        async with SQLStore(path) as store:
            for i in range(1, 60):
                await store.append(StoreBatch(events=[ev("w", i, '"' + "x" * 3000 + '"')]))
        # Closing the last connection checkpoints the WAL into the file.

    run(fill())
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(StoreError, match=r"store\.db.*truncated"):
        run(SQLStore(path).open())

    # The header intact, the pages after it overwritten.
    path.write_bytes(whole[:100] + b"\xa5" * (len(whole) - 100))

    async def read() -> None:
        async with SQLStore(path) as store:
            await store.events("w")

    with pytest.raises(StoreError, match=r"store\.db.*(damaged|malformed|not a database)"):
        run(read())


def test_a_database_that_cannot_be_reached_is_a_clear_error() -> None:
    store = SQLStore("postgresql+asyncpg://nobody@127.0.0.1:1/none", connect_timeout=5)
    with pytest.raises(StoreError, match=r"PostgreSQL database.*cannot be reached") as caught:
        run(store.open())
    assert "127.0.0.1" not in str(caught.value) and "nobody" not in str(caught.value)


def test_a_sqlite_file_in_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"missing/store\.db.*directory does not exist"):
        run(SQLStore(tmp_path / "missing" / "store.db").open())


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_appenders_in_one_process_never_see_locked(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with opened(make_store) as first, opened(make_store) as second:

            async def writer(store: SQLStore, workflow: str) -> None:
                for seq in range(1, 31):
                    batch = StoreBatch(events=[ev(workflow, seq)], workflows=[row(workflow)])
                    await store.append(batch)
                    if seq % 10 == 0:
                        await store.collect_garbage()

            async with asyncio.TaskGroup() as tg:
                for i in range(8):
                    tg.create_task(writer(first if i % 2 else second, f"w{i}"))
            for i in range(8):
                assert await first.last_seq(f"w{i}") == 30

    run(main())


WRITER_SCRIPT = """
import asyncio, sys
from memory import SQLStore
from orchestrator.ext import EventRecord, StoreBatch

async def main():
    async with SQLStore(sys.argv[1]) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for seq in range(1, 201):
            record = EventRecord(workflow="child", seq=seq, kind="k", at=0.0, data="{}")
            await store.append(StoreBatch(events=[record]))

asyncio.run(main())
"""


def test_two_processes_write_one_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"

    async def main() -> None:
        async with SQLStore(path) as store:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                WRITER_SCRIPT,
                str(path),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
            )
            assert child.stdin is not None and child.stdout is not None
            assert await child.stdout.readline() == b"ready\n"
            child.stdin.write(b"go\n")
            await child.stdin.drain()
            for seq in range(1, 201):
                await store.append(StoreBatch(events=[ev("parent", seq)]))
            assert await child.wait() == 0
            assert await store.last_seq("child") == 200
            assert await store.last_seq("parent") == 200

    run(main())
