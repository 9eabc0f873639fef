"""Persistent memory: the SQL store (SQLite and PostgreSQL through SQLAlchemy).

`SQLStore` implements orchestrator's `Store`; agent memory arrives later.
"""

from ._sql import SQLStore, store_url

__all__ = ["SQLStore", "store_url"]
