"""Persistent memory and the SQL store (SQLite and PostgreSQL through SQLAlchemy).

Nothing is public yet: the store, the event log and agent memory arrive with the
durability issue. The package exists now so that the import-direction rule is checked
from the start.
"""

__all__: list[str] = []
