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
# PostgreSQL: two GIN conditions (the words; scope and kind), the newest `window` matches
# by id, then ts_rank_cd on those (32: rank / (rank + 1), a score between 0 and 1).
_POSTGRES_SEARCH = f"""
WITH c AS MATERIALIZED (
    SELECT m.id, m.tsv FROM plait_memory AS m
    WHERE m.tsv @@ to_tsquery('english', :match) AND m.tsv @@ CAST(:scoped AS tsquery)
    ORDER BY m.id DESC LIMIT :window
)
SELECT {_SELECT}, r.score FROM (
    SELECT c.id, ts_rank_cd(c.tsv, to_tsquery('english', :match), 32) AS score FROM c
    ORDER BY score DESC, c.id DESC LIMIT :limit
) AS r JOIN plait_memory AS m ON m.id = r.id
WHERE m.kind IN :kinds AND {{scope}}
ORDER BY r.score DESC, m.id DESC
"""
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
) -> tuple[sa.TextClause, dict[str, Any]]:
    """A full-text search for any of `terms`: the best `limit` of the newest `window`
    matches in scope. With terms None: every embedded row in scope."""
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
            # Quoted lexemes, verbatim: hex digits, "x", "s", "k", a kind and _MARK only.
            scoped = "(" + " | ".join(f"'{t}'" for t in tokens) + ")"
            params["scoped"] = " & ".join([scoped, *(f"'{t}'" for t in only)])
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
