"""Persistent memory: the SQL store (SQLite and PostgreSQL through SQLAlchemy), and what
agents keep in it: versioned facts, notes, conversations, full-text and embedding search,
and the blackboard.

`SQLStore` implements orchestrator's `Store`; `Memory` keeps what agents remember in the
same database; `SQLBoardStore` keeps the blackboard there (it satisfies
`agents.BoardStore`); `SQLMailStore` keeps agents' peer messages there (it satisfies
`agents.MailStore`).
"""

from ._board import SQLBoardStore
from ._mail import SQLMailStore
from ._memory import Memory
from ._memory_types import (
    Embedder,
    EmbedderError,
    Fact,
    Hit,
    MemoryQueryError,
    MemoryValueError,
    Note,
    Scope,
    Turn,
)
from ._notify import PgNotifier, RedisNotifier
from ._sql import SQLStore, store_url

__all__ = [
    "Embedder",
    "EmbedderError",
    "Fact",
    "Hit",
    "Memory",
    "MemoryQueryError",
    "MemoryValueError",
    "Note",
    "PgNotifier",
    "RedisNotifier",
    "SQLBoardStore",
    "SQLMailStore",
    "SQLStore",
    "Scope",
    "Turn",
    "store_url",
]
