"""`SQLStore`: orchestrator's `Store` on SQLAlchemy 2 async, SQLite or PostgreSQL.

SQLite (the default, `sqlite+aiosqlite:///path` or a plain path) runs in WAL mode, so
readers never wait for the writer. Writes take one asyncio lock per store (appends on their
own connection, the rest on SQLAlchemy's writer), and each starts with BEGIN IMMEDIATE: a
transaction takes the write lock before it reads, so it can never fail half-way with
"database is locked" (the busy timeout covers other processes and other stores).
`synchronous=FULL` is the default: WAL mode then syncs the log on every commit, so a
committed batch survives a power cut too, not only a killed process; group commit in the
journal pays that sync once per batch, not per event. NORMAL is faster and still loses
nothing when only the process dies; pass it when the machine is trusted.

PostgreSQL (`postgresql+asyncpg://...`) needs no lock of ours; `schema=` puts the tables in
their own schema (created if missing), which is how tests share one database.

`append`, the one hot path (the journal calls it for every group commit), talks to the driver
itself with SQL written out once; everything else goes through SQLAlchemy. On SQLite a batch
is one call on a thread of its own, with its own connection: through aiosqlite each statement
is a round trip between the event loop and the driver's thread, and each row of an
`executemany` has to take the GIL back from a busy event loop. Its events go in as multi-row
INSERTs, so the thread needs the GIL once per hundred rows, not once per row. On PostgreSQL
the events go in with COPY on the pooled asyncpg connection.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import operator
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import asyncpg
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from orchestrator import StoreError, StoreVersionError
from orchestrator.ext import (
    CallRecord,
    CancelStore,
    Claimed,
    EventRecord,
    KeyStore,
    LeaseLostError,
    LeaseStore,
    RetainingStore,
    SlotRow,
    StoreBatch,
    StoreSize,
    TextNotStorableError,
    WorkflowExistsError,
    WorkflowRow,
    WorkflowStatus,
    allot,
    compactable,
    unstorable,
)

from . import _schema as t

_log = logging.getLogger("plait.store")
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_FINISHED = ("succeeded", "failed", "cancelled")
_UNFINISHED = ("pending", "running")
_CHUNK = 500
"""Ids per IN (...) list: well under SQLite's and asyncpg's bound-parameter limits."""
_KEPT_ON_UPSERT = ("id", "created", "compacted")
"""Columns a workflow row's upsert leaves as they are: compaction's mark is the store's own."""
_COMPACT_BATCH = 5000
"""Events dropped per compaction transaction (at least one workflow's): short transactions
let the journal's commits in between."""
_PLAN_GROUP = 100
"""Workflows whose events one compaction query reads."""
_PG_GC_LOCK = 0x706C616974
"""Advisory lock key: appends hold it shared, garbage collection exclusively, so a payload
an append is about to reference is never collected in between."""


_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}
"""A URL that names no driver gets the one the store uses (asyncpg, aiosqlite)."""


