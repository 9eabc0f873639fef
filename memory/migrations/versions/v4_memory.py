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

# unicode61 splits as the Python tokeniser in memory/_memory_query.py does; porter stems
# English as PostgreSQL's 'english' configuration does.
# The scope columns are copied in (unindexed) so a search filters and ranks inside FTS5, which
# then sorts rowids by rank alone, with no join until the few rows that are returned.
_SQLITE = (
    "CREATE VIRTUAL TABLE plait_memory_fts USING fts5("
    "title, text, tags, kind UNINDEXED, tenant UNINDEXED, workflow UNINDEXED, "
    "agent UNINDEXED, tokenize = 'porter unicode61 remove_diacritics 2')",
    # `rank` is BM25 with a title weighing four times the text and the tags.
    "INSERT INTO plait_memory_fts (plait_memory_fts, rank) VALUES ('rank', 'bm25(4.0, 1.0, 1.0)')",
    "CREATE TRIGGER plait_memory_fts_insert AFTER INSERT ON plait_memory "
    "WHEN new.latest AND NOT new.forgotten BEGIN "
    "INSERT INTO plait_memory_fts (rowid, title, text, tags, kind, tenant, workflow, agent) "
    "VALUES (new.id, coalesce(new.title, ''), new.text, new.tags, new.kind, new.tenant, "
    "new.workflow, new.agent); END",
    "CREATE TRIGGER plait_memory_fts_supersede AFTER UPDATE OF latest ON plait_memory "
    "WHEN old.latest AND NOT new.latest BEGIN "
    "DELETE FROM plait_memory_fts WHERE rowid = old.id; END",
    "CREATE TRIGGER plait_memory_fts_delete AFTER DELETE ON plait_memory BEGIN "
    "DELETE FROM plait_memory_fts WHERE rowid = old.id; END",
)
_POSTGRES = (
    # Words only, as the query side splits them: PostgreSQL's parser would otherwise keep
    # "Asia/Tokyo" or "a.b@c.d" whole, and a search for "tokyo" would miss it.
    "CREATE FUNCTION plait_memory_words(text) RETURNS text LANGUAGE sql IMMUTABLE AS "
    "$$ SELECT regexp_replace($1, '[^[:alnum:]]+', ' ', 'g') $$",
    "CREATE FUNCTION plait_memory_tsv() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "NEW.tsv := CASE WHEN NEW.latest AND NOT NEW.forgotten THEN "
    "setweight(to_tsvector('english', plait_memory_words(coalesce(NEW.title, ''))), 'A') || "
    "setweight(to_tsvector('english', plait_memory_words(NEW.text)), 'B') || "
    "setweight(to_tsvector('english', plait_memory_words(NEW.tags)), 'C') END; "
    "RETURN NEW; END $$",
    "CREATE TRIGGER plait_memory_tsv BEFORE INSERT OR UPDATE OF latest ON plait_memory "
    "FOR EACH ROW EXECUTE FUNCTION plait_memory_tsv()",
    "CREATE INDEX plait_memory_search ON plait_memory USING GIN (tsv)",
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
