"""What agent memory hands out and takes in: scopes, facts, notes, turns, hits, the embedder
protocol, its errors, and the checks every write and query goes through."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from orchestrator import UsageError

Kind = Literal["fact", "note"]
KINDS: tuple[Kind, ...] = ("fact", "note")
MAX_NAME = 200
"""Longest tenant, workflow, agent or namespace (the columns' width)."""
MAX_KEY = 500
MAX_QUERY_CHARS = 1000
MAX_QUERY_TERMS = 32


class MemoryQueryError(UsageError):
    """A search the memory cannot run: empty, unusable, too long, or asking for no kinds."""


class MemoryValueError(UsageError):
    """A write the memory refuses: a value that is not JSON, too large, or a bad name."""


class EmbedderError(UsageError):
    """The embedder broke its contract (one vector per text, all of one length, finite)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose memory: a tenant, a workflow, an agent, any of them or none. `Scope()` is the
    shared scope, which every search may widen to.

    Reads and writes name one scope exactly. A search widened with `include_shared` also
    sees the enclosing scopes: rows of the same tenant whose workflow and agent are each
    unset or equal to this scope's (an agent's memory across workflows, a workflow's across
    agents, the tenant's own), and rows of the shared scope. Never another tenant's rows,
    nor tenant-less rows other than the shared ones when a tenant is named."""

    tenant: str | None = None
    workflow: str | None = None
    agent: str | None = None

    def __post_init__(self) -> None:
        for field in ("tenant", "workflow", "agent"):
            value = getattr(self, field)
            if value is not None:
                check_name(f"scope {field}", value)

    @property
    def shared(self) -> bool:
        return self.tenant is None and self.workflow is None and self.agent is None

    def columns(self) -> dict[str, str]:
        """The stored form: "" for an unset field."""
        return {
            "tenant": self.tenant or "",
            "workflow": self.workflow or "",
            "agent": self.agent or "",
        }

    @classmethod
    def from_columns(cls, tenant: str, workflow: str, agent: str) -> Scope:
        return cls(tenant or None, workflow or None, agent or None)


@dataclass(frozen=True, slots=True)
class Fact:
    """One version of a fact. `forgotten` marks a tombstone: `forget` wrote it, its `value`
    is None, and the versions before it are still there to read."""

    scope: Scope
    namespace: str
    key: str
    version: int
    value: Any
    tags: tuple[str, ...]
    source: str | None
    at: float
    forgotten: bool = False
    kind: Literal["fact"] = "fact"


@dataclass(frozen=True, slots=True)
class Note:
    """A note or a document: text kept exactly as written, with an id of the store's."""

    id: int
    scope: Scope
    title: str | None
    text: str
    tags: tuple[str, ...]
    source: str | None
    at: float
    kind: Literal["note"] = "note"


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: the item and its score (higher is better; comparable within one
    search only)."""

    item: Fact | Note
    score: float

    @property
    def kind(self) -> Kind:
        return self.item.kind


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of an agent's conversation in a workflow, numbered from 1."""

    tenant: str | None
    workflow: str
    agent: str
    seq: int
    role: str
    content: str
    at: float


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors for `Memory.similar`: one vector per text, all of one length."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


# --- checks ---------------------------------------------------------------------------------


def check_name(what: str, value: object, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise MemoryValueError(
            f"{what} {value!r} is not a name: pass a non-empty string of at most {limit} characters"
        )
    return value


def check_source(source: object) -> None:
    if source is not None:
        check_name("source", source, 500)


def check_tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str) or not isinstance(tags, Sequence | set | frozenset):
        raise MemoryValueError(
            f"tags {tags!r} must be a sequence of strings, such as ('a', 'b'), not one string"
        )
    for tag in tags:
        check_name("tag", tag)
    return tuple(tags)


def encode_value(value: Any, limit: int) -> str:
    """The JSON text of `value`, refused unless it reads back as the same value."""
    _check_json(value, "value")
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    size = len(text.encode())
    if size > limit:
        raise MemoryValueError(
            f"the value is {size} bytes as JSON, over the limit of {limit} bytes "
            "(Memory(max_value_bytes=...)); store a large document with note(), or raise "
            "the limit"
        )
    return text


def _check_json(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MemoryValueError(
                f"{path} is {value!r}, which JSON cannot hold; store a finite number or null"
            )
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise MemoryValueError(
                    f"{path} has the key {key!r}, which is not a string; JSON objects have "
                    "string keys only (JSON would turn it into a string silently)"
                )
            _check_json(item, f"{path}[{key!r}]")
        return
    raise MemoryValueError(
        f"{path} is a {type(value).__name__} ({value!r:.80}), which is not JSON data; "
        "store dicts, lists, strings, numbers, booleans and None (convert it first)"
    )


def search_text(namespace: str, key: str, value: Any) -> str:
    """What search reads of a fact: its namespace, key and every string and number in it."""
    words = [namespace, key]
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            words.extend(str(k) for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif item is not None and not isinstance(item, bool):
            words.append(str(item))
    return " ".join(words)


_TERM = re.compile(r"[^\W_]+")


def query_terms(query: object) -> list[str]:
    """The words of a user's query, lower-cased: letters and digits only, so no quote,
    operator or parenthesis ever reaches a full-text engine's syntax."""
    if not isinstance(query, str):
        raise MemoryQueryError(f"the search query {query!r} is not a string; pass text")
    if len(query) > MAX_QUERY_CHARS:
        raise MemoryQueryError(
            f"the search query is {len(query)} characters, over the limit of "
            f"{MAX_QUERY_CHARS}; search with a few words"
        )
    terms = list(dict.fromkeys(_TERM.findall(query.lower())))
    if not terms:
        raise MemoryQueryError(
            f"the search query {query!r} has no words to search for; pass some words "
            "(punctuation and operators are ignored)"
        )
    if len(terms) > MAX_QUERY_TERMS:
        raise MemoryQueryError(
            f"the search query has {len(terms)} distinct words, over the limit of "
            f"{MAX_QUERY_TERMS}; search with fewer words"
        )
    return terms


def check_kinds(kinds: object) -> tuple[Kind, ...]:
    if isinstance(kinds, str) or not isinstance(kinds, Sequence):
        raise MemoryQueryError(f"kinds {kinds!r} must be a sequence such as ('fact', 'note')")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise MemoryQueryError(f"kinds {tuple(kinds)!r} must name one or more of {KINDS!r}")
    return tuple(dict.fromkeys(kinds))


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise MemoryQueryError(f"limit {limit!r} must be an integer from 1 to 1000")
    return limit
