"""Schema version 3: a finished workflow's `compacted` mark; workflows indexed by finish time
(what retention and compaction select by).

Revision ID: v3
Revises: v2
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v3"
down_revision: str | None = "v2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOT NULL with a constant default: ADD COLUMN fills existing rows, in place on SQLite
    # and PostgreSQL alike.
    op.add_column(
        "plait_workflows",
        sa.Column("compacted", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("plait_workflows_finished", "plait_workflows", ["finished"])
    op.execute("UPDATE plait_meta SET value = '3' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
