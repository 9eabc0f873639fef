"""`SQLBoardStore`: the blackboard's posts, claims and log in the SQL store's database.

It satisfies `agents.BoardStore` structurally (see that protocol for what each write
means). A batch of writes is one transaction; each kind of write is one statement for the
whole batch (renewals, releases and failures, which are rare, one each), and the log's rows
go in with one more. What a batch does is written once, as a plan (`_plan_write`) that
yields the statements it needs and reads their answers; a driver per database runs it:

- SQLite: the whole batch is one call on the store's append thread, on its connection
  (`sqlite3`, not aiosqlite): BEGIN IMMEDIATE, the statements, COMMIT. Through SQLAlchemy on
  aiosqlite each statement was a round trip between the event loop and the driver's thread;
  a commit of a hundred posts and awards took 35-45 ms, most of it those round trips. The
  store's write lock is held meanwhile, as for the journal's appends, which share the thread.
- PostgreSQL: one asyncpg transaction on a pooled connection; sets of rows go in and out
  as arrays (`unnest`): a statement is one round trip.

Durability: a write's answer is returned only after its transaction committed, with the
store's `synchronous` setting (FULL by default: the WAL is synced, so the batch survives a
power cut; PostgreSQL with its default `synchronous_commit = on` likewise).

Exactly-once awards rest on one conditional UPDATE: a post goes from open to claimed, with
its attempt counter raised, only where it is still open. On SQLite writers take turns
(BEGIN IMMEDIATE); on PostgreSQL the second of two boards updating the same row waits for
the first's commit, then finds the row no longer open and awards nothing. The claim's key
(post, attempt) would refuse a second award of one attempt even so.
"""

from __future__ import annotations

import functools
import itertools
import json
import sqlite3
from collections.abc import Generator, Sequence
from typing import Any

import asyncpg
import sqlalchemy as sa

from orchestrator import StoreError

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

_ROWS = 200
"""Rows per multi-row statement on SQLite: at most 10 values each, well under its limit of
32,766 bound parameters."""
P, C, E = t.board_posts.c, t.board_claims.c, t.board_events

Step = tuple[str, tuple[Any, ...]]
"""(statement name, arguments): one of the `_SQLiteSteps` / `_PostgresSteps` methods."""
Plan = Generator[Step, Any, Any]


# --- what a batch does, written once ---------------------------------------------------------


def _plan_write(ops: Sequence[tuple[str, str, dict[str, Any]]]) -> Plan:
    """Apply `ops` (see `agents.BoardWrite`); returns one answer per op."""
    results = [0] * len(ops)
    by_kind: dict[str, list[int]] = {}
    for i, (kind, _, _) in enumerate(ops):
        if kind not in _PHASES:
            raise ValueError(f"unknown board write {kind!r}")
        by_kind.setdefault(kind, []).append(i)
    log: list[tuple[str, str, float, str]] = []
    for kind in _PHASES:
        index = by_kind.get(kind)
        if index:
            got = yield from _PLANS[kind]([ops[i] for i in index], log)
            for i, value in zip(index, got, strict=True):
                results[i] = value
    if log:
        yield ("log", (log,))
    return results


def _plan_post(ops: Sequence[Any], log: list[Any]) -> Plan:
    rows = []
    for _, _, f in ops:
        rows.append((
            f["id"], f["poster"], json.dumps(f["content"]),
            json.dumps(sorted(f["capabilities"])), f["posted_at"], f["deadline"],
            f["workflow"], f["max_attempts"],
        ))  # fmt: skip
    # A post id already stored is refused by its key (ON CONFLICT DO NOTHING); RETURNING
    # names the rows that went in.
    fresh: set[str] = set((yield ("insert_posts", (rows,))))
    results = []
    for _, post_id, f in ops:
        if post_id in fresh:
            fresh.discard(post_id)  # the same id twice in one batch: the first is the post
            data = {k: f[k] for k in _POST_FIELDS}
            data["capabilities"] = sorted(f["capabilities"])
            log.append(_log("posted", post_id, f["posted_at"], data))
            results.append(1)
        else:
            results.append(0)
    return results


