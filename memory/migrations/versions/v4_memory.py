"""Schema version 4: agent memory: conversation history, versioned facts, notes and
documents, full-text search.

Revision ID: v4
Revises: v3
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401  (the tables come with the feature that uses them)
from alembic import op

revision = "v4"
down_revision: str | None = "v3"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE plait_meta SET value = '4' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
