"""`Memory`: what agents keep across tasks and runs, in the same SQL store as the event log.

Every write is kept exactly as the caller wrote it: nothing here rewrites, summarises or
merges memory, and no model is ever asked to. A fact is versioned per (scope, namespace,
key): `remember` adds a version, `forget` adds a tombstone, and the versions before stay
readable until the user's own `retain` call bounds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator import Clock, SystemClock

from . import _schema as t
from ._memory_rows import exact, fact_from, item_from, note_from, retention
from ._memory_search import rank_similar, search_sql
from ._memory_types import (
    MAX_KEY,
    Embedder,
    EmbedderError,
    Fact,
    Hit,
    Kind,
    MemoryValueError,
    Note,
    Scope,
    Turn,
    check_kinds,
    check_limit,
    check_name,
    check_source,
    check_tags,
    encode_value,
    query_terms,
    search_text,
)
from ._sql import SQLStore

_SHARED = Scope()
_CHUNK = 500
_EMBED_BATCH = 256


class Memory:
    """Agent memory over an open `SQLStore` (its database, engines and transactions).

    `clock` stamps each row (`at`) and dates retention; `embedder`, when given, stores a
    vector with each fact and note for `similar`. `max_value_bytes` bounds a fact's JSON and
    `max_note_bytes` a note's text: larger writes are refused, naming the limit.
    `search_window` bounds the work of one search: only the newest `search_window` rows
    that match in its scope are ranked (ranking costs time per row, and a word found in
    most rows would otherwise cost a pass over them all); see `search`."""

    def __init__(
        self,
        store: SQLStore,
        *,
        clock: Clock | None = None,
        embedder: Embedder | None = None,
        max_value_bytes: int = 64 * 1024,
        max_note_bytes: int = 1024 * 1024,
        search_window: int = 1000,
    ) -> None:
        self.store = store
        self._clock = clock or SystemClock()
        self._embedder = embedder
        self._max_value = max_value_bytes
        self._max_note = max_note_bytes
        if (
            isinstance(search_window, bool)
            or not isinstance(search_window, int)
            or search_window < 1
        ):
            raise MemoryValueError(f"search_window={search_window!r} must be an integer >= 1")
        self._window = search_window
        self._postgres = store.url.get_backend_name() == "postgresql"

    # --- facts ------------------------------------------------------------------------------

    async def remember(
        self,
        namespace: str,
        key: str,
        value: Any,
        *,
        tags: Iterable[str] = (),
        source: str | None = None,
        scope: Scope = _SHARED,
    ) -> Fact:
        """Store `value` (JSON data) as the next version of (scope, namespace, key)."""
        (fact,) = await self.remember_many(
            [(namespace, key, value)], tags=tags, source=source, scope=scope
        )
        return fact

    async def remember_many(
        self,
        facts: Iterable[tuple[str, str, Any]],
        *,
        tags: Iterable[str] = (),
        source: str | None = None,
        scope: Scope = _SHARED,
    ) -> list[Fact]:
        """`remember` for many (namespace, key, value) at once, in one transaction: each
        becomes the next version of its key, in order (a key given twice gets two)."""
        tag_list = check_tags(tuple(tags) if not isinstance(tags, str) else tags)
        check_source(source)
        now = self._clock.now()
        rows: list[dict[str, Any]] = []
        for namespace, key, value in facts:
            check_name("namespace", namespace)
            check_name("key", key, MAX_KEY)
            rows.append(
                {
                    "kind": "fact", "namespace": namespace, "key": key,
                    "value": encode_value(value, self._max_value),
                    "text": search_text(namespace, key, value), "title": None,
                    "tags": json.dumps(tag_list), "source": source, "at": now,
                    "forgotten": False,
                }
            )  # fmt: skip
        await self._embed_rows(rows)
        async with self.store._write() as conn:
            await self._put_facts(conn, scope, rows)
        return [fact_from(scope, row) for row in rows]

    async def fact(self, namespace: str, key: str, *, scope: Scope = _SHARED) -> Fact | None:
        """The latest version of the fact, or None if there is none or it was forgotten."""
        latest = await self._facts(namespace, key, scope, latest_only=True)
        return latest[0] if latest and not latest[0].forgotten else None

    async def versions(self, namespace: str, key: str, *, scope: Scope = _SHARED) -> list[Fact]:
        """Every kept version of the fact, oldest first, tombstones included."""
        return await self._facts(namespace, key, scope, latest_only=False)

    async def forget(
        self, namespace: str, key: str, *, source: str | None = None, scope: Scope = _SHARED
    ) -> Fact | None:
        """Mark the fact forgotten with a tombstone version; the versions before it stay
        readable through `versions`. None (and nothing written) if it is absent or already
        forgotten."""
        check_name("namespace", namespace)
        check_name("key", key, MAX_KEY)
        check_source(source)
        m = t.memory.c
        row = {
            "kind": "fact", "namespace": namespace, "key": key, "value": None, "text": "",
            "title": None, "tags": "[]", "source": source, "at": self._clock.now(),
            "forgotten": True, "embedding": None,
        }  # fmt: skip
        async with self.store._write() as conn:
            await self._lock(conn, scope, namespace)
            query = sa.select(m.forgotten).where(
                *exact(scope), m.namespace == namespace, m.key == key, m.latest
            )
            live = (await conn.execute(query)).scalar_one_or_none()
            if live is None or live:
                return None
            await self._put_facts(conn, scope, [row], locked=True)
        return fact_from(scope, row)

    async def _facts(
        self, namespace: str, key: str, scope: Scope, *, latest_only: bool
    ) -> list[Fact]:
        m = t.memory.c
        query = (
            sa.select(t.memory)
            .where(*exact(scope), m.kind == "fact", m.namespace == namespace, m.key == key)
            .order_by(m.version)
        )
        if latest_only:
            query = query.where(m.latest)
        async with self.store._read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [fact_from(scope, row) for row in rows]

    async def _put_facts(
        self,
        conn: AsyncConnection,
        scope: Scope,
        rows: list[dict[str, Any]],
        *,
        locked: bool = False,
    ) -> None:
        """Number each row as its key's next version and make the last of each key the
        latest, inside the caller's transaction."""
        m = t.memory.c
        columns = scope.columns()
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_namespace.setdefault(row["namespace"], []).append(row)
        for namespace in sorted(by_namespace):  # locks in one order: no deadlock between writers
            group = by_namespace[namespace]
            if not locked:
                await self._lock(conn, scope, namespace)
            keys = sorted({row["key"] for row in group})
            versions: dict[str, int] = {}
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                where = (*exact(scope), m.namespace == namespace, m.key.in_(chunk), m.latest)
                found = await conn.execute(sa.select(m.key, m.version).where(*where))
                versions.update({k: v for k, v in found})
                await conn.execute(t.memory.update().where(*where).values(latest=False))
            last = {row["key"]: i for i, row in enumerate(group)}
            for i, row in enumerate(group):
                version = versions.get(row["key"], 0) + 1
                versions[row["key"]] = version
                row.update(columns, version=version, latest=last[row["key"]] == i)
                row.setdefault("embedding", None)
        await conn.execute(t.memory.insert(), rows)

    async def _lock(self, conn: AsyncConnection, scope: Scope, name: str) -> None:
        """PostgreSQL: serialise writers of one (scope, name) until the transaction ends, so
        two never take the same version number. SQLite's writes are serial already."""
        if self._postgres:
            c = scope.columns()
            lock_key = "\x1f".join((c["tenant"], c["workflow"], c["agent"], name))
            await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(lock_key))))

    # --- notes ------------------------------------------------------------------------------

    async def note(
        self,
        text: str,
        *,
        title: str | None = None,
        tags: Iterable[str] = (),
        source: str | None = None,
        scope: Scope = _SHARED,
    ) -> Note:
        """Keep a note or a document, exactly as written; searchable by its title, text and tags."""
        if not isinstance(text, str) or not text.strip():
            raise MemoryValueError(f"note text {text!r} must be a non-empty string")
        size = len(text.encode())
        if size > self._max_note:
            raise MemoryValueError(
                f"the note is {size} bytes, over the limit of {self._max_note} bytes "
                "(Memory(max_note_bytes=...)); split the document, or raise the limit"
            )
        if title is not None and not isinstance(title, str):
            raise MemoryValueError(f"note title {title!r} must be a string or None")
        check_source(source)
        tag_list = check_tags(tuple(tags) if not isinstance(tags, str) else tags)
        row: dict[str, Any] = {
            "kind": "note", "title": title, "text": text, "value": None,
            "tags": json.dumps(tag_list), "source": source, "at": self._clock.now(),
            "forgotten": False, "latest": True, **scope.columns(),
        }  # fmt: skip
        await self._embed_rows([row])
        async with self.store._write() as conn:
            result = await conn.execute(t.memory.insert().returning(t.memory.c.id), row)
            note_id = int(result.scalar_one())
        return note_from(scope, {**row, "id": note_id})

    # --- search -----------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        *,
        scope: Scope = _SHARED,
        include_shared: bool = True,
        kinds: Sequence[Kind] = ("fact", "note"),
        limit: int = 10,
    ) -> list[Hit]:
        """Facts (latest live versions) and notes matching any word of `query`, best first.

        The query is split into words (letters and digits; case, punctuation and operators
        ignored), so any text is safe to pass; one with no words is a `MemoryQueryError`.
        Ranking: BM25 on SQLite (FTS5's `bm25()`, a title weighing 4 times the text);
        PostgreSQL has no BM25, so there it is `ts_rank_cd` over a GIN-indexed tsvector
        (cover density, normalised by rank/(rank+1)), which orders similarly but not the
        same. Words are stemmed (Porter on SQLite, 'english' on PostgreSQL), and PostgreSQL
        also drops English stop words.

        Bounded work: only the newest `search_window` (Memory's argument, 1000 by default)
        rows matching in scope are ranked; an older row, however relevant, is found only
        when fewer than that many newer rows match. On SQLite the BM25 statistics (how rare
        each word is) count every row of the store, all scopes; no row outside the scope
        is ever returned."""
        terms = query_terms(query)
        args = (terms, scope, include_shared, check_kinds(kinds))
        limit = check_limit(limit)
        async with self.store._read() as conn:
            top = 0
            if self._postgres:  # the walk over id ranges starts at the newest (search_sql)
                top = await conn.scalar(sa.select(sa.func.max(t.memory.c.id)))
                if top is None:
                    return []
            statement = search_sql(
                *args, postgres=self._postgres, limit=limit, window=self._window, top=top
            )
            rows = (await conn.execute(*statement)).mappings().all()
        return [Hit(item_from(row), float(row["score"])) for row in rows]

    async def similar(
        self,
        query: str,
        *,
        scope: Scope = _SHARED,
        include_shared: bool = True,
        kinds: Sequence[Kind] = ("fact", "note"),
        limit: int = 10,
    ) -> list[Hit]:
        """Facts and notes nearest to `query` by the embedder's vectors (cosine similarity,
        computed in plain Python over the scope's rows: meant for thousands of rows, not
        millions). Rows written before an embedder was configured are not searched."""
        if self._embedder is None:
            raise MemoryValueError(
                "similar() needs an embedder: pass Memory(store, embedder=...), or use search()"
            )
        if not isinstance(query, str) or not query.strip():
            query_terms(query)  # raises the clear error
        (vector,) = await self._embed([query])
        statement = search_sql(
            None, scope, include_shared, check_kinds(kinds), postgres=self._postgres
        )
        async with self.store._read() as conn:
            rows = (await conn.execute(*statement)).mappings().all()
        ranked = rank_similar(vector, rows, check_limit(limit))
        return [Hit(item_from(row), score) for row, score in ranked]

    async def _embed_rows(self, rows: list[dict[str, Any]]) -> None:
        if self._embedder is None:
            return
        texts = [" ".join(filter(None, (row["title"], row["text"]))) for row in rows]
        vectors = await self._embed(texts)
        for row, vector in zip(rows, vectors, strict=True):
            row["embedding"] = json.dumps(vector)

    async def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        assert self._embedder is not None
        vectors: list[list[float]] = []
        for start in range(0, len(texts), _EMBED_BATCH):
            batch = texts[start : start + _EMBED_BATCH]
            got = await self._embedder.embed(batch)
            if len(got) != len(batch):
                raise EmbedderError(
                    f"the embedder {type(self._embedder).__name__} returned {len(got)} vectors "
                    f"for {len(batch)} texts; it must return one per text"
                )
            vectors.extend([float(x) for x in v] for v in got)
        if vectors and len({len(v) for v in vectors}) != 1:
            raise EmbedderError(
                f"the embedder {type(self._embedder).__name__} returned vectors of different "
                "lengths; every vector must have the same length"
            )
        return vectors

    # --- conversations ----------------------------------------------------------------------

    async def append_turn(
        self, agent: str, workflow: str, role: str, content: str, *, tenant: str | None = None
    ) -> Turn:
        """Add a message to the agent's conversation in `workflow`, numbered after the last."""
        scope = Scope(tenant, check_name("workflow", workflow), check_name("agent", agent))
        check_name("role", role, 32)
        if not isinstance(content, str):
            raise MemoryValueError(f"turn content {content!r:.80} must be a string")
        c = t.memory_turns.c
        now = self._clock.now()
        async with self.store._write() as conn:
            await self._lock(conn, scope, "\x1eturns")
            last = await conn.execute(sa.select(sa.func.max(c.seq)).where(*exact(scope, c)))
            seq = (last.scalar_one() or 0) + 1
            row = {**scope.columns(), "seq": seq, "role": role, "content": content, "at": now}
            await conn.execute(t.memory_turns.insert(), row)
        return Turn(tenant, workflow, agent, seq, role, content, now)

    async def conversation(
        self,
        agent: str,
        workflow: str,
        *,
        tenant: str | None = None,
        last: int | None = None,
        max_chars: int | None = None,
    ) -> list[Turn]:
        """The conversation, oldest first: all of it, or its `last` turns, or as many of the
        newest as fit in `max_chars` characters of content (what keeps a prompt in bounds)."""
        scope = Scope(tenant, check_name("workflow", workflow), check_name("agent", agent))
        for name, bound in (("last", last), ("max_chars", max_chars)):
            if bound is not None and (
                isinstance(bound, bool) or not isinstance(bound, int) or bound < 0
            ):
                raise MemoryValueError(f"{name}={bound!r} must be a non-negative integer or None")
        c = t.memory_turns.c
        query = sa.select(t.memory_turns).where(*exact(scope, c)).order_by(c.seq.desc())
        if last is not None:
            query = query.limit(last)
        turns: list[Turn] = []
        used = 0
        async with self.store._read() as conn:
            result = await conn.stream(query)
            async for row in result.mappings():
                used += len(row["content"])
                if max_chars is not None and used > max_chars:
                    break
                turns.append(
                    Turn(
                        tenant, workflow, agent, row["seq"], row["role"], row["content"], row["at"]
                    )
                )
        return turns[::-1]

    # --- retention --------------------------------------------------------------------------

    async def retain(
        self,
        *,
        keep_versions: int | None = None,
        keep_turns: int | None = None,
        older_than_s: float | None = None,
        drop_latest: bool = False,
        scope: Scope | None = None,
    ) -> int:
        """Bound memory's growth; returns how many rows went.

        `keep_versions=N` keeps each fact's newest N versions; `keep_turns=N` each
        conversation's newest N turns; `older_than_s` drops superseded fact versions, notes
        and turns written longer ago than that. A fact's latest version (a tombstone
        included) goes only with `drop_latest=True` and `older_than_s`. `scope` limits all
        of it to one scope exactly; None means every scope."""
        cutoff = None if older_than_s is None else self._clock.now() - older_than_s
        statements = retention(keep_versions, keep_turns, older_than_s, cutoff, drop_latest, scope)
        gone = 0
        async with self.store._write() as conn:
            for statement in statements:
                gone += (await conn.execute(statement)).rowcount
        return gone
