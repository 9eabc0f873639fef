"""Schema version 5: peer messages: mailboxes and topics, delivered at least once.

Revision ID: v5
Revises: v4
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "v5"
down_revision: str | None = "v4"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plait_mail",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("agent", sa.String(200), nullable=False),
        sa.Column("sender_workflow", sa.String(200), nullable=False),
        sa.Column("sender_agent", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("topic", sa.String(200), nullable=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("sent_at", sa.Double, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("leased_until", sa.Double, nullable=True),
        # Ids are never reused: a late ack must not delete a newer message.
        sqlite_autoincrement=True,
    )
    op.create_index("plait_mail_box", "plait_mail", ["tenant", "workflow", "agent", "id"])
    op.create_index(
        "plait_mail_stream",
        "plait_mail",
        ["tenant", "workflow", "agent", "sender_workflow", "sender_agent", "seq"],
        unique=True,
    )
    op.create_table(
        "plait_mail_senders",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("workflow", sa.String(200), primary_key=True),
        sa.Column("agent", sa.String(200), primary_key=True),
        sa.Column("last_seq", sa.Integer, nullable=False),
    )
    op.create_table(
        "plait_mail_topics",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("scope", sa.String(200), primary_key=True),
        sa.Column("topic", sa.String(200), primary_key=True),
        sa.Column("workflow", sa.String(200), primary_key=True),
        sa.Column("agent", sa.String(200), primary_key=True),
    )
    op.execute("UPDATE plait_meta SET value = '5' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