def store_url(target: str) -> str:
    """A SQLAlchemy URL for `target`: a URL with the store's driver (`postgresql://...` is
    `postgresql+asyncpg://...`), anything else a SQLite file path."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        return f"sqlite+aiosqlite:///{target}"
    if scheme.lower().startswith(("postgresql+", "postgres+")) and not scheme.lower().endswith(
        "+asyncpg"
    ):
        raise StoreError(
            f"store URL scheme {scheme!r}: the store talks to PostgreSQL through asyncpg; "
            "write postgresql://... (or postgresql+asyncpg://...)"
        )
    return f"{_DRIVERS.get(scheme.lower(), scheme)}://{rest}"


class SQLStore(RetainingStore, LeaseStore, CancelStore, KeyStore):
    """The SQL store; see the module docstring. `target` is a URL or a SQLite file path; a
    PostgreSQL URL may name the schema to use as `?schema=NAME` (as `schema=` does).

    The event log and every feature a store may declare: retention (`RetainingStore`),
    leases (`LeaseStore`), cancel requests (`CancelStore`) and idempotency keys
    (`KeyStore`), on SQLite and PostgreSQL alike."""

    def __init__(
        self,
        target: str | Path,
        *,
        schema: str | None = None,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.url = sa.make_url(store_url(str(target)))
        in_url = self.url.query.get("schema")
        if in_url is not None:
            if isinstance(in_url, tuple) or not re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_]{0,62}", in_url
            ):
                raise StoreError(
                    f"store URL's schema={in_url!r}: one name of letters, digits and _ "
                    "(not starting with a digit), at most 63 characters"
                )
            if schema is not None and schema != in_url:
                raise StoreError(f"two schemas given: {schema!r} and the URL's {in_url!r}")
            schema = in_url
            self.url = self.url.difference_update_query(["schema"])
        self._sqlite = self.url.get_backend_name() == "sqlite"
        if not self._sqlite and self.url.get_backend_name() != "postgresql":
            raise StoreError(
                f"store URL {self.url.render_as_string()!r} names neither SQLite nor "
                "PostgreSQL; use sqlite+aiosqlite:///path or postgresql+asyncpg://host/db"
            )
        # Errors reach the service's clients: a PostgreSQL store is named without its URL's
        # user, host, port or database, and driver messages lose them too (`_redact`).
        self.where = (
            f"file {self.url.database!r}"
            if self._sqlite
            else "the PostgreSQL database" + (f", schema {schema!r}" if schema else "")
        )
        self._secrets = _secrets(self.url)
        self._schema = schema
        self._synchronous = synchronous
        self._busy_ms = int(busy_timeout * 1000)
        self._connect_timeout = connect_timeout
        self._write_lock = asyncio.Lock()
        self._writer: AsyncEngine | None = None
        self._reader: AsyncEngine | None = None
        self._appender: _SQLiteAppender | None = None

    @property
    def engines(self) -> tuple[AsyncEngine, ...]:
        """The open engines (the writer first): for instrumentation and tests."""
        return tuple(e for e in (self._writer, self._reader) if e is not None)

    # --- open and close ----------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        self._connect()
        try:
            with self._translate("open"):
                await self._migrate("head")
                if self._sqlite:
                    self._appender = _SQLiteAppender(
                        str(self.url.database), self._synchronous, self._busy_ms
                    )
                    await self._appender.open()
        except BaseException:
            await self.close()
            raise

    def _connect(self) -> None:
        if self._sqlite:
            self._check_sqlite_file()
            self._writer = self._sqlite_engine(writer=True)
            self._reader = self._sqlite_engine(writer=False)
        else:
            args: dict[str, Any] = {"timeout": self._connect_timeout}
            if self._schema:
                args["server_settings"] = {"search_path": self._schema}
            self._writer = create_async_engine(self.url, connect_args=args)

    async def close(self) -> None:
        appender, self._appender = self._appender, None
        engines, self._writer, self._reader = self.engines, None, None
        try:
            if appender is not None:
                await appender.close()
        finally:
            for engine in engines:
                await engine.dispose()

    async def _migrate(self, revision: str) -> None:
        """Bring the schema to `revision` ("head" in use; tests also build older states)."""
        async with self._write() as conn:
            if not self._sqlite:
                # Two processes opening one fresh database must not both create the schema
                # or the tables (CREATE SCHEMA IF NOT EXISTS is not safe against a race:
                # engines of a cluster started together failed on it).
                await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_GC_LOCK + 1)))
                if self._schema:
                    quoted = conn.dialect.identifier_preparer.quote_identifier(self._schema)
                    await conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
            found = await conn.run_sync(_schema_version)
            if found is not None and found > t.SCHEMA_VERSION:
                raise StoreVersionError(self.where, found, t.SCHEMA_VERSION)
            await conn.run_sync(_alembic_upgrade, revision)

    def _sqlite_engine(self, *, writer: bool) -> AsyncEngine:
        engine = create_async_engine(
            self.url,
            # One connection writes; readers share a small pool (WAL lets them run beside it).
            pool_size=1 if writer else 4,
            max_overflow=0,
        )
        busy_ms, synchronous = self._busy_ms, self._synchronous

        @event.listens_for(engine.sync_engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            if writer:
                # The driver must not open transactions on its own: we BEGIN IMMEDIATE below.
                dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if writer:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.close()

        if writer:

            @event.listens_for(engine.sync_engine, "begin")
            def _begin(conn: sa.Connection) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    def _check_sqlite_file(self) -> None:
        """Refuse a file that is not SQLite, or shorter than its header says, before the
        driver fails somewhere less clear."""
        path = Path(self.url.database or "")
        if not path.parent.is_dir():
            raise StoreError(
                f"store file {str(path)!r} cannot be created: its directory does not exist; "
                "create the directory first, or pass another path"
            )
        if not path.is_file():
            return
        size = path.stat().st_size
        if size == 0:
            return
        with path.open("rb") as file:
            header = file.read(100)
        if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
            raise StoreError(
                f"store file {str(path)!r} is not a SQLite database (its header is wrong); "
                "pass the path of a plait store, or move this file away to start a new one"
            )
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(header[28:32], "big")
        # The page count in the header is valid only when its two change counters agree.
        if header[24:28] == header[92:96] and size < pages * page_size:
            raise StoreError(
                f"store file {str(path)!r} is truncated: {size} bytes where its header says "
                f"{pages * page_size}; restore it from a backup, or move it away to start anew"
            )

    # --- writes -----------------------------------------------------------------------------

    async def append(self, batch: StoreBatch) -> None:
        if not len(batch):
            return
        _check_text(batch)
        if self._sqlite:
            await self._append_sqlite(batch)
        else:
            await self._append_postgres(batch)

    async def _append_sqlite(self, batch: StoreBatch) -> None:
        appender = self._appender
        if appender is None:
            raise StoreError(f"the store, {self.where}, is not open; use `async with store:`")
        async with self._write_lock:
            with self._translate("write to"):
                await appender.write(batch)

    async def _append_postgres(self, batch: StoreBatch) -> None:
        with self._translate("write to"):
            async with self._engine(writer=True).connect() as conn:
                driver: asyncpg.Connection = (await conn.get_raw_connection()).driver_connection
                try:
                    async with driver.transaction():
                        await _write_postgres(driver, batch)
                except BaseException:
                    if driver.is_closed():
                        await conn.invalidate()  # the pool must not hand it out again
                    raise

    async def delete(self, workflows: Sequence[str]) -> int:
        async with self._write() as conn:
            return await self._delete(conn, sorted(set(workflows)))

    async def _delete(self, conn: AsyncConnection, ids: Sequence[str]) -> int:
        deleted = 0
        m, s = t.mail.c, t.mail_senders.c
        for chunk in _chunks(ids):
            for table in (t.events, t.payload_refs, t.calls):
                await conn.execute(table.delete().where(table.c.workflow_id.in_(chunk)))
            # Its agents' mailboxes and subscriptions go with it (no one will read them);
            # what they sent to other workflows stays until acknowledged, and so does each
            # sender's numbering while any of its messages is left.
            await conn.execute(t.mail.delete().where(m.workflow.in_(chunk)))
            await conn.execute(t.mail_topics.delete().where(t.mail_topics.c.workflow.in_(chunk)))
            await conn.execute(t.keys.delete().where(t.keys.c.workflow_id.in_(chunk)))
            sent = sa.exists().where(
                m.tenant == s.tenant, m.sender_workflow == s.workflow, m.sender_agent == s.agent
            )
            await conn.execute(t.mail_senders.delete().where(s.workflow.in_(chunk), ~sent))
            result = await conn.execute(t.workflows.delete().where(t.workflows.c.id.in_(chunk)))
            deleted += result.rowcount
        return deleted

    async def retain(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        w = t.workflows.c
        finished = sa.select(w.id).where(w.status.in_(_FINISHED))
        async with self._write() as conn:
            doomed: set[str] = set()
            if finished_before is not None:
                old = finished.where(w.finished < finished_before)
                doomed.update((await conn.execute(old)).scalars())
            if keep_last is not None:
                beyond = finished.order_by(w.finished.desc(), w.id.desc()).offset(keep_last)
                doomed.update((await conn.execute(beyond)).scalars())
            return await self._delete(conn, sorted(doomed))

    async def compact(
        self,
        workflows: Sequence[str] | None = None,
        *,
        finished_before: float | None = None,
        limit: int | None = None,
    ) -> int:
        # Plans are made from reads outside the write lock (a finished log does not change),
        # and written a few workflows per transaction, each checked again inside it: another
        # process may have compacted or deleted one meanwhile.
        ids = await self._compactable(workflows, finished_before, limit)
        compacted = 0
        for start in range(0, len(ids), _PLAN_GROUP):
            batch: list[_Compaction] = []
            for plan in await self._plan_compactions(ids[start : start + _PLAN_GROUP]):
                batch.append(plan)
                if sum(len(plan.seqs) for plan in batch) >= _COMPACT_BATCH:
                    compacted += await self._write_compactions(batch)
                    batch = []
            if batch:
                compacted += await self._write_compactions(batch)
        return compacted

    async def _compactable(
        self, named: Sequence[str] | None, finished_before: float | None, limit: int | None
    ) -> list[str]:
        w = t.workflows.c
        query = sa.select(w.finished, w.id).where(
            w.status.in_(_FINISHED), w.compacted == sa.false()
        )
        if finished_before is not None:
            query = query.where(w.finished < finished_before)
        query = query.order_by(w.finished, w.id)
        found: list[tuple[float, str]] = []
        async with self._read() as conn:
            if named is None:
                found = [(f, i) for f, i in await conn.execute(query.limit(limit))]
            else:
                for chunk in _chunks(sorted(set(named))):
                    found.extend(
                        (f, i) for f, i in await conn.execute(query.where(w.id.in_(chunk)))
                    )
                found.sort()
        return [i for _, i in found[:limit]]

    async def _plan_compactions(self, workflows: Sequence[str]) -> list[_Compaction]:
        """What compacting these workflows drops, read in one query (small runs cost a
        round trip each otherwise)."""
        e = t.events.c
        query = (
            sa.select(e.workflow_id, e.seq, e.data, e.refs)
            .where(e.workflow_id.in_(workflows))
            .order_by(e.workflow_id, e.seq)
        )
        steps: dict[str, list[tuple[int, dict[str, Any]]]] = {w: [] for w in workflows}
        refs: dict[str, dict[int, set[str]]] = {w: {} for w in workflows}
        async with self._read() as conn:
            # In slices: one await per row would cost more than the rows themselves.
            async for rows in (await conn.stream(query)).partitions(_CHUNK):
                for workflow, seq, data, ref_text in rows:
                    event = json.loads(data)
                    steps[workflow].append((seq, {k: event.get(k) for k in _READ_FIELDS}))
                    if ref_text:
                        refs[workflow][seq] = set(json.loads(ref_text).values())
        return [_compaction(w, steps[w], refs[w]) for w in workflows]

    async def _write_compactions(self, plans: Sequence[_Compaction]) -> int:
        w, e = t.workflows.c, t.events.c
        async with self._write() as conn:
            check = (
                sa.select(w.id)
                .where(
                    w.id.in_([plan.workflow for plan in plans]),
                    w.status.in_(_FINISHED),
                    w.compacted == sa.false(),
                )
                .with_for_update()
            )
            still = set((await conn.execute(check)).scalars())
            plans = [plan for plan in plans if plan.workflow in still]
            events = [{"w": p.workflow, "s": seq} for p in plans for seq in p.seqs]
            if events:
                drop = t.events.delete().where(
                    e.workflow_id == sa.bindparam("w"), e.seq == sa.bindparam("s")
                )
                await conn.execute(drop, events)
            refs = [{"w": p.workflow, "d": digest} for p in plans for digest in p.digests]
            if refs:
                r = t.payload_refs.c
                unref = t.payload_refs.delete().where(
                    r.workflow_id == sa.bindparam("w"), r.digest == sa.bindparam("d")
                )
                await conn.execute(unref, refs)
            ids = sorted(still)
            for chunk in _chunks(ids):
                await conn.execute(t.calls.delete().where(t.calls.c.workflow_id.in_(chunk)))
                mark = t.workflows.update().where(w.id.in_(chunk)).values(compacted=True)
                await conn.execute(mark)
            return len(ids)

    async def collect_garbage(self) -> int:
        p = t.payloads
        referenced = sa.or_(
            sa.exists().where(t.payload_refs.c.digest == p.c.digest),
            sa.exists().where(t.calls.c.digest == p.c.digest),
        )
        async with self._write() as conn:
            if not self._sqlite:
                await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_GC_LOCK)))
            result = await conn.execute(p.delete().where(sa.not_(referenced)))
            return result.rowcount

    # --- reads ------------------------------------------------------------------------------

    async def events(
        self, workflow: str, after_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        e = t.events.c
        query = (
            sa.select(e.workflow_id, e.seq, e.kind, e.at, e.data, e.refs)
            .where(e.workflow_id == workflow, e.seq > after_seq)
            .order_by(e.seq)
            .limit(limit)
        )
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        return [
            EventRecord(workflow=w, seq=s, kind=k, at=at, data=d, refs=json.loads(r) if r else {})
            for w, s, k, at, d, r in rows
        ]

    async def last_seq(self, workflow: str) -> int:
        e = t.events.c
        query = sa.select(sa.func.coalesce(sa.func.max(e.seq), 0)).where(e.workflow_id == workflow)
        async with self._read() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def payloads(self, digests: Sequence[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        p = t.payloads.c
        async with self._read() as conn:
            for chunk in _chunks(sorted(set(digests))):
                query = sa.select(p.digest, p.data).where(p.digest.in_(chunk))
                found.update({d: bytes(data) for d, data in (await conn.execute(query))})
        return found

    async def workflow(self, workflow: str) -> WorkflowRow | None:
        query = sa.select(*_ROW_COLUMNS).where(t.workflows.c.id == workflow)
        async with self._read() as conn:
            row = (await conn.execute(query)).mappings().first()
        return None if row is None else _workflow_from(row)

    async def workflows(
        self,
        *,
        status: WorkflowStatus | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[WorkflowRow]:
        w = t.workflows.c
        query = sa.select(*_ROW_COLUMNS).order_by(w.created.desc(), w.id.desc())
        if status is not None:
            query = query.where(w.status == status)
        if tenant is not None:
            query = query.where(w.tenant == tenant)
        text = sa.cast(w.labels, sa.Text)
        find = sa.func.instr if self._sqlite else sa.func.strpos
        for key, value in (labels or {}).items():
            # The pair as the row's JSON text holds it, found without parsing that text: a
            # row PostgreSQL cannot parse (a NUL or a lone surrogate escaped in a label,
            # written before appends refused them) never fails another row's query. Keys and
            # values are whole JSON strings, so the match is exact.
            pair = json.dumps({key: value})[1:-1]
            query = query.where(find(text, pair) > 0)
        query = query.limit(limit).offset(offset)
        async with self._read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_workflow_from(row) for row in rows]

    async def unfinished(self) -> list[str]:
        w = t.workflows.c
        query = sa.select(w.id).where(w.status.in_(_UNFINISHED)).order_by(w.created, w.id)
        async with self._read() as conn:
            return list((await conn.execute(query)).scalars())

    async def find_call(self, program: str, request_hash: str) -> bytes | None:
        c, p = t.calls.c, t.payloads.c
        query = (
            sa.select(p.data)
            .join_from(t.calls, t.payloads, c.digest == p.digest)
            .where(c.program == program, c.request_hash == request_hash)
        )
        async with self._read() as conn:
            data = (await conn.execute(query)).scalar_one_or_none()
        return None if data is None else bytes(data)

    async def size(self) -> StoreSize:
        def count(table: sa.Table) -> sa.ScalarSelect[int]:
            return sa.select(sa.func.count()).select_from(table).scalar_subquery()

        def total(column: sa.Column[Any]) -> sa.ScalarSelect[int]:
            return sa.select(
                sa.func.coalesce(sa.func.sum(sa.func.length(column)), 0)
            ).scalar_subquery()

        query = sa.select(
            count(t.workflows),
            count(t.events),
            count(t.payloads),
            count(t.calls),
            total(t.events.c.data),
            total(t.payloads.c.data),
        )
        async with self._read() as conn:
            row = (await conn.execute(query)).one()
        return StoreSize(
            workflows=row[0],
            events=row[1],
            payloads=row[2],
            calls=row[3],
            event_bytes=int(row[4]),
            payload_bytes=int(row[5]),
        )

    # --- inside -----------------------------------------------------------------------------

    # --- leases --------------------------------------------------------------------------------

    async def claim(self, owner: str, lease_s: float, limit: int) -> list[Claimed]:
        if limit < 1:
            return []
        async with self._write() as conn:
            if self._sqlite:
                now = time.time()
                params = {"owner": owner, "now": now, "limit": limit}
                rows = (await conn.execute(sa.text(_SQLITE_CLAIMABLE), params)).all()
                ids = [r[0] for r in rows]
                for chunk in _chunks(ids):
                    await conn.execute(
                        t.workflows.update()
                        .where(t.workflows.c.id.in_(chunk))
                        .values(owner=owner, lease_until=now + lease_s)
                    )
            else:
                params = {"owner": owner, "lease": lease_s, "limit": limit}
                rows = (await conn.execute(sa.text(_PG_CLAIM), params)).all()
        return [Claimed(r[0], r[1]) for r in rows]

    async def renew(
        self, owner: str, lease_s: float, workflows: Sequence[str] | None = None
    ) -> int:
        until = f"{self._now_sql()} + :lease"
        sql = f"UPDATE plait_workflows SET lease_until = {until} WHERE owner = :owner{_LIVE}"
        renewed = 0
        async with self._write() as conn:
            if workflows is None:
                result = await conn.execute(sa.text(sql), {"owner": owner, "lease": lease_s})
                return int(result.rowcount)
            for chunk in _chunks(sorted(set(workflows))):
                query = sa.text(sql + " AND id IN :ids").bindparams(
                    sa.bindparam("ids", expanding=True)
                )
                params = {"owner": owner, "lease": lease_s, "ids": list(chunk)}
                renewed += int((await conn.execute(query, params)).rowcount)
        return renewed

    async def release(self, owner: str, workflows: Sequence[str] | None = None) -> int:
        w = t.workflows.c
        mine = (w.owner == owner) & w.status.in_(_UNFINISHED)
        released = 0
        async with self._write() as conn:
            for chunk in [None] if workflows is None else list(_chunks(sorted(set(workflows)))):
                where = mine if chunk is None else mine & w.id.in_(chunk)
                query = t.workflows.update().where(where).values(owner=None, lease_until=None)
                released += (await conn.execute(query)).rowcount
        return released

    async def ask_cancel(self, workflow: str, reason: str) -> bool:
        w = t.workflows.c
        query = (
            t.workflows.update()
            .where((w.id == workflow) & w.status.in_(_UNFINISHED))
            .values(cancel_asked=reason[:500])
        )
        async with self._write() as conn:
            return bool((await conn.execute(query)).rowcount)

    async def cancels(self, owner: str) -> list[tuple[str, str]]:
        w = t.workflows.c
        query = sa.select(w.id, w.cancel_asked).where(
            (w.owner == owner) & w.status.in_(_UNFINISHED) & w.cancel_asked.is_not(None)
        )
        async with self._read() as conn:
            return [(r[0], r[1]) for r in (await conn.execute(query)).all()]

    # --- idempotency keys ------------------------------------------------------------------------

    async def reserve_key(
        self, tenant: str, key: str, digest: str, *, stale_s: float
    ) -> tuple[bool, str, str | None]:
        for what, text in (("tenant", tenant), ("idempotency key", key)):
            reason = unstorable(text)
            if reason is not None:
                raise TextNotStorableError(
                    f"the {what} {text!r} holds {reason}, which the store cannot keep", ()
                )
        c = t.keys.c
        async with self._write() as conn:
            # The database's clock: engines on machines whose clocks differ agree on when
            # a reservation went stale.
            now = float((await conn.execute(sa.text(f"SELECT {self._now_sql()}"))).scalar_one())
            found = (
                await conn.execute(
                    sa.select(c.digest, c.workflow_id, c.created)
                    .where(c.tenant == tenant, c.key == key)
                    .with_for_update()
                )
            ).first()
            if found is None:
                row = {"tenant": tenant, "key": key, "digest": digest, "created": now}
                inserted = await conn.execute(_insert_ignore(conn, t.keys, row, ("tenant", "key")))
                if inserted.rowcount == 1:
                    return True, digest, None
                found = (
                    await conn.execute(
                        sa.select(c.digest, c.workflow_id, c.created).where(
                            c.tenant == tenant, c.key == key
                        )
                    )
                ).one()
            first, workflow, created = found
            if workflow is None and first == digest and now - created > stale_s:
                await conn.execute(
                    t.keys.update().where(c.tenant == tenant, c.key == key).values(created=now)
                )
                return True, digest, None
            return False, first, workflow

    async def name_key(self, tenant: str, key: str, workflow: str | None) -> None:
        c = t.keys.c
        mine = (c.tenant == tenant) & (c.key == key)
        async with self._write() as conn:
            if workflow is None:
                await conn.execute(t.keys.delete().where(mine, c.workflow_id.is_(None)))
            else:
                await conn.execute(t.keys.update().where(mine).values(workflow_id=workflow))

    # --- shared limits (orchestrator.ext.SlotBroker) ---------------------------------------

    async def share(
        self,
        backend: str,
        engine: str,
        *,
        limit: int,
        in_flight: int,
        want_urgent: int,
        want_batch: int,
        lease_s: float,
    ) -> int:
        """This engine's share of `backend`'s limit among the live engines (the slots
        table, one transaction; see `orchestrator.cluster._slots.SharedLimits`)."""
        c = t.slots.c
        async with self._write() as conn:
            if self._sqlite:
                now = time.time()
            else:  # one engine at a time per backend; engines on other backends go on
                lock = sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))")
                await conn.execute(lock, {"key": f"plait_slots:{backend}"})
                now = float((await conn.execute(sa.text(f"SELECT {_PG_NOW}"))).scalar_one())
            found = (await conn.execute(sa.select(t.slots).where(c.backend == backend))).all()
            live = {
                r.engine: SlotRow(r.held, r.want_urgent, r.want_batch)
                for r in found
                if r.lease_until >= now and r.engine != engine
            }
            live[engine] = SlotRow(0, want_urgent, want_batch)
            held, given = allot(limit, engine, in_flight, live)
            expired = [r.engine for r in found if r.lease_until < now]
            if expired:
                await conn.execute(
                    t.slots.delete().where(c.backend == backend, c.engine.in_(expired))
                )
            values = {
                "held": held,
                "want_urgent": want_urgent,
                "want_batch": want_batch,
                "lease_until": now + lease_s,
            }
            updated = await conn.execute(
                t.slots.update().where(c.backend == backend, c.engine == engine).values(values)
            )
            if not updated.rowcount:
                await conn.execute(
                    t.slots.insert().values(backend=backend, engine=engine, **values)
                )
        return given

    async def leave(self, engine: str) -> None:
        async with self._write() as conn:
            await conn.execute(t.slots.delete().where(t.slots.c.engine == engine))

    def _now_sql(self) -> str:
        """Now, on the database's clock (PostgreSQL: the server's, so engines on machines
        whose clocks differ agree on whose lease ran out; SQLite: this machine's)."""
        return _SQLITE_NOW if self._sqlite else _PG_NOW

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """Turn driver and SQLAlchemy errors into a `StoreError` naming the store."""
        try:
            yield
        except StoreError:
            raise
        except _DRIVER_ERRORS as exc:
            raise StoreError(self._explain(action, exc), transient=_transient(exc)) from exc

    def _explain(self, action: str, exc: BaseException) -> str:
        cause = getattr(exc, "orig", None) or exc
        detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        detail = _redact(detail, self._secrets)
        lowered = detail.lower()
        if self._sqlite and ("not a database" in lowered or "malformed" in lowered):
            fix = (
                "the file is damaged or not a plait store: restore it from a backup, "
                "or move it away to start a new store"
            )
        elif self._sqlite and "unable to open" in lowered:
            fix = "check that its directory exists and is writable"
        elif self._sqlite:
            fix = "check the file's permissions and the disk's free space"
        elif isinstance(cause, OSError | TimeoutError) or "connect" in lowered:
            fix = (
                "the database cannot be reached: check that it runs and that the URL's "
                "host, port, user and database are right"
            )
        else:
            fix = "check the database's log"
        return f"could not {action} the store, {self.where}: {detail}; {fix}"

    def _engine(self, *, writer: bool) -> AsyncEngine:
        engine = self._writer if writer or self._reader is None else self._reader
        if engine is None:
            raise StoreError(f"the store, {self.where}, is not open; use `async with store:`")
        return engine

    def _write(self) -> _Transaction:
        return _Transaction(self, writer=True)

    def _read(self) -> _Transaction:
        return _Transaction(self, writer=False)


