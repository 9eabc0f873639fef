"""The SQL of memory's searches, per dialect, and cosine ranking for embedding search.

User text reaches the full-text engines only as words of letters and digits
(`query_terms`), each quoted (FTS5) or joined by `|` (PostgreSQL's to_tsquery), and always
as a bound parameter: no quote, operator or parenthesis of the user's is ever parsed.
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

# FTS5's `rank` (BM25, configured in the migration) is lower for better matches. The inner
# query never leaves the FTS5 table: it filters on the copied scope columns and FTS5 sorts
# rowids by rank alone; only the rows returned are joined.
_SQLITE_SEARCH = f"""
SELECT {_SELECT}, -f.rank AS score
FROM (
    SELECT rowid AS id, rank FROM plait_memory_fts AS f
    WHERE plait_memory_fts MATCH :match AND f.kind IN :kinds AND {{scope}}
    AND f.rowid >= :floor
    ORDER BY rank LIMIT :limit
) AS f JOIN plait_memory AS m ON m.id = f.id
ORDER BY f.rank, m.id DESC
"""
_SQLITE_FLOOR = """
SELECT rowid FROM plait_memory_fts AS f
WHERE plait_memory_fts MATCH :match AND f.kind IN :kinds AND {scope}
ORDER BY rowid DESC LIMIT 1 OFFSET :window
"""
# 32: rank / (rank + 1), a score between 0 and 1.
_POSTGRES_SEARCH = f"""
SELECT {_SELECT}, ts_rank_cd(m.tsv, to_tsquery('english', :match), 32) AS score
FROM plait_memory AS m
WHERE m.tsv @@ to_tsquery('english', :match) AND m.kind IN :kinds AND {{scope}} AND m.id >= :floor
ORDER BY score DESC, m.id DESC
LIMIT :limit
"""
_POSTGRES_FLOOR = """
SELECT m.id FROM plait_memory AS m
WHERE m.tsv @@ to_tsquery('english', :match) AND m.kind IN :kinds AND {scope}
ORDER BY m.id DESC LIMIT 1 OFFSET :window
"""
_EMBEDDED = f"""
SELECT {_SELECT}, m.embedding, 0.0 AS score
FROM plait_memory AS m
WHERE m.embedding IS NOT NULL AND m.latest AND NOT m.forgotten AND m.kind IN :kinds
AND {{scope}}
"""


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
    floor: int = 0,
    window: int | None = None,
) -> tuple[sa.TextClause, dict[str, Any]]:
    """A full-text search for any of `terms` among rows with ids from `floor`; with
    `window`, the query for the floor instead: the id of the `window`-th newest match (no row
    if there are fewer). With terms None: every embedded row in scope."""
    where, params = scope_sql(scope, include_shared, "m" if terms is None or postgres else "f")
    params["kinds"] = list(kinds)
    if terms is None:
        text = _EMBEDDED
    elif postgres:
        text = _POSTGRES_SEARCH if window is None else _POSTGRES_FLOOR
        params["match"] = " | ".join(terms)
    else:
        text = _SQLITE_SEARCH if window is None else _SQLITE_FLOOR
        params["match"] = " OR ".join(f'"{term}"' for term in terms)
    if terms is not None:
        params.update(
            {"limit": limit, "floor": floor} if window is None else {"window": window - 1}
        )
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