def _plan_award(ops: Sequence[Any], log: list[Any]) -> Plan:
    won: dict[str, int] = dict((yield ("award", ([post_id for _, post_id, _ in ops],))))
    claims, results = [], []
    for _, post_id, f in ops:
        attempt = won.pop(post_id, 0)  # a post twice in one batch: the first wins
        results.append(attempt)
        if attempt:
            claims.append((post_id, attempt, f["holder"], f["bid"], f["lease_until"]))
            data = {"attempt": attempt, "holder": f["holder"], "bid": f["bid"]}
            log.append(_log("awarded", post_id, f["at"], {**data, "lease_until": f["lease_until"]}))
    if claims:
        yield ("insert_claims", (claims,))
    return results


def _plan_renew(ops: Sequence[Any], log: list[Any]) -> Plan:
    results = []
    for _, post_id, f in ops:
        done = yield ("renew", (post_id, f["attempt"], f["lease_until"]))
        results.append(int(done))
    return results


def _plan_answer(ops: Sequence[Any], log: list[Any]) -> Plan:
    pairs = [(post_id, f["attempt"]) for _, post_id, f in ops]
    live: dict[tuple[str, int], str] = {
        (p, a): h for p, a, h in (yield ("answer_claims", (pairs,)))
    }
    rows, results = [], []
    for _, post_id, f in ops:
        holder = live.pop((post_id, f["attempt"]), None)
        results.append(int(holder is not None))
        if holder is not None:
            rows.append((post_id, json.dumps(f["result"]), holder))
            data = {"attempt": f["attempt"], "holder": holder, "result": f["result"]}
            log.append(_log("answered", post_id, f["at"], data))
    if rows:
        yield ("settle_posts", (rows,))
    return results


def _plan_release(ops: Sequence[Any], log: list[Any]) -> Plan:
    results = []
    for _, post_id, f in ops:
        holder = yield ("end_claim", (post_id, f["attempt"], "released"))
        if holder is None:
            results.append(0)
        else:
            results.append((yield from _plan_reopen(post_id, f["attempt"], holder, f, log)))
    return results


def _plan_reopen(
    post_id: str, attempt: int, holder: str, f: dict[str, Any], log: list[Any]
) -> Plan:
    max_attempts = yield ("max_attempts", (post_id,))
    outcome, failure = _release_outcome(attempt, max_attempts, f["reason"])
    yield ("set_post", (post_id, "failed" if failure else "open", failure))
    data = {"attempt": attempt, "holder": holder, "reason": f["reason"]}
    log.append(_log("released", post_id, f["at"], {**data, "reopened": failure is None}))
    if failure:
        log.append(_log("post_failed", post_id, f["at"], {"reason": failure}))
    return outcome


def _plan_fail(ops: Sequence[Any], log: list[Any]) -> Plan:
    results = []
    for _, post_id, f in ops:
        done = yield ("fail_post", (post_id, f["reason"]))
        results.append(int(done))
        if done:
            log.append(_log("post_failed", post_id, f["at"], {"reason": f["reason"]}))
    return results


_PLANS = {
    "post": _plan_post,
    "award": _plan_award,
    "renew": _plan_renew,
    "answer": _plan_answer,
    "release": _plan_release,
    "fail": _plan_fail,
}


def _plan_expire(now: float) -> Plan:
    ended = sorted((yield ("expire_claims", (now,))))
    log: list[Any] = []
    expired = []
    for post_id, attempt, holder in ended:
        f = {"reason": f"the lease of {holder!r} expired", "at": now}
        outcome = yield from _plan_reopen(post_id, attempt, holder, f, log)
        expired.append((post_id, attempt, holder, outcome == 1))
    if log:
        yield ("log", (log,))
    return expired


def _log(kind: str, post_id: str, at: float, data: dict[str, Any]) -> tuple[str, str, float, str]:
    return (kind, post_id, at, json.dumps(data))


