"""The store's tables as SQLAlchemy Core objects, at the newest schema version.

Migrations (`migrations/versions/`) build the same tables step by step; a test compares
them. `SCHEMA_VERSION` is the version this plait writes and the highest it can open.
"""

from __future__ import annotations

import sqlalchemy as sa

SCHEMA_VERSION = 6
"""1: workflows, events, payloads and their references. 2: call results; tenant and labels.
3: a finished workflow's `compacted` mark (its log keeps only what rebuilds it).
4: agent memory. 5: peer messages. 6: the blackboard."""

metadata = sa.MetaData()

meta = sa.Table(
    "plait_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

workflows = sa.Table(
    "plait_workflows",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("priority", sa.String(16), nullable=False),
    sa.Column("deadline", sa.Double, nullable=True),
    sa.Column("created", sa.Double, nullable=False),
    sa.Column("updated", sa.Double, nullable=False),
    sa.Column("finished", sa.Double, nullable=True),
    sa.Column("tenant", sa.String(200), nullable=True),
    sa.Column("labels", sa.JSON, nullable=True),
    # Set by compaction, never by an append (the upsert leaves it as it is).
    sa.Column("compacted", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index("plait_workflows_status", "status", "created"),
    sa.Index("plait_workflows_tenant", "tenant", "created"),
    sa.Index("plait_workflows_finished", "finished"),
)

events = sa.Table(
    "plait_events",
    metadata,
    sa.Column("workflow_id", sa.String(200), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("refs", sa.Text, nullable=True),
)

payloads = sa.Table(
    "plait_payloads",
    metadata,
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

# Which workflow refers to which payload: what garbage collection keeps, without parsing
# every event's JSON.
payload_refs = sa.Table(
    "plait_payload_refs",
    metadata,
    sa.Column("workflow_id", sa.String(200), primary_key=True),
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Index("plait_payload_refs_digest", "digest"),
)

calls = sa.Table(
    "plait_calls",
    metadata,
    sa.Column("program", sa.String(200), primary_key=True),
    sa.Column("request_hash", sa.String(128), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("workflow_id", sa.String(200), nullable=True),
    sa.Index("plait_calls_digest", "digest"),
    sa.Index("plait_calls_workflow", "workflow_id"),
)


# --- agent memory (v4) -------------------------------------------------------------------



# --- peer messages (v5) ------------------------------------------------------------------

# One row per message copy not yet acknowledged (a topic's publish keeps one per subscriber).
# `id` is never reused (AUTOINCREMENT on SQLite, a sequence on PostgreSQL): a late ack of an
# acknowledged message must not delete a newer one. A sender's messages share its tenant.
mail = sa.Table(
    "plait_mail",
    metadata,
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
    sa.Index("plait_mail_box", "tenant", "workflow", "agent", "id"),
    sa.Index(
        "plait_mail_stream",
        *("tenant", "workflow", "agent", "sender_workflow", "sender_agent", "seq"),
        unique=True,
    ),
    sqlite_autoincrement=True,
)

# Each sender's last sequence number: kept apart from its messages, which acks delete.
mail_senders = sa.Table(
    "plait_mail_senders",
    metadata,
    sa.Column("tenant", sa.String(200), primary_key=True),
    sa.Column("workflow", sa.String(200), primary_key=True),
    sa.Column("agent", sa.String(200), primary_key=True),
    sa.Column("last_seq", sa.Integer, nullable=False),
)

# Topic subscriptions; `scope` is a workflow id, or "" for a topic shared across the tenant.
mail_topics = sa.Table(
    "plait_mail_topics",
    metadata,
    sa.Column("tenant", sa.String(200), primary_key=True),
    sa.Column("scope", sa.String(200), primary_key=True),
    sa.Column("topic", sa.String(200), primary_key=True),
    sa.Column("workflow", sa.String(200), primary_key=True),
    sa.Column("agent", sa.String(200), primary_key=True),
)


# --- the blackboard (v6) -----------------------------------------------------------------
