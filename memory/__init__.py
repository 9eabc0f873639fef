"""Persistent memory: the SQL store (SQLite and PostgreSQL through SQLAlchemy).

`SQLStore` implements orchestrator's `Store`; `SQLBoardStore` keeps the blackboard in the
same database (it satisfies `agents.BoardStore`). Agent memory arrives later.
"""

from ._board import SQLBoardStore
from ._sql import SQLStore, store_url

__all__ = ["SQLStore", "store_url", "SQLBoardStore"]