def _release_outcome(attempt: int, max_attempts: int, reason: str) -> tuple[int, str | None]:
    # The same rule and words as agents' in-process store (the contract tests hold them equal).
    if attempt >= max_attempts:
        return 2, f"all {max_attempts} claims failed; the last: {reason}"
    return 1, None


# --- the store ---------------------------------------------------------------------------------


class SQLBoardStore:
    """The board's store in `store`'s database (opened by the caller)."""

    def __init__(self, store: SQLStore) -> None:
        self.sql = store

    async def write(self, ops: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int]:
        results: list[int] = await self._run(_plan_write(ops))
        return results

    async def expire(self, now: float) -> list[tuple[str, int, str, bool]]:
        expired: list[tuple[str, int, str, bool]] = await self._run(_plan_expire(now))
        return expired

    async def _run(self, plan: Plan) -> Any:
        """Run `plan` in one transaction, committed before this returns."""
        if self.sql._sqlite:
            return await self._run_on_sqlite(plan)
        return await self._run_on_postgres(plan)

    async def _run_on_sqlite(self, plan: Plan) -> Any:
        sql = self.sql
        appender = sql._appender
        if appender is None:
            raise StoreError(f"the store, {sql.where}, is not open; use `async with store:`")
        answer: list[Any] = []
        async with sql._write_lock:
            with sql._translate("write to"):
                await appender._call(_run_sqlite, appender._conn, plan, answer)
        return answer[0]

    async def _run_on_postgres(self, plan: Plan) -> Any:
        with self.sql._translate("write to"):
            async with self.sql._engine(writer=True).connect() as conn:
                driver: asyncpg.Connection = (await conn.get_raw_connection()).driver_connection
                try:
                    async with driver.transaction():
                        return await _run_postgres(driver, plan)
                except BaseException:
                    if driver.is_closed():
                        await conn.invalidate()  # the pool must not hand it out again
                    raise

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


# --- SQLite: the plan in one call on the append thread -----------------------------------------


def _run_sqlite(conn: sqlite3.Connection | None, plan: Plan, answer: list[Any]) -> None:
    assert conn is not None
    conn.execute("BEGIN IMMEDIATE")
    try:
        answer.append(_drive(_SQLiteSteps(conn), plan))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _drive(steps: Any, plan: Plan) -> Any:
    try:
        step = next(plan)
        while True:
            name, args = step
            step = plan.send(getattr(steps, name)(*args))
    except StopIteration as done:
        return done.value


@functools.cache
def _values(columns: int, rows: int) -> str:
    row = "(" + ", ".join(["?"] * columns) + ")"
    return ", ".join([row] * rows)


def _chunks(rows: Sequence[Any]) -> Any:
    for start in range(0, len(rows), _ROWS):
        yield rows[start : start + _ROWS]


_POST_COLUMNS = (
    "id, poster, content, capabilities, posted_at, deadline, workflow, max_attempts, "
    "state, attempts"
)


