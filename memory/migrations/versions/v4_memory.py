"""Schema version 4: agent memory: conversations, versioned facts, notes, full-text search.

The tables are dialect-neutral; the full-text index is not: on SQLite an FTS5 table kept by
triggers, on PostgreSQL a tsvector column kept by a trigger and a GIN index. Both hold only a
fact's latest, live version and every note, so search never sees what was superseded.

Revision ID: v4
Revises: v3
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import TSVECTOR

revision = "v4"
down_revision: str | None = "v3"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# unicode61 splits as the Python tokeniser in memory/_memory_types.py does; porter stems
# English as PostgreSQL's 'english' configuration does.
# `scope` holds two tokens per row, a kind token and a scope token (see
# memory/_memory_search.py, `scope_tokens`), so FTS5 itself keeps a search inside its scope:
# no row's columns are read to filter it. Both tokens start with U+E000, a private-use
# character that unicode61 keeps in a token but that no query word can hold, and end in "0",
# which no Porter rule strips; the scope token is the hex of tenant, workflow and agent,
# joined by "x", so two scopes never share a token.
_TOKENS = (
    "char(57344) || 'k' || {r}.kind || '0 ' || char(57344) || 's' || lower(hex({r}.tenant)) || "
    "'x' || lower(hex({r}.workflow)) || 'x' || lower(hex({r}.agent)) || '0'"
)
_SQLITE = (
    "CREATE VIRTUAL TABLE plait_memory_fts USING fts5("
    "title, text, tags, scope, tokenize = 'porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER plait_memory_fts_insert AFTER INSERT ON plait_memory "
    "WHEN new.latest AND NOT new.forgotten BEGIN "
    "INSERT INTO plait_memory_fts (rowid, title, text, tags, scope) "
    f"VALUES (new.id, coalesce(new.title, ''), new.text, new.tags, {_TOKENS.format(r='new')}); "
    "END",
    "CREATE TRIGGER plait_memory_fts_supersede AFTER UPDATE OF latest ON plait_memory "
    "WHEN old.latest AND NOT new.latest BEGIN "
    "DELETE FROM plait_memory_fts WHERE rowid = old.id; END",
    "CREATE TRIGGER plait_memory_fts_delete AFTER DELETE ON plait_memory BEGIN "
    "DELETE FROM plait_memory_fts WHERE rowid = old.id; END",
)
_HEX = "encode(convert_to({}, 'UTF8'), 'hex')"
_POSTGRES = (
    # Words only, as the query side splits them: PostgreSQL's parser would otherwise keep
    # "Asia/Tokyo" or "a.b@c.d" whole, and a search for "tokyo" would miss it.
    "CREATE FUNCTION plait_memory_words(text) RETURNS text LANGUAGE sql IMMUTABLE AS "
    "$$ SELECT regexp_replace($1, '[^[:alnum:]]+', ' ', 'g') $$",
    # The kind and scope tokens as on SQLite, as lexemes without positions (weight D): the
    # GIN index then filters by scope and kind itself; the user's words never match them
    # (plait_memory_words keeps no private-use character) and ranking never asks for them.
    "CREATE FUNCTION plait_memory_tsv() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "NEW.tsv := CASE WHEN NEW.latest AND NOT NEW.forgotten THEN "
    "setweight(to_tsvector('english', plait_memory_words(coalesce(NEW.title, ''))), 'A') || "
    "setweight(to_tsvector('english', plait_memory_words(NEW.text)), 'B') || "
    "setweight(to_tsvector('english', plait_memory_words(NEW.tags)), 'C') || "
    "array_to_tsvector(ARRAY[chr(57344) || 'k' || NEW.kind || '0', chr(57344) || 's' || "
    f"{_HEX.format('NEW.tenant')} || 'x' || {_HEX.format('NEW.workflow')} || 'x' || "
    f"{_HEX.format('NEW.agent')} || '0']) END; "
    "RETURN NEW; END $$",
    "CREATE TRIGGER plait_memory_tsv BEFORE INSERT OR UPDATE OF latest ON plait_memory "
    "FOR EACH ROW EXECUTE FUNCTION plait_memory_tsv()",
    # No pending list: a search reads only the index's trees, never a long unsorted list
    # of recent inserts (writes pay instead, once per row).
    "CREATE INDEX plait_memory_search ON plait_memory USING GIN (tsv) WITH (fastupdate = off)",
)


def upgrade() -> None:
    op.create_table(
        "plait_memory",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("agent", sa.String(200), nullable=False),
        sa.Column("namespace", sa.String(200), nullable=True),
        sa.Column("key", sa.String(500), nullable=True),
        sa.Column("version", sa.Integer, nullable=True),
        sa.Column("title", sa.Text, nullable=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("value", sa.Text, nullable=True),
        sa.Column("tags", sa.Text, nullable=False),
        sa.Column("source", sa.String(500), nullable=True),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("forgotten", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("latest", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("embedding", sa.Text, nullable=True),
        sa.Column("tsv", sa.Text().with_variant(TSVECTOR(), "postgresql"), nullable=True),
    )
    op.create_index(
        "plait_memory_fact",
        "plait_memory",
        ["tenant", "workflow", "agent", "namespace", "key", "version"],
        unique=True,
    )
    op.create_index("plait_memory_at", "plait_memory", ["kind", "at"])
    op.create_table(
        "plait_memory_turns",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("agent", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )
    op.create_index(
        "plait_memory_turns_seq",
        "plait_memory_turns",
        ["tenant", "workflow", "agent", "seq"],
        unique=True,
    )
    op.create_index("plait_memory_turns_at", "plait_memory_turns", ["at"])
    sqlite = op.get_bind().dialect.name == "sqlite"
    for statement in _SQLITE if sqlite else _POSTGRES:
        op.execute(statement)
    op.execute("UPDATE plait_meta SET value = '4' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
