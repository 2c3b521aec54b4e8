"""Each memory stores the dedup key its context would have: recall's neighbour links.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

``harbor.recall()`` links a candidate to the candidate before it when the
candidate's context (the text before it, a conversation's previous turn),
hashed as content of its scope (``records.content_hash``: scope ':' the text
with whitespace runs collapsed, trimmed, lower case, sha256 in hex), is the
other's ``content_hash`` (the neighbour signal). Hashing every
candidate's context at query time was most of that signal's cost (about 1.5
of a LoCoMo call's 19 ms of server CPU, benchmarks/RESULTS.md locomo-ab).

This revision adds ``memories.context_hash`` (null without a context). The
``memories_context_hash`` trigger (sql/functions/recall.sql, applied after
the revisions) sets it on every insert, and on an update of the scope, the
context or the column itself, from the row's own scope and context: what a
writer puts there is replaced. Backfill: the rows with a context, in one
update with the add-only trigger off (the key is derived, not an edit, and
``updated_at`` must not move).
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _add_only_trigger(action: str) -> None:
    # (the re-runnable SQL creates it after the revisions: a fresh install has none yet)
    op.execute(
        "do $t$ begin if exists (select 1 from pg_catalog.pg_trigger"
        " where tgrelid = 'harbor.memories'::regclass and tgname = 'memories_add_only') then"
        f" alter table harbor.memories {action} trigger memories_add_only; end if; end $t$"
    )


def upgrade() -> None:
    op.execute("alter table harbor.memories add column context_hash text")
    # the table forces row-level security on its owner too: lifted for the backfill
    op.execute("alter table harbor.memories no force row level security")
    _add_only_trigger("disable")
    op.execute(
        r"""
update harbor.memories
   set context_hash = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
           scope::text || ':' || pg_catalog.lower(pg_catalog.btrim(
               pg_catalog.regexp_replace(context, '\s+', ' ', 'g'))), 'UTF8')), 'hex')
 where context is not null
"""
    )
    _add_only_trigger("enable")
    op.execute("alter table harbor.memories force row level security")


def downgrade() -> None:
    op.execute("drop trigger if exists memories_context_hash on harbor.memories")
    op.execute("alter table harbor.memories drop column context_hash")
