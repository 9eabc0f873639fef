"""Schema version 5: peer messages: mailboxes and topics, delivered at least once.

Revision ID: v5
Revises: v4
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401  (the tables come with the feature that uses them)
from alembic import op

revision = "v5"
down_revision: str | None = "v4"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE plait_meta SET value = '5' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
