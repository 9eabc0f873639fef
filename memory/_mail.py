"""`SQLMailStore`: peer messages kept in the SQL store's database, beside the event log.

It is what `agents.PostOffice` needs of a mail store (`agents.MailStore`), written without
importing `agents`: the protocol speaks in tuples, and this class matches it structurally.

Durability: `post` and `publish` return once their transaction has committed (on SQLite
with `synchronous=FULL`, the store's default, after the log was synced), so a message that
`send` returned for survives a crash of any process. A lease is a committed mark
(`leased_until`), so a receiver that dies holding messages hands them on when the mark runs
out; an ack deletes the row.

Leasing on PostgreSQL takes a transaction-scoped advisory lock per mailbox, then reads with
`FOR UPDATE SKIP LOCKED`: two receivers of one mailbox (in any processes) take turns, so
the second sees the first one's leases and never hands out a later message of a stream the
first one holds. On SQLite the store's one writer does the same.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from . import _schema as t
from ._sql import SQLStore

Box = tuple[str, str, str]
TopicKey = tuple[str, str, str]

_MAIL_LOCK = 0x6D61696C
"""Advisory lock class ("mail"); the mailbox's CRC is the key within it. Two-int keys
never meet the store's own one-bigint advisory locks."""


@dataclass(frozen=True, slots=True)
class LeasedMessage:
    """A message handed out by `SQLMailStore.lease` (an `agents.StoredMessage`)."""

    receipt: int
    box: Box
    sender: Box
    seq: int
    topic: str | None
    kind: str
    body: str
    sent_at: float
    attempt: int
    leased_until: float


