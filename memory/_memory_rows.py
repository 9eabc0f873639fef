"""Memory's rows: scope filters, rows to facts and notes, and retention's deletes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from . import _schema as t
from ._memory_types import Fact, MemoryValueError, Note, Scope


def exact(scope: Scope, columns: Any = None) -> tuple[sa.ColumnElement[bool], ...]:
    c = t.memory.c if columns is None else columns
    s = scope.columns()
    return (c.tenant == s["tenant"], c.workflow == s["workflow"], c.agent == s["agent"])


def item_from(row: Mapping[Any, Any]) -> Fact | Note:
    scope = Scope.from_columns(row["tenant"], row["workflow"], row["agent"])
    return fact_from(scope, row) if row["kind"] == "fact" else note_from(scope, row)


def fact_from(scope: Scope, row: Mapping[Any, Any]) -> Fact:
    forgotten = bool(row["forgotten"])
    return Fact(
        scope=scope,
        namespace=row["namespace"],
        key=row["key"],
        version=row["version"],
        value=None if forgotten or row["value"] is None else json.loads(row["value"]),
        tags=tuple(json.loads(row["tags"])),
        source=row["source"],
        at=row["at"],
        forgotten=forgotten,
    )


def note_from(scope: Scope, row: Mapping[Any, Any]) -> Note:
    return Note(
        id=row["id"],
        scope=scope,
        title=row["title"],
        text=row["text"],
        tags=tuple(json.loads(row["tags"])),
        source=row["source"],
        at=row["at"],
    )


def retention(
    keep_versions: int | None,
    keep_turns: int | None,
    older_than_s: float | None,
    cutoff: float | None,
    drop_latest: bool,
    scope: Scope | None,
) -> list[sa.Delete]:
    """The deletes of `Memory.retain` (which documents the arguments), checked."""
    for name, bound in (("keep_versions", keep_versions), ("keep_turns", keep_turns)):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int) or bound < 1
        ):
            raise MemoryValueError(f"{name}={bound!r} must be an integer of at least 1, or None")
    if older_than_s is not None and not older_than_s >= 0:
        raise MemoryValueError(f"older_than_s={older_than_s!r} must be a number >= 0, or None")
    m, c = t.memory.c, t.memory_turns.c
    where_m = [] if scope is None else list(exact(scope))
    where_c = [] if scope is None else list(exact(scope, c))
    statements: list[sa.Delete] = []
    if keep_versions is not None:
        newer = t.memory.alias("newer")
        n = newer.c
        kept = sa.exists().where(
            n.tenant == m.tenant, n.workflow == m.workflow, n.agent == m.agent,
            n.namespace == m.namespace, n.key == m.key, n.latest,
            n.version >= m.version + keep_versions,
        )  # fmt: skip
        statements.append(t.memory.delete().where(*where_m, m.kind == "fact", ~m.latest, kept))
    if keep_turns is not None:
        later = t.memory_turns.alias("later")
        newest = (
            sa.select(sa.func.max(later.c.seq))
            .where(
                later.c.tenant == c.tenant,
                later.c.workflow == c.workflow,
                later.c.agent == c.agent,
            )
            .scalar_subquery()
        )
        statements.append(t.memory_turns.delete().where(*where_c, c.seq <= newest - keep_turns))
    if older_than_s is not None:
        droppable = sa.or_(m.kind == "note", ~m.latest, sa.true() if drop_latest else sa.false())
        statements.append(t.memory.delete().where(*where_m, m.at < cutoff, droppable))
        statements.append(t.memory_turns.delete().where(*where_c, c.at < cutoff))
    return statements
