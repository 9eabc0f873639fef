"""Schema version 9: a cancel asked of a workflow another engine runs (docs/scaling.md).

`cancel_asked` holds the reason given when a service was asked to cancel a workflow that
another engine of the cluster runs, or that waits to be taken over: the engine holding it
finds the mark at its next heartbeat (and one that claims it later, at its first), so a
cancel is not lost when the notification that carries it faster is.

Revision ID: v9
Revises: v8
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v9"
down_revision: str | None = "v8"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plait_workflows", sa.Column("cancel_asked", sa.String(500), nullable=True))
    op.execute("UPDATE plait_meta SET value = '9' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
