"""Alembic migrations of the store's schema, run by `SQLStore.open()` (no alembic.ini)."""