_DRIVER_ERRORS = (
    sa.exc.SQLAlchemyError,
    sqlite3.Error,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)


class _Transaction:
    """`async with store._write() as conn`: the process's write lock (SQLite), one
    transaction, and errors translated."""

    def __init__(self, store: SQLStore, *, writer: bool) -> None:
        self._store = store
        self._writer = writer
        self._conn: Any = None

    async def __aenter__(self) -> AsyncConnection:
        store = self._store
        if self._writer and store._sqlite:
            await store._write_lock.acquire()
        try:
            with store._translate("write to" if self._writer else "read"):
                self._conn = store._engine(writer=self._writer).begin()
                conn: AsyncConnection = await self._conn.__aenter__()
        except BaseException:
            self._release()
            raise
        return conn

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        action = "write to" if self._writer else "read"
        try:
            with self._store._translate(action):
                await self._conn.__aexit__(exc_type, exc, tb)
        finally:
            self._release()
        if isinstance(exc, _DRIVER_ERRORS):
            raise StoreError(self._store._explain(action, exc), transient=_transient(exc)) from exc

    def _release(self) -> None:
        if self._writer and self._store._sqlite:
            self._store._write_lock.release()


_PASSING = (
    "disk is full",
    "disk full",
    "no space left",
    "database is locked",
    "connection",
    "connect",
    "server closed",
    "terminating",
    "shutting down",
    "timeout",
    "timed out",
)
"""Words of failures that pass by themselves: a database away, a disk that fills."""


