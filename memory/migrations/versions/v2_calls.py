"""Schema version 2: recorded LLM call results; a workflow's tenant and labels.

Revision ID: v2
Revises: v1
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v2"
down_revision: str | None = "v1"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plait_calls",
        sa.Column("program", sa.String(200), primary_key=True),
        sa.Column("request_hash", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("workflow_id", sa.String(200), nullable=True),
    )
    op.create_index("plait_calls_digest", "plait_calls", ["digest"])
    op.create_index("plait_calls_workflow", "plait_calls", ["workflow_id"])
    # Plain ADD COLUMN (nullable, no default) works in place on SQLite and PostgreSQL.
    op.add_column("plait_workflows", sa.Column("tenant", sa.String(200), nullable=True))
    op.add_column("plait_workflows", sa.Column("labels", sa.JSON, nullable=True))
    op.create_index("plait_workflows_tenant", "plait_workflows", ["tenant", "created"])
    op.execute("UPDATE plait_meta SET value = '2' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
