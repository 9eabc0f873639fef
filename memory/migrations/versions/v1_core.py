"""Schema version 1: workflows, events, payloads and their references.

Revision ID: v1
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v1"
down_revision: str | None = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "plait_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "plait_workflows",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("deadline", sa.Double, nullable=True),
        sa.Column("created", sa.Double, nullable=False),
        sa.Column("updated", sa.Double, nullable=False),
        sa.Column("finished", sa.Double, nullable=True),
    )
    op.create_index("plait_workflows_status", "plait_workflows", ["status", "created"])
    op.create_table(
        "plait_events",
        sa.Column("workflow_id", sa.String(200), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("refs", sa.Text, nullable=True),
    )
    op.create_table(
        "plait_payloads",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "plait_payload_refs",
        sa.Column("workflow_id", sa.String(200), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
    )
    op.create_index("plait_payload_refs_digest", "plait_payload_refs", ["digest"])
    op.bulk_insert(meta, [{"key": "schema_version", "value": "1"}])


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