def _transient(exc: BaseException) -> bool:
    """Whether a driver's failure may pass by itself (so waiting and trying again helps),
    as opposed to a damaged file, a schema or a constraint, which do not."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, ConnectionError | TimeoutError) or "Connection" in type(cause).__name__:
        return True
    text = str(cause).lower()
    if "not a database" in text or "malformed" in text:
        return False
    return isinstance(cause, OSError) or any(word in text for word in _PASSING)


def _secrets(url: sa.URL) -> tuple[str, ...]:
    """What of a PostgreSQL URL no error message may show (a SQLite file's path is no
    secret: it names where the store is)."""
    if url.get_backend_name() == "sqlite":
        return ()
    parts = (url.password, url.username, url.host, url.database, str(url.port or 5432))
    return tuple(sorted({str(p) for p in parts if p}, key=len, reverse=True))


_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\[?[0-9A-Fa-f]*:[0-9A-Fa-f:]*:[0-9A-Fa-f]+\]?")
"""An IPv4 or IPv6 address, as a driver's connection error quotes the resolved host."""


def _redact(text: str, hidden: Sequence[str]) -> str:
    """`text` with the URL's parts and any network address replaced by `***`."""
    if not hidden:
        return text
    for part in hidden:
        text = re.sub(rf"(?<![\w.-]){re.escape(part)}(?![\w.-])", "***", text)
    return _ADDRESS.sub("***", text)


