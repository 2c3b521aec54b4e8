"""Qualify a memory's provenance with the conversation's owner: who the source session belongs to.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

A memory derived from a conversation names the session (``source_session_id``)
and the turns (``source_message_ids``) it came from. Session ids are chosen by
the application and repeat across users (two users' sessions both named
``s1``), and a PROJECT, TENANT or GLOBAL memory stores no user, so erasing one
user's session also took other users' memories derived from their own ``s1``,
and a GLOBAL memory (tenant '') could not be traced to its tenant at all.

Two columns say whose conversation it was: ``source_tenant_id`` and
``source_user_id``, set on insert from the writer's identity by the
``memories_provenance`` trigger (sql/functions/guards.sql) whenever the row
names a source, and NULL otherwise. Rows stored before this revision get them
from the turns they name when those still exist, else from the row's own
owner fields (for a PROJECT row, its author). The backfill reads only rows
that name a source.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("alter table harbor.memories add column source_tenant_id text")
    op.execute("alter table harbor.memories add column source_user_id text")
    # the tables force row-level security on their owner too: lift it for the backfill
    op.execute("alter table harbor.memories no force row level security")
    op.execute("alter table harbor.messages no force row level security")
    # a backfill is not an edit: the add-only trigger would stamp updated_at
    op.execute("alter table harbor.memories disable trigger user")
    op.execute(
        """
        update harbor.memories m
           set (source_tenant_id, source_user_id) = (
               select coalesce(src.tenant_id, nullif(m.tenant_id, '')),
                      coalesce(src.user_id, nullif(m.user_id, ''), nullif(m.principal_id, ''))
                 from (select 1) one
                 left join lateral (
                      select x.tenant_id, x.user_id
                        from harbor.messages x
                       where (m.tenant_id = '' or x.tenant_id = m.tenant_id)
                         and x.id = any (array(select s::bigint
                                                 from unnest(m.source_message_ids) s
                                                where s ~ '^[0-9]{1,18}$'))
                       order by x.id
                       limit 1) src on true)
         where m.source_session_id is not null or m.source_message_ids <> '{}'
        """
    )
    op.execute("alter table harbor.memories enable trigger user")
    op.execute("alter table harbor.messages force row level security")
    op.execute("alter table harbor.memories force row level security")


def downgrade() -> None:
    # the policy that reads the column: back to its form before this revision
    op.execute("drop policy if exists memories_admin_delete on harbor.memories")
    op.execute(
        "create policy memories_admin_delete on harbor.memories for delete to harbor_admin"
        " using (tenant_id = (select harbor.caller_tenant()))"
    )
    op.execute("drop trigger if exists memories_provenance on harbor.memories")
    op.execute("drop function if exists harbor._memories_provenance()")
    op.execute("alter table harbor.memories drop column source_user_id")
    op.execute("alter table harbor.memories drop column source_tenant_id")
