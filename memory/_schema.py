"""The store's tables as SQLAlchemy Core objects, at the newest schema version.

Migrations (`migrations/versions/`) build the same tables step by step; a test compares
them. `SCHEMA_VERSION` is the version this plait writes and the highest it can open.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TSVECTOR

SCHEMA_VERSION = 9
"""1: workflows, events, payloads and their references. 2: call results; tenant and labels.
3: a finished workflow's `compacted` mark (its log keeps only what rebuilds it).
4: agent memory. 5: peer messages. 6: the blackboard. 7: memory search by id ranges on
PostgreSQL (its index only). 8: several engines on one store: a workflow's owner and lease,
each engine's share of a backend's shared in-flight limit. 9: a cancel asked of a workflow
another engine holds."""

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
    # The engine running it and until when its lease holds (the database's clock), with
    # several engines on the store (v8); NULL: no engine has leased it.
    sa.Column("owner", sa.String(200), nullable=True),
    sa.Column("lease_until", sa.Double, nullable=True),
    # Why a cancel was asked of it while another engine held it, or none did (v9): the
    # holder cancels it at its next heartbeat.
    sa.Column("cancel_asked", sa.String(500), nullable=True),
    sa.Index("plait_workflows_status", "status", "created"),
    sa.Index("plait_workflows_owner", "owner"),
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

# Each engine's share of a backend's in-flight limit when several engines share it (v8):
# `held` slots it may fill, what it wants for urgent and other calls, and until when the row
# counts (an engine that stops renewing it gives its slots back by expiry).
slots = sa.Table(
    "plait_slots",
    metadata,
    sa.Column("backend", sa.String(200), primary_key=True),
    sa.Column("engine", sa.String(200), primary_key=True),
    sa.Column("held", sa.Integer, nullable=False),
    sa.Column("want_urgent", sa.Integer, nullable=False),
    sa.Column("want_batch", sa.Integer, nullable=False),
    sa.Column("lease_until", sa.Double, nullable=False),
)

# Idempotency keys of REST submissions, one row per (tenant, key) (v8): whichever engine
# a request reaches, the first to insert the key starts the workflow and names it here.
keys = sa.Table(
    "plait_keys",
    metadata,
    sa.Column("tenant", sa.String(200), primary_key=True),
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("workflow_id", sa.String(200), nullable=True),
    sa.Column("created", sa.Double, nullable=False),
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
# Facts (one row per version) and notes in one table, so one full-text index ranks both.
# Scope columns hold "" for "none" (not NULL), so the unique index sees two writes to the same
# shared key as the same key. The full-text index itself is dialect-specific and lives in the
# migration only: on SQLite an FTS5 table (`plait_memory_fts`, filled by triggers), on
# PostgreSQL the `tsv` column below (filled by a trigger, GIN-indexed); `tsv` is plain text
# left NULL on SQLite. Only a fact's latest, live version is in either index.

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: the rowid itself

memory = sa.Table(
    "plait_memory",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(8), nullable=False),  # "fact" or "note"
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("workflow", sa.String(200), nullable=False),
    sa.Column("agent", sa.String(200), nullable=False),
    sa.Column("namespace", sa.String(200), nullable=True),  # facts only
    sa.Column("key", sa.String(500), nullable=True),  # facts only
    sa.Column("version", sa.Integer, nullable=True),  # facts only: 1, 2, ... per key
    sa.Column("title", sa.Text, nullable=True),  # notes only
    sa.Column("text", sa.Text, nullable=False),  # what search reads
    sa.Column("value", sa.Text, nullable=True),  # a fact's JSON, as written
    sa.Column("tags", sa.Text, nullable=False),  # a JSON list of strings
    sa.Column("source", sa.String(500), nullable=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("forgotten", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("latest", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("embedding", sa.Text, nullable=True),  # a JSON list of floats
    sa.Column("tsv", sa.Text().with_variant(TSVECTOR(), "postgresql"), nullable=True),
    sa.Index(
        "plait_memory_fact",
        "tenant",
        "workflow",
        "agent",
        "namespace",
        "key",
        "version",
        unique=True,
    ),
    sa.Index("plait_memory_at", "kind", "at"),
)

memory_turns = sa.Table(
    "plait_memory_turns",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("workflow", sa.String(200), nullable=False),
    sa.Column("agent", sa.String(200), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", sa.String(32), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Index("plait_memory_turns_seq", "tenant", "workflow", "agent", "seq", unique=True),
    sa.Index("plait_memory_turns_at", "at"),
)

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
# Posts on the board; a post's live claim is the claims row of its current attempt. Times
# are epoch seconds from the boards' clocks.
board_posts = sa.Table(
    "plait_board_posts",
    metadata,
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
    sa.Index("plait_board_posts_state", "state", "posted_at"),
)

board_claims = sa.Table(
    "plait_board_claims",
    metadata,
    sa.Column("post_id", sa.String(200), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("holder", sa.String(200), nullable=False),
    sa.Column("bid", sa.Double, nullable=False),
    sa.Column("lease_until", sa.Double, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Index("plait_board_claims_live", "state", "lease_until"),
)

# The board's log: every post, award, release, answer and failure, in commit order.
board_events = sa.Table(
    "plait_board_events",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("post_id", sa.String(200), nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
)