_EVENT_WORKFLOW, _EVENT_KIND, _EVENT_DATA = (operator.itemgetter(i) for i in (0, 2, 4))
"""An `EventRecord`'s fields by position: C-level getters for the append path."""


def _check_text(batch: StoreBatch) -> None:
    """Refuse a batch holding text no store can keep (`TextNotStorableError`, nothing
    written), naming the workflows: else one bad event would fail its whole group commit
    on PostgreSQL, or be written where every later query of its table fails on it. The
    common case is one pass over the batch's text joined."""
    events = batch.events
    rows = [_row_texts(row) for row in batch.workflows]
    texts = list(map(_EVENT_DATA, events))
    texts += map(_EVENT_KIND, events)
    texts += set(map(_EVENT_WORKFLOW, events))
    for row_texts in rows:
        texts += row_texts
    for call in batch.calls:
        texts += (call.program, call.request_hash, call.workflow or "")
    if unstorable("".join(texts)) is None:
        return
    found: dict[str, str] = {}
    for e in events:
        for what, text in (("id", e.workflow), ("event kind", e.kind), ("event data", e.data)):
            reason = unstorable(text)
            if reason is not None:
                found.setdefault(e.workflow, f"its {what} (event {e.seq}) holds {reason}")
    for row, row_texts in zip(batch.workflows, rows, strict=True):
        for text in row_texts:
            reason = unstorable(text)
            if reason is not None:
                found.setdefault(row.id, f"its name, tenant or a label holds {reason}")
    for call in batch.calls:
        for text in (call.program, call.request_hash, call.workflow or ""):
            reason = unstorable(text)
            if reason is not None:
                found.setdefault(call.workflow or "", f"a recorded call holds {reason}")
    first, why = next(iter(found.items()))
    raise TextNotStorableError(
        f"workflow {first!r}: {why}, which the store cannot keep"
        + (f" ({len(found) - 1} more workflow(s) too)" if len(found) > 1 else "")
        + "; nothing of the batch was written",
        sorted(found),
    )


