"""Memories may carry an expiry: ``memories.expires_at``.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06

A memory saved with an expiry (``expires_at``, or a time to live at save) stops
holding at that time: reads treat it as valid only before it, and
``harbor.expire_memories()`` (also run by ``harbor.apply_retention()`` and the
periodic upkeep job) closes its validity interval there, as a supersession
closes a row, so it stays as history for as-of reads and leaves the unique
index of current duplicates. The expiry is kept in a column of its own rather
than as a finite upper bound of ``valid`` written at insert: an open interval
is what "current" means to the dedup index, supersession, extraction and
consolidation, and a row closed in advance would be none of those things
while it still holds.

``memories_lexical_idx`` carries the column (the lexical leg reads an owner's
rows from that index alone, and now tests the expiry too), so it is built
again. ``memories_expiring_idx`` holds the rows with an expiry and an open
interval: the sweep's candidates, and the probe with which a save closes an
expired duplicate before inserting its content again (empty, and so one
descent, in a store that never sets an expiry).

Downgrade drops the column with its indexes (and the policies and view that name
it, which the re-runnable files then make again without it) and builds the
lexical index as it was; the intervals the sweep closed stay closed.
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_LEXICAL = (
    "create index memories_lexical_idx on harbor.memories"
    " (tenant_id, scope, user_id, project_id, session_id, run_id)"
    " include (id, fts, memory_type, importance, valid, content_hash, entity_ids{extra})"
    " where harbor.lexical_entry_fits(tenant_id, project_id, user_id, session_id, run_id, id,"
    " fts, entity_ids)"
)


def upgrade() -> None:
    op.execute("alter table harbor.memories add column expires_at timestamptz")
    op.execute("drop index harbor.memories_lexical_idx")
    op.execute(_LEXICAL.format(extra=", expires_at"))
    op.execute(
        "create index memories_expiring_idx on harbor.memories (tenant_id, expires_at)"
        " where expires_at is not null and upper_inf(valid)"
    )


def downgrade() -> None:
    # the re-runnable objects that name the column go first (the files under sql/ make
    # them again, without it, after the downgrade); dropping the column drops both
    # indexes that name it
    op.execute("drop policy if exists memories_admin_expire on harbor.memories")
    op.execute("drop policy if exists memories_admin_expire_read on harbor.memories")
    op.execute("drop view if exists harbor.current_memories")
    op.execute("alter table harbor.memories drop column expires_at")
    op.execute(_LEXICAL.format(extra=""))
