"""Persistent memory: the SQL store (SQLite and PostgreSQL through SQLAlchemy).

`SQLStore` implements orchestrator's `Store`; `SQLMailStore` keeps agents' peer messages in
the same database; agent memory arrives later.
"""

from ._mail import SQLMailStore
from ._sql import SQLStore, store_url

__all__ = ["SQLMailStore", "SQLStore", "store_url"]
