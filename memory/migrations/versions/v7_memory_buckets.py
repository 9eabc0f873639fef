"""Schema version 7: memory search on PostgreSQL finds the newest matches without reading all.

A GIN index cannot hand back the newest rows that match first: PostgreSQL reads every match
(and its row, to recheck it) before it can sort them, so a word found in most of a scope's
100,000 rows cost a search 100 ms. Each indexed row now also carries one token per id range
at four sizes (4,096, 32,768, 262,144 and 2,097,152 ids), each joined to its scope: a search
asks for its words in one range of its scope at a time, newest range first, and stops once it
has its window of matches (memory/_memory_search.py). Each such condition is a single
required token, which GIN's fast scan uses to skip through long posting lists.

The range tokens replace v4's scope token (a scope's rows are those of all its ranges). SQLite
is unchanged: FTS5 hands back the newest matches first by itself.

Revision ID: v7
Revises: v6
"""

from __future__ import annotations

from alembic import op

revision = "v7"
down_revision: str | None = "v6"
branch_labels = None
depends_on = None

_HEX = "encode(convert_to({}, 'UTF8'), 'hex')"
_SCOPE = (
    f"chr(57344) || 's' || {_HEX.format('NEW.tenant')} || 'x' || "
    f"{_HEX.format('NEW.workflow')} || 'x' || {_HEX.format('NEW.agent')}"
)
# Range token: the scope token's text, then "b", the level (0 to 3), "n", the range's number
# (the id shifted right by 12 + 3 * level bits) and "0": see `range_suffix` in
# memory/_memory_search.py, which must spell it the same way.
_RANGES = ", ".join(
    f"scope || 'b{level}n' || (NEW.id >> {12 + 3 * level})::text || '0'" for level in range(4)
)
_FUNCTION = (
    "CREATE OR REPLACE FUNCTION plait_memory_tsv() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "DECLARE scope text; BEGIN "
    f"scope := {_SCOPE}; "
    "NEW.tsv := CASE WHEN NEW.latest AND NOT NEW.forgotten THEN "
    "setweight(to_tsvector('english', plait_memory_words(coalesce(NEW.title, ''))), 'A') || "
    "setweight(to_tsvector('english', plait_memory_words(NEW.text)), 'B') || "
    "setweight(to_tsvector('english', plait_memory_words(NEW.tags)), 'C') || "
    f"array_to_tsvector(ARRAY[chr(57344) || 'k' || NEW.kind || '0', {_RANGES}]) END; "
    "RETURN NEW; END $$"
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)
        # Index what is stored the new way (the trigger fires on an update of `latest`).
        op.execute("UPDATE plait_memory SET latest = latest WHERE tsv IS NOT NULL")
    op.execute("UPDATE plait_meta SET value = '7' WHERE key = 'schema_version'")


def downgrade() -> None:
    raise NotImplementedError("plait never migrates a store backwards")
