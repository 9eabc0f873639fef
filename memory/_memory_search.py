"""The SQL of memory's searches, per dialect, and cosine ranking for embedding search.

User text reaches the full-text engines only as words of letters and digits
(`query_terms`), each quoted (FTS5) or joined by `|` (PostgreSQL's to_tsquery), and always
as a bound parameter: no quote, operator or parenthesis of the user's is ever parsed. The
scope and kind reach them as tokens of `scope_tokens` and `kind_token`, which no user word
can equal.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from ._memory_types import Scope

_COLUMNS = (
    "id", "kind", "tenant", "workflow", "agent", "namespace", "key", "version", "title",
    "text", "value", "tags", "source", "at", "forgotten",
)  # fmt: skip
_SELECT = ", ".join(f"m.{c}" for c in _COLUMNS)

# Both dialects rank the newest `window` rows that match in scope, and only those. The
# candidates are found by the full-text index alone, scope and kind included (the tokens of
# `scope_tokens`): no row is read to filter it, so a word found in most rows costs no more
# than `window` rows. The scope is checked once more on the rows returned, against the
# columns themselves: should the index ever disagree, a row is dropped, never leaked.
#
# SQLite: BM25 (title 4, text 1, tags 1, scope tokens 0) with the terms alone in the MATCH,
# so its document frequencies count the terms only (FTS5 counts every phrase's rows once per
# query: a scope token in it would cost a pass over the whole scope). `+rowid` keeps the
# candidate test a plain filter, so bm25() runs on candidates only.
_SQLITE_SEARCH = f"""
WITH c AS MATERIALIZED (
    SELECT rowid AS id FROM plait_memory_fts
    WHERE plait_memory_fts MATCH :scoped ORDER BY rowid DESC LIMIT :window
)
SELECT {_SELECT}, r.score FROM (
    SELECT rowid AS id, -bm25(plait_memory_fts, 4.0, 1.0, 1.0, 0.0) AS score
    FROM plait_memory_fts
    WHERE plait_memory_fts MATCH :match
    AND rowid >= coalesce((SELECT min(id) FROM c), 9223372036854775807)
    AND +rowid IN (SELECT id FROM c)
    ORDER BY score DESC, id DESC LIMIT :limit
) AS r JOIN plait_memory AS m ON m.id = r.id
WHERE m.kind IN :kinds AND {{scope}}
ORDER BY r.score DESC, m.id DESC
"""
# PostgreSQL: a GIN index cannot hand back the newest matches first (it finds every match and
# reads each row before anything can be sorted), so the search walks its scope's id ranges
# newest first, one GIN lookup per range and scope, and stops at `window` matches. Each lookup
# is the words AND one range token (schema v7; see `range_suffix`), a single required token
# that GIN's fast scan skips through long posting lists with. The walk (`ranges`) starts with
# ranges of 4,096 ids and moves to eight times larger ones only after eight of a size found
# too few: however common or rare the words, a lookup reads about a window of rows or fewer,
# and a word found nowhere costs a few dozen lookups. Rows come out in the walk's order (a
# nested loop keeps its outer rows' order, an unnested array keeps its own), each range's
# newest first, so the first `window` are the newest `window` matches. `OFFSET 0` keeps the
# lookup a query of its own: pulled up into the join, it could be planned as a walk of the
# primary key from the newest row (for the ORDER BY), reading the whole table once per range
# when the table has no statistics yet; the same fence makes the rows' lookup one primary-key
# probe per hit (without statistics, PostgreSQL read every row in scope to join them). Then
# ts_rank_cd on
# those (32: rank / (rank + 1), a score between 0 and 1).
_POSTGRES_SEARCH = f"""
WITH c AS MATERIALIZED (
    SELECT x.id, x.tsv FROM unnest(CAST(:ranges AS text[])) AS r(suffix)
    CROSS JOIN LATERAL (
        SELECT m.id, m.tsv FROM unnest(CAST(:scopes AS text[])) AS s(prefix)
        CROSS JOIN LATERAL (
            SELECT m.id, m.tsv FROM plait_memory AS m
            WHERE m.tsv @@ (
                to_tsquery('english', :match) && CAST(s.prefix || r.suffix || :only AS tsquery)
            )
            OFFSET 0
        ) AS m
        ORDER BY m.id DESC
    ) AS x
    LIMIT :window
)
SELECT {_SELECT}, r.score FROM (
    SELECT c.id, ts_rank_cd(c.tsv, to_tsquery('english', :match), 32) AS score FROM c
    ORDER BY score DESC, c.id DESC LIMIT :limit
) AS r CROSS JOIN LATERAL (SELECT * FROM plait_memory AS m WHERE m.id = r.id OFFSET 0) AS m
WHERE m.kind IN :kinds AND {{scope}}
ORDER BY r.score DESC, m.id DESC
"""
_RANGE_BITS = 12
"""The finest id range holds 2**12 ids; each level up is 2**3 times larger (schema v7)."""
_RANGE_LEVELS = 4
_EMBEDDED = f"""
SELECT {_SELECT}, m.embedding, 0.0 AS score
FROM plait_memory AS m
WHERE m.embedding IS NOT NULL AND m.latest AND NOT m.forgotten AND m.kind IN :kinds
AND {{scope}}
"""

_MARK = "\ue000"  # private use: unicode61 keeps it in a token; no query word holds one


def scope_tokens(scope: Scope, include_shared: bool) -> list[str]:
    """The full-text tokens of the scopes a search sees (see `Scope`): the migration's
    triggers index each row's own, `_MARK` "s" hex(tenant) "x" hex(workflow) "x" hex(agent)
    "0" (hex of UTF-8: one token per scope, and never one for two)."""
    own = scope.columns()
    if include_shared:
        combos = {("", "", "")} | {
            (own["tenant"], workflow, agent)
            for workflow in {own["workflow"], ""}
            for agent in {own["agent"], ""}
        }
    else:
        combos = {(own["tenant"], own["workflow"], own["agent"])}
    return sorted(_MARK + "s" + "x".join(v.encode().hex() for v in c) + "0" for c in combos)


def kind_token(kind: str) -> str:
    return f"{_MARK}k{kind}0"


def range_suffix(level: int, number: int) -> str:
    """What the PostgreSQL index's token for range `number` of `level` (the ids whose value
    shifted right by 12 + 3 * level bits is `number`) adds to a scope token without its final
    "0", as the v7 migration's trigger spells it."""
    return f"b{level}n{number}0"


