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

# FTS5's bm25() is lower for better matches; its weights follow the columns: title, text, tags.
_SQLITE_SEARCH = f"""
SELECT {_SELECT}, -bm25(plait_memory_fts, 4.0, 1.0, 1.0) AS score
FROM plait_memory_fts JOIN plait_memory AS m ON m.id = plait_memory_fts.rowid
WHERE plait_memory_fts MATCH :match AND m.kind IN :kinds AND {{scope}}
ORDER BY score DESC, m.id DESC
LIMIT :limit
"""
# 32: rank / (rank + 1), a score between 0 and 1.
_POSTGRES_SEARCH = f"""
SELECT {_SELECT}, ts_rank_cd(m.tsv, q, 32) AS score
FROM plait_memory AS m, to_tsquery('english', :match) AS q
WHERE m.tsv @@ q AND m.kind IN :kinds AND {{scope}}
ORDER BY score DESC, m.id DESC
LIMIT :limit
"""
_EMBEDDED = f"""
SELECT {_SELECT}, m.embedding, 0.0 AS score
FROM plait_memory AS m
WHERE m.embedding IS NOT NULL AND m.latest AND NOT m.forgotten AND m.kind IN :kinds
AND {{scope}}
"""


def scope_sql(scope: Scope, include_shared: bool) -> tuple[str, dict[str, Any]]:
    """The WHERE clause that keeps a search inside `scope` (see `Scope`), and its parameters."""
    params: dict[str, Any] = {f"s_{k}": v for k, v in scope.columns().items()}
    if not include_shared:
        return "m.tenant = :s_tenant AND m.workflow = :s_workflow AND m.agent = :s_agent", params
    return (
        "(m.tenant = :s_tenant OR (m.tenant = '' AND m.workflow = '' AND m.agent = ''))"
        " AND m.workflow IN (:s_workflow, '') AND m.agent IN (:s_agent, '')",
        params,
    )


def search_sql(
    terms: Sequence[str] | None,
    scope: Scope,
    include_shared: bool,
    kinds: Sequence[str],
    limit: int | None,
    *,
    postgres: bool,
) -> tuple[sa.TextClause, dict[str, Any]]:
    """A full-text search for any of `terms`, or (terms None) every embedded row in scope."""
    where, params = scope_sql(scope, include_shared)
    params["kinds"] = list(kinds)
    if terms is None:
        text = _EMBEDDED
    elif postgres:
        text = _POSTGRES_SEARCH
        params.update(match=" | ".join(terms), limit=limit)
    else:
        text = _SQLITE_SEARCH
        params.update(match=" OR ".join(f'"{term}"' for term in terms), limit=limit)
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