class SQLMailStore:
    """Peer messages in `store`'s database (which must be open while this is used); see
    the module docstring for what is durable when."""

    def __init__(self, store: SQLStore) -> None:
        if not isinstance(store, SQLStore):
            raise TypeError(f"SQLMailStore needs an SQLStore, got {type(store).__name__}")
        self._store = store
        self._postgres = store.url.get_backend_name() == "postgresql"

    async def post(self, sender: Box, to: Box, *, kind: str, body: str, at: float) -> int:
        async with self._store._write() as conn:
            seq = await self._next_seq(conn, sender)
            await conn.execute(t.mail.insert().values(_row(sender, seq, to, None, kind, body, at)))
        return seq

    async def publish(
        self, sender: Box, topic: TopicKey, *, kind: str, body: str, at: float
    ) -> tuple[int, int]:
        s = t.mail_topics.c
        query = (
            sa.select(s.workflow, s.agent)
            .where(s.tenant == topic[0], s.scope == topic[1], s.topic == topic[2])
            .order_by(s.workflow, s.agent)
        )
        async with self._store._write() as conn:
            boxes = [(topic[0], w, a) for w, a in await conn.execute(query)]
            seq = await self._next_seq(conn, sender)
            if boxes:
                rows = [_row(sender, seq, box, topic[2], kind, body, at) for box in boxes]
                await conn.execute(t.mail.insert(), rows)
        return seq, len(boxes)

    async def subscribe(self, topic: TopicKey, box: Box) -> None:
        values = dict(zip(("tenant", "scope", "topic"), topic, strict=True))
        values.update(workflow=box[1], agent=box[2])
        async with self._store._write() as conn:
            insert = self._insert(t.mail_topics).values(values).on_conflict_do_nothing()
            await conn.execute(insert)

    async def unsubscribe(self, topic: TopicKey, box: Box) -> bool:
        s = t.mail_topics.c
        delete = t.mail_topics.delete().where(
            s.tenant == topic[0],
            s.scope == topic[1],
            s.topic == topic[2],
            s.workflow == box[1],
            s.agent == box[2],
        )
        async with self._store._write() as conn:
            return (await conn.execute(delete)).rowcount > 0

    async def lease(self, box: Box, *, now: float, until: float, limit: int) -> list[LeasedMessage]:
        m = t.mail.c
        held = t.mail.alias("held")
        # A stream (one sender's messages to this mailbox) with a live lease is not touched.
        busy = (
            sa.exists()
            .where(
                *_in_box(held.c, box),
                held.c.sender_workflow == m.sender_workflow,
                held.c.sender_agent == m.sender_agent,
                held.c.leased_until > now,
            )
            .correlate(t.mail)
        )
        # Ids grow with every message, and a sender's seq with every send, both assigned in
        # one transaction that holds the sender's counter row: id order is each sender's
        # own order, so the first `limit` by id take a prefix of every stream.
        query = (
            sa.select(m.id, m.sender_workflow, m.sender_agent, m.seq, m.topic)
            .add_columns(m.kind, m.body, m.sent_at, m.attempts)
            .where(*_in_box(m, box), sa.not_(busy))
            .order_by(m.id)
            .limit(limit)
        )
        async with self._store._write() as conn:
            if self._postgres:
                key = zlib.crc32("\x00".join(box).encode()) - (1 << 31)
                await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MAIL_LOCK, key)))
                query = query.with_for_update(skip_locked=True, of=t.mail)
            rows = (await conn.execute(query)).all()
            if rows:
                mark = (
                    t.mail.update()
                    .where(m.id.in_([r.id for r in rows]))
                    .values(attempts=m.attempts + 1, leased_until=until)
                )
                await conn.execute(mark)
        return [
            LeasedMessage(
                receipt=r.id,
                box=box,
                sender=(box[0], r.sender_workflow, r.sender_agent),
                seq=r.seq,
                topic=r.topic,
                kind=r.kind,
                body=r.body,
                sent_at=r.sent_at,
                attempt=r.attempts + 1,
                leased_until=until,
            )
            for r in rows
        ]

    async def lease_ends(self, box: Box, *, now: float) -> float | None:
        m = t.mail.c
        query = sa.select(sa.func.min(m.leased_until)).where(*_in_box(m, box), m.leased_until > now)
        async with self._store._read() as conn:
            ends = (await conn.execute(query)).scalar_one_or_none()
        return None if ends is None else float(ends)

    async def ack(self, box: Box, receipts: Sequence[int]) -> int:
        if not receipts:
            return 0
        m = t.mail.c
        delete = t.mail.delete().where(*_in_box(m, box), m.id.in_(sorted(set(receipts))))
        async with self._store._write() as conn:
            return (await conn.execute(delete)).rowcount

    # --- inside ----------------------------------------------------------------------------

    async def _next_seq(self, conn: AsyncConnection, sender: Box) -> int:
        """The sender's next sequence number, counted in the caller's transaction (which
        holds the counter's row until it commits, so concurrent sends queue behind it)."""
        c = t.mail_senders.c
        insert = self._insert(t.mail_senders).values(
            tenant=sender[0], workflow=sender[1], agent=sender[2], last_seq=1
        )
        upsert = insert.on_conflict_do_update(
            index_elements=[c.tenant, c.workflow, c.agent], set_={"last_seq": c.last_seq + 1}
        ).returning(c.last_seq)
        return int((await conn.execute(upsert)).scalar_one())

    def _insert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._postgres else sqlite.insert(table)


def _in_box(
    columns: sa.ColumnCollection[str, sa.ColumnElement[object]], box: Box
) -> list[sa.ColumnElement[bool]]:
    return [columns.tenant == box[0], columns.workflow == box[1], columns.agent == box[2]]


def _row(
    sender: Box, seq: int, to: Box, topic: str | None, kind: str, body: str, at: float
) -> dict[str, object]:
    return {
        "tenant": to[0],
        "workflow": to[1],
        "agent": to[2],
        "sender_workflow": sender[1],
        "sender_agent": sender[2],
        "seq": seq,
        "topic": topic,
        "kind": kind,
        "body": body,
        "sent_at": at,
        "attempts": 0,
    }
