"""Schema version 6: the blackboard: posts, bids, claims with leases, answers.

Revision ID: v6
Revises: v5
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401  (the tables come with the feature that uses them)
from alembic import op

revision = "v6"
down_revision: str | None = "v5"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE plait_meta SET value = '6' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
