"""Persistent memory: the SQL store (SQLite and PostgreSQL through SQLAlchemy), and agent
memory on it: versioned facts, notes, conversations, full-text and embedding search.

`SQLStore` implements orchestrator's `Store`; `Memory` keeps what agents remember in the
same database.
"""

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
    "SQLStore",
    "Scope",
    "Turn",
    "store_url",
]
