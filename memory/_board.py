"""`SQLBoardStore`: the blackboard's posts, claims and log in the SQL store's database.

It satisfies `agents.BoardStore` structurally (see that protocol for what each write
means). A batch of writes is one transaction, each kind of write one or two statements
for the whole batch, so hundreds of awards share a commit.

Exactly-once awards rest on one conditional UPDATE: a post goes from open to claimed, with
its attempt counter raised, only where it is still open. On SQLite writers take turns
(BEGIN IMMEDIATE); on PostgreSQL the second of two boards updating the same row waits for
the first's commit, then finds the row no longer open and awards nothing. The claim's key
(post, attempt) would refuse a second award of one attempt even so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from . import _schema as t
from ._sql import SQLStore

_POST_FIELDS = (
    "id", "content", "capabilities", "poster", "posted_at", "deadline", "workflow",
    "max_attempts",
)  # fmt: skip
_PHASES = ("post", "award", "renew", "answer", "release", "fail")
"""Writes of one batch run kind by kind in this order (a post before its award). Writes to
different posts commute; the board never puts two conflicting writes of one post in one
batch except a post and its award."""

_CHUNK = 1000
"""Ids per IN (...) list: well under SQLite's and asyncpg's bound-parameter limits."""
P, C, E = t.board_posts.c, t.board_claims.c, t.board_events


class SQLBoardStore:
    """The board's store in `store`'s database (opened by the caller)."""

    def __init__(self, store: SQLStore) -> None:
        self.sql = store

    async def write(self, ops: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int]:
        results = [0] * len(ops)
        by_kind: dict[str, list[int]] = {}
        for i, (kind, _, _) in enumerate(ops):
            if kind not in _PHASES:
                raise ValueError(f"unknown board write {kind!r}")
            by_kind.setdefault(kind, []).append(i)
        async with self.sql._write() as conn:
            log: list[dict[str, Any]] = []
            for kind in _PHASES:
                index = by_kind.get(kind)
                if index:
                    batch = [ops[i] for i in index]
                    got = await getattr(self, f"_{kind}")(conn, batch, log)
                    for i, value in zip(index, got, strict=True):
                        results[i] = value
            if log:
                await conn.execute(E.insert(), log)
        return results

    async def _post(self, conn: AsyncConnection, ops: Sequence[Any], log: list[Any]) -> list[int]:
        rows = []
        for _, _, f in ops:
            row = {k: f[k] for k in _POST_FIELDS}
            row["content"] = json.dumps(f["content"])
            row["capabilities"] = json.dumps(sorted(f["capabilities"]))
            rows.append({**row, "state": "open", "attempts": 0})
        # Posts are new ids (random, or given once); a repeat is refused by its key.
        known = await self._existing(conn, [r["id"] for r in rows])
        fresh = [r for r in rows if r["id"] not in known]
        if fresh:
            await conn.execute(t.board_posts.insert(), fresh)
        for _, post_id, f in ops:
            if post_id not in known:
                data = {k: f[k] for k in _POST_FIELDS}
                data["capabilities"] = sorted(f["capabilities"])
                log.append(_log("posted", post_id, f["posted_at"], data))
        return [0 if r["id"] in known else 1 for r in rows]

    async def _existing(self, conn: AsyncConnection, ids: list[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(ids), _CHUNK):
            query = sa.select(P.id).where(P.id.in_(ids[start : start + _CHUNK]))
            found.update((await conn.execute(query)).scalars())
        return found

    async def _award(self, conn: AsyncConnection, ops: Sequence[Any], log: list[Any]) -> list[int]:
        ids = [post_id for _, post_id, _ in ops]
        won: dict[str, int] = {}
        for start in range(0, len(ids), _CHUNK):
            update = (
                t.board_posts.update()
                .where(P.state == "open", P.id.in_(ids[start : start + _CHUNK]))
                .values(state="claimed", attempts=P.attempts + 1)
                .returning(P.id, P.attempts)
            )
            won.update((await conn.execute(update)).all())
        claims, results = [], []
        for _, post_id, f in ops:
            attempt = won.pop(post_id, 0)  # a post twice in one batch: the first wins
            results.append(attempt)
            if attempt:
                claim = {"holder": f["holder"], "bid": f["bid"], "lease_until": f["lease_until"]}
                claims.append({"post_id": post_id, "attempt": attempt, "state": "live", **claim})
                log.append(_log("awarded", post_id, f["at"], {"attempt": attempt, **claim}))
        if claims:
            await conn.execute(t.board_claims.insert(), claims)
        return results

    async def _renew(self, conn: AsyncConnection, ops: Sequence[Any], log: list[Any]) -> list[int]:
        results = []
        for _, post_id, f in ops:
            update = (
                t.board_claims.update()
                .where(_live(post_id, f["attempt"]))
                .values(lease_until=f["lease_until"])
            )
            results.append(int((await conn.execute(update)).rowcount > 0))
        return results

    async def _answer(self, conn: AsyncConnection, ops: Sequence[Any], log: list[Any]) -> list[int]:
        pairs = [(post_id, f["attempt"]) for _, post_id, f in ops]
        live: dict[tuple[str, int], str] = {}
        for start in range(0, len(pairs), _CHUNK):
            chunk = pairs[start : start + _CHUNK]
            update = (
                t.board_claims.update()
                .where(C.state == "live", sa.tuple_(C.post_id, C.attempt).in_(chunk))
                .values(state="answered")
                .returning(C.post_id, C.attempt, C.holder)
            )
            live.update({(p, a): h for p, a, h in (await conn.execute(update)).all()})
        rows, results = [], []
        for _, post_id, f in ops:
            holder = live.pop((post_id, f["attempt"]), None)
            results.append(int(holder is not None))
            if holder is not None:
                result = json.dumps(f["result"])
                rows.append({"i": post_id, "r": result, "h": holder})
                data = {"attempt": f["attempt"], "holder": holder, "result": f["result"]}
                log.append(_log("answered", post_id, f["at"], data))
        if rows:
            settle = (
                t.board_posts.update()
                .where(P.id == sa.bindparam("i"))
                .values(state="answered", result=sa.bindparam("r"), answered_by=sa.bindparam("h"))
            )
            await conn.execute(settle, rows)
        return results

    async def _release(
        self, conn: AsyncConnection, ops: Sequence[Any], log: list[Any], state: str = "released"
    ) -> list[int]:
        results = []
        for _, post_id, f in ops:
            update = (
                t.board_claims.update()
                .where(_live(post_id, f["attempt"]))
                .values(state=state)
                .returning(C.holder)
            )
            holder = (await conn.execute(update)).scalar_one_or_none()
            if holder is None:
                results.append(0)
                continue
            results.append(await self._reopen(conn, post_id, f["attempt"], holder, f, log))
        return results

    async def _reopen(
        self,
        conn: AsyncConnection,
        post_id: str,
        attempt: int,
        holder: str,
        f: dict[str, Any],
        log: list[Any],
    ) -> int:
        query = sa.select(P.max_attempts).where(P.id == post_id)
        max_attempts = (await conn.execute(query)).scalar_one()
        outcome, failure = _release_outcome(attempt, max_attempts, f["reason"])
        values = {"state": "failed", "reason": failure} if failure else {"state": "open"}
        await conn.execute(t.board_posts.update().where(P.id == post_id).values(**values))
        data = {"attempt": attempt, "holder": holder, "reason": f["reason"]}
        log.append(_log("released", post_id, f["at"], {**data, "reopened": failure is None}))
        if failure:
            log.append(_log("post_failed", post_id, f["at"], {"reason": failure}))
        return outcome

    async def _fail(self, conn: AsyncConnection, ops: Sequence[Any], log: list[Any]) -> list[int]:
        results = []
        for _, post_id, f in ops:
            fail = (
                t.board_posts.update()
                .where(P.id == post_id, P.state == "open")
                .values(state="failed", reason=f["reason"])
            )
            done = (await conn.execute(fail)).rowcount > 0
            results.append(int(done))
            if done:
                log.append(_log("post_failed", post_id, f["at"], {"reason": f["reason"]}))
        return results

    async def expire(self, now: float) -> list[tuple[str, int, str, bool]]:
        async with self.sql._write() as conn:
            update = (
                t.board_claims.update()
                .where(C.state == "live", C.lease_until <= now)
                .values(state="expired")
                .returning(C.post_id, C.attempt, C.holder)
            )
            ended = sorted((await conn.execute(update)).all())
            log: list[dict[str, Any]] = []
            expired = []
            for post_id, attempt, holder in ended:
                f = {"reason": f"the lease of {holder!r} expired", "at": now}
                outcome = await self._reopen(conn, post_id, attempt, holder, f, log)
                expired.append((post_id, attempt, holder, outcome == 1))
            if log:
                await conn.execute(E.insert(), log)
        return expired

    async def posts(self, states: Sequence[str]) -> list[dict[str, Any]]:
        live = sa.and_(C.post_id == P.id, C.attempt == P.attempts, C.state == "live")
        query = (
            sa.select(t.board_posts, C.holder, C.lease_until)
            .select_from(t.board_posts.outerjoin(t.board_claims, live))
            .where(P.state.in_(list(states)))
            .order_by(P.posted_at, P.id)
        )
        async with self.sql._read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        found = []
        for row in rows:
            post = dict(row)
            post["content"] = json.loads(post["content"])
            post["capabilities"] = json.loads(post["capabilities"])
            post["result"] = None if post["result"] is None else json.loads(post["result"])
            found.append(post)
        return found

    async def events(
        self, after: int = 0, limit: int = 10_000
    ) -> list[tuple[int, str, str, float, dict[str, Any]]]:
        query = (
            sa.select(E.c.seq, E.c.kind, E.c.post_id, E.c.at, E.c.data)
            .where(E.c.seq > after)
            .order_by(E.c.seq)
            .limit(limit)
        )
        async with self.sql._read() as conn:
            rows = (await conn.execute(query)).all()
        return [(s, k, p, at, json.loads(d)) for s, k, p, at, d in rows]


def _live(post_id: str, attempt: int) -> sa.ColumnElement[bool]:
    return sa.and_(C.post_id == post_id, C.attempt == attempt, C.state == "live")


def _log(kind: str, post_id: str, at: float, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "post_id": post_id, "at": at, "data": json.dumps(data)}


def _release_outcome(attempt: int, max_attempts: int, reason: str) -> tuple[int, str | None]:
    # The same rule and words as agents' in-process store (the contract tests hold them equal).
    if attempt >= max_attempts:
        return 2, f"all {max_attempts} claims failed; the last: {reason}"
    return 1, None
