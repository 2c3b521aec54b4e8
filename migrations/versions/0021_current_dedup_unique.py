"""Dedup of current memories by a partial unique B-tree instead of a GiST exclusion.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

The rule the database keeps is that two currently valid memories with the same
owner key and content hash cannot coexist. The exclusion constraint
``memories_no_duplicate_valid`` kept it with a GiST index over the tenant, the
scope, ``harbor.memory_dedup_key(...)`` (owner fields and hash as one text) and
the validity range: btree_gist keys on text cluster badly, so a probe for a
conflict visited about 58 of its 6,000 pages at 100,000 memories, and the
index cost a write 361 us of the 868 us each memory of a 256-memory batch took
(benchmarks/RESULTS.md, ingest).

Two current rows both have an open validity interval, and two open intervals
always overlap, so over current rows the exclusion is a unique key: this
revision builds ``memories_no_duplicate_current``, unique on the owner fields
and ``content_hash`` over the rows whose interval is open, and drops the
constraint and the key function it used. Supersession closes the old row's
interval in the transaction that inserts its successor, which takes the old
row out of the index. Writers that insert the same current row at once still
wait for each other and one of them conflicts (``ON CONFLICT DO NOTHING``
arbitrates on any unique index). What the exclusion also refused and this does
not: a row whose interval overlaps a *closed* interval of the same content (an
import of history, a ``valid_from`` in the past): a closed row is history and
is no longer a duplicate of anything current.

The scope comes last in the key: the owner fields already determine it
(``memories_scope_key``), and under a caller's row-level security its
equality (an enum ``=``, not leakproof) cannot be an index condition, where
the text equalities before it can.

Downgrade builds the exclusion constraint again; it fails if the store now
holds a row overlapping a closed interval of the same content.
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_KEY = """
create function harbor.memory_dedup_key(project_id text, user_id text, session_id text,
                                        run_id text, content_hash text) returns text
    language sql immutable parallel safe
return pg_catalog.length(project_id) || ':' || project_id || ';'
    || pg_catalog.length(user_id) || ':' || user_id || ';'
    || pg_catalog.length(session_id) || ':' || session_id || ';'
    || pg_catalog.length(run_id) || ':' || run_id || ';' || content_hash
"""


def upgrade() -> None:
    op.execute(
        "create unique index memories_no_duplicate_current on harbor.memories"
        " (tenant_id, user_id, project_id, session_id, run_id, content_hash, scope)"
        " where upper_inf(valid)"
    )
    op.execute("alter table harbor.memories drop constraint memories_no_duplicate_valid")
    op.execute("drop function harbor.memory_dedup_key(text, text, text, text, text)")


def downgrade() -> None:
    op.execute(_KEY)
    op.execute(
        "alter table harbor.memories add constraint memories_no_duplicate_valid"
        " exclude using gist (tenant_id with =, scope with =,"
        " (harbor.memory_dedup_key(project_id, user_id, session_id, run_id, content_hash)) with =,"
        " valid with &&)"
    )
    op.execute("drop index harbor.memories_no_duplicate_current")