def _row_texts(row: WorkflowRow) -> tuple[str, ...]:
    labels = itertools.chain.from_iterable(row.labels.items())
    return (row.id, row.name, row.status, row.priority, row.tenant or "", *labels)


def _schema_version(conn: sa.Connection) -> int | None:
    if not sa.inspect(conn).has_table(t.meta.name):
        return None
    query = sa.select(t.meta.c.value).where(t.meta.c.key == "schema_version")
    value = conn.execute(query).scalar_one_or_none()
    return None if value is None else int(value)


def _alembic_upgrade(conn: sa.Connection, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["connection"] = conn
    command.upgrade(config, revision)


_ROW_COLUMNS = tuple(
    sa.type_coerce(c, sa.Text).label(c.name) if c.name == "labels" else c for c in t.workflows.c
)
"""A workflow row's columns, its labels as text: parsed here, so damaged labels on one row
fail no read of it or of a page holding it."""
_DAMAGED_SEEN: set[str] = set()


def _labels_from(workflow: str, text: Any) -> dict[str, str]:
    """The labels a row's text holds (asyncpg gives them parsed); damaged ones (not a JSON
    object of strings) are read as none, and said once per workflow in the log."""
    if text is None:
        return {}
    try:
        labels = json.loads(text) if isinstance(text, str | bytes) else text
    except ValueError as exc:
        problem = f"they are not JSON ({exc})"
    else:
        if labels is None:
            return {}
        if isinstance(labels, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            return labels
        problem = "they are not a JSON object of strings"
    if workflow not in _DAMAGED_SEEN and len(_DAMAGED_SEEN) < 10_000:
        _DAMAGED_SEEN.add(workflow)
        _log.error(
            "workflow %r: its labels in the store are damaged (%s); read as no labels",
            workflow,
            problem,
        )
    return {}


def _workflow_from(row: sa.RowMapping) -> WorkflowRow:
    return WorkflowRow(
        id=row["id"],
        name=row["name"],
        status=row["status"],
        priority=row["priority"],
        deadline=row["deadline"],
        created=row["created"],
        updated=row["updated"],
        finished=row["finished"],
        tenant=row["tenant"],
        labels=_labels_from(row["id"], row["labels"]),
        compacted=bool(row["compacted"]),
        owner=row["owner"],
        lease_until=row["lease_until"],
    )


_READ_FIELDS = ("kind", "task", "attempt", "attempts")
"""What `compactable` reads of an event; the rest is not kept while planning."""


def _compaction(
    workflow: str, steps: Sequence[tuple[int, Mapping[str, Any]]], refs: Mapping[int, set[str]]
) -> _Compaction:
    seqs = compactable(steps)
    gone = {seq for seq in seqs if seq in refs}
    dropped = set().union(*(refs[seq] for seq in gone))
    kept = set().union(*(d for seq, d in refs.items() if seq not in gone))
    return _Compaction(workflow, seqs, sorted(dropped - kept))


@dataclass(frozen=True, slots=True)
class _Compaction:
    """What compacting one workflow deletes: events by seq, and the payload references that
    only those events held."""

    workflow: str
    seqs: Sequence[int]
    digests: Sequence[str]


def _gap(record: EventRecord, expected: int) -> StoreError:
    return StoreError(
        f"event seq {record.seq} for workflow {record.workflow!r} would leave a gap or a "
        f"duplicate (the next is {expected}); one journal per workflow assigns seqs: do not "
        "append to a workflow from two journals"
    )


def _insert_ignore(
    conn: AsyncConnection, table: sa.Table, row: Mapping[str, Any], keys: Sequence[str]
) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING in the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).values(row).on_conflict_do_nothing(index_elements=list(keys))
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).values(row).on_conflict_do_nothing(index_elements=list(keys))


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