def ranges(top: int) -> list[tuple[int, int]]:
    """The id ranges (level, number) a PostgreSQL search walks, newest first, covering ids 0
    to `top` once each: at least eight ranges of a size, then up a level at the first range
    that starts a range of the next size (the coarsest level takes the rest)."""
    walk: list[tuple[int, int]] = []
    level, number = 0, top >> _RANGE_BITS
    taken = 0
    while number >= 0:
        walk.append((level, number))
        taken += 1
        if level < _RANGE_LEVELS - 1 and taken >= 8 and number % 8 == 0:
            level, number, taken = level + 1, (number >> 3) - 1, 0
        else:
            number -= 1
    return walk


def scope_sql(scope: Scope, include_shared: bool, table: str) -> tuple[str, dict[str, Any]]:
    """The WHERE clause that keeps a search of `table` (an alias) inside `scope` (see
    `Scope`), and its parameters."""
    params: dict[str, Any] = {f"s_{k}": v for k, v in scope.columns().items()}
    if not include_shared:
        where = "m.tenant = :s_tenant AND m.workflow = :s_workflow AND m.agent = :s_agent"
    else:
        where = (
            "(m.tenant = :s_tenant OR (m.tenant = '' AND m.workflow = '' AND m.agent = ''))"
            " AND m.workflow IN (:s_workflow, '') AND m.agent IN (:s_agent, '')"
        )
    return where.replace("m.", f"{table}."), params


def search_sql(
    terms: Sequence[str] | None,
    scope: Scope,
    include_shared: bool,
    kinds: Sequence[str],
    *,
    postgres: bool,
    limit: int | None = None,
    window: int | None = None,
    top: int = 0,
) -> tuple[sa.TextClause, dict[str, Any]]:
    """A full-text search for any of `terms`: the best `limit` of the newest `window`
    matches in scope (on PostgreSQL among ids up to `top`, the largest in the table). With
    terms None: every embedded row in scope."""
    where, params = scope_sql(scope, include_shared, "m")
    params["kinds"] = list(kinds)
    if terms is None:
        text = _EMBEDDED
    else:
        tokens = scope_tokens(scope, include_shared)
        only = [kind_token(kinds[0])] if len(set(kinds)) == 1 else []
        if postgres:
            text = _POSTGRES_SEARCH
            params["match"] = " | ".join(terms)
            # Quoted lexemes, verbatim: hex digits, "x", "s", "b", "n", "k", a kind and _MARK
            # only. Each lookup's query is "'" + scope + range + "'" and the kind, if one.
            # (a range token split in two, so the SQL pairs every scope with every range).
            params["scopes"] = ["'" + t[:-1] for t in tokens]
            params["ranges"] = [range_suffix(lvl, n) + "'" for lvl, n in ranges(top)]
            params["only"] = "".join(f" & '{t}'" for t in only)
        else:
            text = _SQLITE_SEARCH
            params["match"] = " OR ".join(f'"{term}"' for term in terms)
            scoped = "scope : (" + " OR ".join(f'"{t}"' for t in tokens) + ")"
            params["scoped"] = " AND ".join(
                [f"({params['match']})", scoped, *(f'scope : "{t}"' for t in only)]
            )
        params.update(limit=limit, window=window)
    statement = sa.text(text.format(scope=where)).bindparams(sa.bindparam("kinds", expanding=True))
    return statement, params


def rank_similar(
    query: Sequence[float], rows: Sequence[Mapping[Any, Any]], limit: int
) -> list[tuple[Mapping[Any, Any], float]]:
    """The `limit` rows whose embedding is nearest `query` by cosine similarity, best first
    (ties: the newer row first). Rows whose vector length differs from the query's are
    skipped: they came from another embedder."""
    norm = math.sqrt(sum(x * x for x in query))
    scored: list[tuple[float, int, Mapping[Any, Any]]] = []
    for row in rows:
        vector = json.loads(row["embedding"])
        if len(vector) != len(query):
            continue
        length = math.sqrt(sum(x * x for x in vector))
        cosine = (
            0.0
            if not norm or not length
            else math.fsum(x * y for x, y in zip(query, vector, strict=True)) / (norm * length)
        )
        scored.append((cosine, row["id"], row))
    best = heapq.nlargest(limit, scored, key=lambda s: (s[0], s[1]))
    return [(row, score) for score, _, row in best]
