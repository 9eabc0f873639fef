"""Schema version 6: the blackboard: posts, bids, claims with leases, answers.

Revision ID: v6
Revises: v5
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v6"
down_revision: str | None = "v5"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plait_board_posts",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("poster", sa.String(200), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("capabilities", sa.Text, nullable=False),
        sa.Column("posted_at", sa.Double, nullable=False),
        sa.Column("deadline", sa.Double, nullable=True),
        sa.Column("workflow", sa.String(200), nullable=True),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("answered_by", sa.String(200), nullable=True),
    )
    op.create_index("plait_board_posts_state", "plait_board_posts", ["state", "posted_at"])
    op.create_table(
        "plait_board_claims",
        sa.Column("post_id", sa.String(200), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("bid", sa.Double, nullable=False),
        sa.Column("lease_until", sa.Double, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
    )
    op.create_index("plait_board_claims_live", "plait_board_claims", ["state", "lease_until"])
    op.create_table(
        "plait_board_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("post_id", sa.String(200), nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.execute("UPDATE plait_meta SET value = '6' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