# --- the append path ------------------------------------------------------------------------
# SQL in PostgreSQL's numbered style; SQLite's is derived (`_qmarks`). Each parameter appears
# once and in order, so numbering and position agree.

_EVENT_COLUMNS = ("workflow_id", "seq", "kind", "at", "data", "refs")

# Leases (several engines on one store). Each engine's lease times come from the database's
# clock on PostgreSQL, so engines need not agree on the time.
_PG_NOW = "extract(epoch from clock_timestamp())::double precision"
_SQLITE_NOW = "(julianday('now') - 2440587.5) * 86400.0"
_LIVE = " AND status IN ('pending', 'running')"
_PG_CLAIM = (
    "WITH free AS (SELECT id, owner FROM plait_workflows "
    f"WHERE status IN ('pending', 'running') AND (owner IS NULL OR lease_until < {_PG_NOW}) "
    "ORDER BY created, id LIMIT :limit FOR UPDATE SKIP LOCKED) "
    f"UPDATE plait_workflows AS w SET owner = :owner, lease_until = {_PG_NOW} + :lease "
    "FROM free WHERE w.id = free.id RETURNING w.id, free.owner"
)
_SQLITE_CLAIMABLE = (
    "SELECT id, owner FROM plait_workflows WHERE status IN ('pending', 'running') "
    "AND (owner IS NULL OR lease_until < :now) ORDER BY created, id LIMIT :limit"
)
# The fence: which of the batch's workflows exist with another owner (or none: released).
_PG_OWNERS = "SELECT id, owner FROM plait_workflows WHERE id = ANY($1::varchar[]) FOR UPDATE"
_PG_TAKEN = "SELECT id FROM plait_workflows WHERE id = ANY($1::varchar[])"
_PG_LEASE_NEW = (
    f"UPDATE plait_workflows SET owner = $1, lease_until = {_PG_NOW} + $2 "
    "WHERE id = ANY($3::varchar[]) AND owner IS NULL"
)
_MAX_SEQ = "SELECT max(seq) FROM plait_events WHERE workflow_id = $1"
# One max() per workflow, not GROUP BY: each is answered from the primary key's index in
# O(log n), where a grouped max reads every event of the workflow.
_PG_MAX_SEQS = (
    "SELECT w, (SELECT max(seq) FROM plait_events WHERE workflow_id = w) "
    "FROM unnest($1::varchar[]) AS w"
)
_PG_GC_SHARED = f"SELECT pg_advisory_xact_lock_shared({_PG_GC_LOCK})"
_INSERT_PAYLOAD = "INSERT INTO plait_payloads (digest, data) VALUES ($1, $2) ON CONFLICT DO NOTHING"
_INSERT_REF = (
    "INSERT INTO plait_payload_refs (workflow_id, digest) VALUES ($1, $2) ON CONFLICT DO NOTHING"
)
_WORKFLOW_COLUMNS = (
    "id", "name", "status", "priority", "deadline", "created", "updated", "finished", "tenant",
    "labels",
)  # fmt: skip
_UPSERT_WORKFLOW = (
    f"INSERT INTO plait_workflows ({', '.join(_WORKFLOW_COLUMNS)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(_WORKFLOW_COLUMNS) + 1))}) "
    "ON CONFLICT (id) DO UPDATE SET "  # a row keeps the `created` it was first written with
    + ", ".join(f"{c} = excluded.{c}" for c in _WORKFLOW_COLUMNS if c not in ("id", "created"))
)
_INSERT_CALL = (
    "INSERT INTO plait_calls (program, request_hash, digest, workflow_id) "
    "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"  # the first recorded result wins
)
_SQLITE_ROWS = 128
"""Rows per multi-row INSERT: 768 parameters, under the 999 of SQLite builds before 3.32."""


def _qmarks(sql: str) -> str:
    return re.sub(r"\$\d+", "?", sql)


_SQLITE_MAX_SEQ = _qmarks(_MAX_SEQ)
_SQLITE_INSERT_PAYLOAD = _qmarks(_INSERT_PAYLOAD)
_SQLITE_INSERT_REF = _qmarks(_INSERT_REF)
_SQLITE_UPSERT_WORKFLOW = _qmarks(_UPSERT_WORKFLOW)
_SQLITE_INSERT_CALL = _qmarks(_INSERT_CALL)


@functools.cache
def _sqlite_insert_events(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)
    return f"INSERT INTO plait_events ({', '.join(_EVENT_COLUMNS)}) VALUES {values}"


