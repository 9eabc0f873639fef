"""Schema version 8: several engines on one store (docs/scaling.md).

A workflow row names the engine that runs it (`owner`) and until when its lease holds
(`lease_until`, epoch seconds on the database's clock): an engine renews the leases of its
runs by heartbeat, and another claims the unfinished runs whose lease ran out. The slots
table holds each engine's share of a backend's in-flight limit shared by all engines, with
what each wants, urgent and not. The keys table holds each tenant's idempotency keys, so
that a retry sent to another engine finds the workflow the first request made.

Revision ID: v8
Revises: v7
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v8"
down_revision: str | None = "v7"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plait_workflows", sa.Column("owner", sa.String(200), nullable=True))
    op.add_column("plait_workflows", sa.Column("lease_until", sa.Double, nullable=True))
    op.create_index("plait_workflows_owner", "plait_workflows", ["owner"])
    op.create_table(
        "plait_slots",
        sa.Column("backend", sa.String(200), primary_key=True),
        sa.Column("engine", sa.String(200), primary_key=True),
        sa.Column("held", sa.Integer, nullable=False),
        sa.Column("want_urgent", sa.Integer, nullable=False),
        sa.Column("want_batch", sa.Integer, nullable=False),
        sa.Column("lease_until", sa.Double, nullable=False),
    )
    op.create_table(
        "plait_keys",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("workflow_id", sa.String(200), nullable=True),
        sa.Column("created", sa.Double, nullable=False),
    )
    op.execute("UPDATE plait_meta SET value = '8' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