class _SQLiteSteps:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def _many(self, sql: str, columns: int, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`sql` with `{}` replaced by a VALUES list, one statement per chunk of rows."""
        found: list[Any] = []
        for chunk in _chunks(rows):
            flat = list(itertools.chain.from_iterable(chunk))
            found.extend(self.conn.execute(sql.format(_values(columns, len(chunk))), flat))
        return found

    def insert_posts(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        rows = [(*row, "open", 0) for row in rows]
        sql = f"INSERT INTO plait_board_posts ({_POST_COLUMNS}) VALUES {{}} "
        sql += "ON CONFLICT (id) DO NOTHING RETURNING id"
        return [i for (i,) in self._many(sql, 10, rows)]

    def award(self, ids: Sequence[str]) -> list[tuple[str, int]]:
        sql = (
            "UPDATE plait_board_posts SET state = 'claimed', attempts = attempts + 1 "
            "WHERE state = 'open' AND id IN (VALUES {}) RETURNING id, attempts"
        )
        return self._many(sql, 1, [(i,) for i in ids])

    def insert_claims(self, rows: Sequence[tuple[Any, ...]]) -> None:
        rows = [(*row, "live") for row in rows]
        sql = "INSERT INTO plait_board_claims "
        sql += "(post_id, attempt, holder, bid, lease_until, state) VALUES {}"
        self._many(sql, 6, rows)

    def answer_claims(self, pairs: Sequence[tuple[str, int]]) -> list[tuple[str, int, str]]:
        sql = (
            "UPDATE plait_board_claims SET state = 'answered' WHERE state = 'live' "
            "AND (post_id, attempt) IN (VALUES {}) RETURNING post_id, attempt, holder"
        )
        return self._many(sql, 2, pairs)

    def settle_posts(self, rows: Sequence[tuple[str, str, str]]) -> None:
        sql = "UPDATE plait_board_posts SET state = 'answered', result = ?, answered_by = ? "
        self.conn.executemany(sql + "WHERE id = ?", [(r, h, i) for i, r, h in rows])

    def renew(self, post_id: str, attempt: int, until: float) -> bool:
        sql = "UPDATE plait_board_claims SET lease_until = ? "
        sql += "WHERE post_id = ? AND attempt = ? AND state = 'live'"
        return self.conn.execute(sql, (until, post_id, attempt)).rowcount > 0

    def end_claim(self, post_id: str, attempt: int, state: str) -> str | None:
        sql = "UPDATE plait_board_claims SET state = ? "
        sql += "WHERE post_id = ? AND attempt = ? AND state = 'live' RETURNING holder"
        row = self.conn.execute(sql, (state, post_id, attempt)).fetchone()
        return None if row is None else str(row[0])

    def max_attempts(self, post_id: str) -> int:
        sql = "SELECT max_attempts FROM plait_board_posts WHERE id = ?"
        return int(self.conn.execute(sql, (post_id,)).fetchone()[0])

    def set_post(self, post_id: str, state: str, reason: str | None) -> None:
        sql = "UPDATE plait_board_posts SET state = ?, reason = ? WHERE id = ?"
        self.conn.execute(sql, (state, reason, post_id))

    def fail_post(self, post_id: str, reason: str) -> bool:
        sql = "UPDATE plait_board_posts SET state = 'failed', reason = ? "
        sql += "WHERE id = ? AND state = 'open'"
        return self.conn.execute(sql, (reason, post_id)).rowcount > 0

    def expire_claims(self, now: float) -> list[tuple[str, int, str]]:
        sql = "UPDATE plait_board_claims SET state = 'expired' "
        sql += "WHERE state = 'live' AND lease_until <= ? RETURNING post_id, attempt, holder"
        return self.conn.execute(sql, (now,)).fetchall()

    def log(self, rows: Sequence[tuple[str, str, float, str]]) -> None:
        self._many("INSERT INTO plait_board_events (kind, post_id, at, data) VALUES {}", 4, rows)


# --- PostgreSQL: the plan in one asyncpg transaction -----------------------------------------


async def _run_postgres(conn: asyncpg.Connection, plan: Plan) -> Any:
    steps = _PostgresSteps(conn)
    try:
        step = next(plan)
        while True:
            name, args = step
            step = plan.send(await getattr(steps, name)(*args))
    except StopIteration as done:
        return done.value


class _PostgresSteps:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def insert_posts(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        columns = list(zip(*rows, strict=True))
        sql = (
            f"INSERT INTO plait_board_posts ({_POST_COLUMNS}) "
            "SELECT *, 'open', 0 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
            "$5::float8[], $6::float8[], $7::text[], $8::int[]) "
            "ON CONFLICT (id) DO NOTHING RETURNING id"
        )
        return [r[0] for r in await self.conn.fetch(sql, *columns)]

    async def award(self, ids: Sequence[str]) -> list[tuple[str, int]]:
        sql = (
            "UPDATE plait_board_posts SET state = 'claimed', attempts = attempts + 1 "
            "WHERE state = 'open' AND id = ANY($1::text[]) RETURNING id, attempts"
        )
        return [(r[0], r[1]) for r in await self.conn.fetch(sql, list(ids))]

    async def insert_claims(self, rows: Sequence[tuple[Any, ...]]) -> None:
        sql = (
            "INSERT INTO plait_board_claims (post_id, attempt, holder, bid, lease_until, state) "
            "SELECT *, 'live' FROM unnest($1::text[], $2::int[], $3::text[], $4::float8[], "
            "$5::float8[])"
        )
        await self.conn.execute(sql, *zip(*rows, strict=True))

    async def answer_claims(self, pairs: Sequence[tuple[str, int]]) -> list[tuple[str, int, str]]:
        sql = (
            "UPDATE plait_board_claims c SET state = 'answered' "
            "FROM unnest($1::text[], $2::int[]) AS u(p, a) "
            "WHERE c.state = 'live' AND c.post_id = u.p AND c.attempt = u.a "
            "RETURNING c.post_id, c.attempt, c.holder"
        )
        posts, attempts = [p for p, _ in pairs], [a for _, a in pairs]
        return [(r[0], r[1], r[2]) for r in await self.conn.fetch(sql, posts, attempts)]

    async def settle_posts(self, rows: Sequence[tuple[str, str, str]]) -> None:
        sql = (
            "UPDATE plait_board_posts p SET state = 'answered', result = u.r, answered_by = u.h "
            "FROM unnest($1::text[], $2::text[], $3::text[]) AS u(i, r, h) WHERE p.id = u.i"
        )
        await self.conn.execute(sql, *zip(*rows, strict=True))

    async def renew(self, post_id: str, attempt: int, until: float) -> bool:
        sql = "UPDATE plait_board_claims SET lease_until = $3 "
        sql += "WHERE post_id = $1 AND attempt = $2 AND state = 'live' RETURNING 1"
        return await self.conn.fetchval(sql, post_id, attempt, until) is not None

    async def end_claim(self, post_id: str, attempt: int, state: str) -> str | None:
        sql = "UPDATE plait_board_claims SET state = $3 "
        sql += "WHERE post_id = $1 AND attempt = $2 AND state = 'live' RETURNING holder"
        holder: str | None = await self.conn.fetchval(sql, post_id, attempt, state)
        return holder

    async def max_attempts(self, post_id: str) -> int:
        sql = "SELECT max_attempts FROM plait_board_posts WHERE id = $1"
        return int(await self.conn.fetchval(sql, post_id))

    async def set_post(self, post_id: str, state: str, reason: str | None) -> None:
        sql = "UPDATE plait_board_posts SET state = $2, reason = $3 WHERE id = $1"
        await self.conn.execute(sql, post_id, state, reason)

    async def fail_post(self, post_id: str, reason: str) -> bool:
        sql = "UPDATE plait_board_posts SET state = 'failed', reason = $2 "
        sql += "WHERE id = $1 AND state = 'open' RETURNING 1"
        return await self.conn.fetchval(sql, post_id, reason) is not None

    async def expire_claims(self, now: float) -> list[tuple[str, int, str]]:
        sql = "UPDATE plait_board_claims SET state = 'expired' "
        sql += "WHERE state = 'live' AND lease_until <= $1 RETURNING post_id, attempt, holder"
        return [(r[0], r[1], r[2]) for r in await self.conn.fetch(sql, now)]

    async def log(self, rows: Sequence[tuple[str, str, float, str]]) -> None:
        # unnest keeps the rows' order, so their seqs follow the batch's order. (COPY does
        # too, but asyncpg reads the table's columns first: one more round trip a batch.)
        sql = (
            "INSERT INTO plait_board_events (kind, post_id, at, data) "
            "SELECT k, p, a, d FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[]) "
            "WITH ORDINALITY AS u(k, p, a, d, n) ORDER BY n"
        )
        await self.conn.execute(sql, *zip(*rows, strict=True))