class _SQLiteAppender:
    """SQLite's append path (see the module docstring): a connection and a thread of its own;
    a batch is one call on that thread, from BEGIN IMMEDIATE to COMMIT. The store's write lock
    keeps it and SQLAlchemy's writer from waiting on each other inside SQLite.

    Known cost: an event loop that never waits gives up the GIL and takes it back at every
    turn, so the thread, which needs the GIL after each call into SQLite, seldom gets it until
    the loop waits; see docs/decisions/store-append-path.md."""

    def __init__(self, path: str, synchronous: str, busy_ms: int) -> None:
        self._path = path
        self._pragmas = (f"PRAGMA busy_timeout = {busy_ms}", f"PRAGMA synchronous = {synchronous}")
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-sqlite-append")
        self._conn: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., None], *args: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def open(self) -> None:
        await self._call(self._open)

    async def write(self, batch: StoreBatch) -> None:
        await self._call(self._write, batch)

    async def close(self) -> None:
        try:
            await self._call(self._close)
        finally:
            self._thread.shutdown(wait=False)

    def _open(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        for pragma in self._pragmas:
            conn.execute(pragma)
        self._conn = conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _write(self, batch: StoreBatch) -> None:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            new = _new_workflows(batch)
            if new:
                taken: list[str] = []
                for chunk in _chunks(new):
                    marks = ", ".join("?" * len(chunk))
                    sql = f"SELECT id FROM plait_workflows WHERE id IN ({marks})"
                    taken.extend(r[0] for r in conn.execute(sql, list(chunk)).fetchall())
                _refuse_taken(taken)
            owner = batch.owner
            if owner is not None:
                stored: list[tuple[str, str | None]] = []
                for chunk in _chunks(_touched(batch)):
                    marks = ", ".join("?" * len(chunk))
                    sql = f"SELECT id, owner FROM plait_workflows WHERE id IN ({marks})"
                    stored.extend(conn.execute(sql, list(chunk)).fetchall())
                _fence(owner, stored)
            if batch.payloads:
                conn.executemany(_SQLITE_INSERT_PAYLOAD, batch.payloads.items())
            if batch.events:
                self._insert_events(conn, batch.events)
            if batch.workflows:
                rows = [_workflow_values(w) for w in batch.workflows]
                conn.executemany(_SQLITE_UPSERT_WORKFLOW, rows)
                if owner is not None:
                    lease = (
                        f"UPDATE plait_workflows SET owner = ?, lease_until = {_SQLITE_NOW} + ? "
                        "WHERE id = ? AND owner IS NULL"
                    )
                    conn.executemany(lease, [(owner, batch.lease_s, w.id) for w in batch.workflows])
            if batch.calls:
                conn.executemany(_SQLITE_INSERT_CALL, [_call_values(c) for c in batch.calls])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _insert_events(conn: sqlite3.Connection, records: Sequence[EventRecord]) -> None:
        first = _first_seqs(records)
        stored = {w: conn.execute(_SQLITE_MAX_SEQ, (w,)).fetchone()[0] for w in first}
        _check_seqs(records, first, stored)
        rows = _event_values(records)
        start = 0
        while start < len(rows):
            # The largest power of two that fits: a handful of statement texts, all cached.
            size = min(_SQLITE_ROWS, 1 << (len(rows) - start).bit_length() - 1)
            chunk = rows[start : start + size]
            conn.execute(_sqlite_insert_events(size), list(itertools.chain.from_iterable(chunk)))
            start += size
        refs = _ref_values(records)
        if refs:
            conn.executemany(_SQLITE_INSERT_REF, refs)


async def _write_postgres(conn: asyncpg.Connection, batch: StoreBatch) -> None:
    """The batch, inside the caller's transaction on `conn`."""
    new = _new_workflows(batch)
    if new:
        _refuse_taken([r[0] for r in await conn.fetch(_PG_TAKEN, new)])
    owner = batch.owner
    if owner is not None:
        rows = await conn.fetch(_PG_OWNERS, _touched(batch))
        _fence(owner, [(r[0], r[1]) for r in rows])
    if batch.payloads:
        await conn.execute(_PG_GC_SHARED)
        await conn.executemany(_INSERT_PAYLOAD, list(batch.payloads.items()))
    if batch.events:
        records = batch.events
        first = _first_seqs(records)
        stored = dict(await conn.fetch(_PG_MAX_SEQS, list(first)))
        _check_seqs(records, first, stored)
        await conn.copy_records_to_table(
            "plait_events", records=_event_values(records), columns=_EVENT_COLUMNS
        )
        refs = _ref_values(records)
        if refs:
            await conn.executemany(_INSERT_REF, refs)
    if batch.workflows:
        await conn.executemany(_UPSERT_WORKFLOW, [_workflow_values(w) for w in batch.workflows])
        if owner is not None:
            await conn.execute(_PG_LEASE_NEW, owner, batch.lease_s, [w.id for w in batch.workflows])
    if batch.calls:
        await conn.executemany(_INSERT_CALL, [_call_values(c) for c in batch.calls])


def _new_workflows(batch: StoreBatch) -> list[str]:
    """The workflows the batch begins (their first event, seq 1, is in it), sorted."""
    return sorted({e.workflow for e in batch.events if e.seq == 1})


def _refuse_taken(taken: Sequence[str]) -> None:
    """A new workflow's id names a stored one: refuse the batch rather than merge the two
    (the workflow row would be replaced, moving the stored run to the new one's tenant)."""
    if taken:
        raise WorkflowExistsError(sorted(taken))


def _touched(batch: StoreBatch) -> list[str]:
    """Every workflow a batch writes to, sorted (rows are locked in one order)."""
    ids = {e.workflow for e in batch.events}
    ids.update(w.id for w in batch.workflows)
    ids.update(c.workflow for c in batch.calls if c.workflow is not None)
    return sorted(ids)


def _fence(owner: str, stored: Sequence[tuple[str, str | None]]) -> None:
    """Refuse a batch that writes to a workflow leased to another engine (or released): it
    was taken over after `owner`'s lease ran out. Workflows not stored yet are new."""
    lost = [workflow for workflow, holder in stored if holder != owner]
    if lost:
        raise LeaseLostError(owner, sorted(lost))


def _first_seqs(records: Sequence[EventRecord]) -> dict[str, int]:
    """Each workflow's first seq in the batch; a gap or a repeat inside the batch is refused."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for record in records:
        workflow, seq = record.workflow, record.seq
        previous = last.get(workflow)
        if previous is None:
            first[workflow] = seq
        elif seq != previous + 1:
            raise _gap(record, previous + 1)
        last[workflow] = seq
    return first


def _check_seqs(
    records: Sequence[EventRecord], first: Mapping[str, int], stored: Mapping[str, int | None]
) -> None:
    """Each workflow's first seq in the batch continues what is stored (`stored`: its max)."""
    for workflow, seq in first.items():
        expected = (stored.get(workflow) or 0) + 1
        if seq != expected:
            raise _gap(next(r for r in records if r.workflow == workflow), expected)


def _event_values(records: Sequence[EventRecord]) -> list[tuple[Any, ...]]:
    return [
        (w, s, k, at, d, json.dumps(dict(r), sort_keys=True) if r else None)
        for w, s, k, at, d, r in records
    ]


def _ref_values(records: Sequence[EventRecord]) -> list[tuple[str, str]]:
    refs = {(e.workflow, d) for e in records if e.refs for d in e.refs.values()}
    return sorted(refs)


def _workflow_values(row: WorkflowRow) -> tuple[Any, ...]:
    # As SQLAlchemy's JSON type writes it: no labels is JSON null, not SQL NULL.
    labels = json.dumps(dict(row.labels)) if row.labels else "null"
    return (
        row.id, row.name, row.status, row.priority, row.deadline, row.created, row.updated,
        row.finished, row.tenant, labels,
    )  # fmt: skip


def _call_values(call: CallRecord) -> tuple[Any, ...]:
    return (call.program, call.request_hash, call.digest, call.workflow)
