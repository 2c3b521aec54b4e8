"""Rolling summary ids derived from the whole owner key, not from the session id.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01

A session's rolling summary was stored under the id ``summary:<session_id>``
(memory ids are unique per tenant), falling back to
``summary:<session_id>:<digest of tenant and user>`` when another user's row
held that id. So the id named the session, and another user of the tenant who
knew (or guessed) a session id could take both ids first and keep that
session from ever getting a summary; the unique violation also told them the
id was in use.

From this revision the database derives a summary's id from the row's own
owner fields: ``harbor.summary_id(tenant, project, user, session, run)``,
``summary:`` and 32 hex digits of a sha256 over the length-prefixed fields
(sql/functions/guards.sql, which also holds the ``memories_summary_id``
trigger: a SESSION/SUMMARY row gets that id whatever the writer asked for,
and no other row may take an id starting with ``summary:``). The write
policies keep a caller to its own owner fields, so no one can hold another
owner's summary id.

This revision rewrites the ids of the summaries stored before it, with the
same derivation (spelled out below: this file is frozen, the function may
change). A summary is never a recall candidate, so a vector stored for one
is deleted rather than re-keyed; if an owner has more than one summary row,
the newest is kept and the others (stale folds of the same session) are
deleted. A summary named as another memory's successor (harbor-pg never
writes one) stops the upgrade with an error naming the count.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_DERIVED = """
'summary:' || left(encode(sha256(convert_to(
    length(m.tenant_id) || ':' || m.tenant_id || ';' ||
    length(m.project_id) || ':' || m.project_id || ';' ||
    length(m.user_id) || ':' || m.user_id || ';' ||
    length(m.session_id) || ':' || m.session_id || ';' ||
    length(m.run_id) || ':' || m.run_id, 'UTF8')), 'hex'), 32)
"""


def _lift() -> None:
    # the tables force row-level security on their owner too: lift it for the backfill
    op.execute("alter table harbor.memories no force row level security")
    op.execute("alter table harbor.memory_embeddings no force row level security")
    # a backfill is not an edit: the add-only trigger would stamp updated_at
    op.execute("alter table harbor.memories disable trigger user")


def _restore() -> None:
    op.execute("alter table harbor.memories enable trigger user")
    op.execute("alter table harbor.memory_embeddings force row level security")
    op.execute("alter table harbor.memories force row level security")


def upgrade() -> None:
    _lift()
    op.execute(
        """
do $$
declare
    n bigint;
begin
    select count(*) into n
      from harbor.memories p
      join harbor.memories s on s.tenant_id = p.tenant_id and s.id = p.superseded_by
     where s.scope = 'session' and s.memory_type = 'summary';
    if n > 0 then
        raise exception 'revision 0016: % memories name a session summary as their successor; '
                        'clear superseded_by on them first', n;
    end if;
end
$$
"""
    )
    op.execute(
        """
create temporary table summary_ids on commit drop as
select m.tenant_id, m.id as old_id,
       row_number() over (partition by m.tenant_id, m.project_id, m.user_id, m.session_id,
                                       m.run_id
                          order by m.updated_at desc, m.id) as rank,
       """
        + _DERIVED
        + """ as new_id
  from harbor.memories m
 where m.scope = 'session' and m.memory_type = 'summary'
"""
    )
    op.execute(
        """
delete from harbor.memory_embeddings e
 using summary_ids x
 where e.tenant_id = x.tenant_id and e.memory_id = x.old_id
"""
    )
    op.execute(
        """
delete from harbor.memories m
 using summary_ids x
 where m.tenant_id = x.tenant_id and m.id = x.old_id and x.rank > 1
"""
    )
    # in two steps: a new id may equal another row's old one only if that row is a summary
    # (the prefix is theirs alone), so park every id on a unique placeholder first
    op.execute(
        """
update harbor.memories m set id = 'summary-0016:' || x.old_id
  from summary_ids x
 where m.tenant_id = x.tenant_id and m.id = x.old_id and x.rank = 1 and x.old_id <> x.new_id
"""
    )
    op.execute(
        """
update harbor.memories m set id = x.new_id
  from summary_ids x
 where m.tenant_id = x.tenant_id and m.id = 'summary-0016:' || x.old_id and x.rank = 1
"""
    )
    _restore()


def downgrade() -> None:
    # back to summary:<session_id>, and the per-user variant for the second and later
    # users of one session id in a tenant (what the code before this revision read)
    _lift()
    op.execute("drop trigger if exists memories_summary_id on harbor.memories")
    op.execute("drop function if exists harbor._memories_summary_id()")
    op.execute("drop function if exists harbor.summary_id(text, text, text, text, text)")
    op.execute(
        """
delete from harbor.memory_embeddings e
 using harbor.memories m
 where e.tenant_id = m.tenant_id and e.memory_id = m.id
   and m.scope = 'session' and m.memory_type = 'summary'
"""
    )
    op.execute(
        """
with ranked as (
    select m.tenant_id, m.id,
           row_number() over (partition by m.tenant_id, m.session_id
                              order by m.created_at, m.id) as rank,
           'summary:' || m.session_id as base,
           left(encode(sha256(convert_to(m.tenant_id, 'UTF8') || '\\x00'::bytea
                              || convert_to(m.user_id, 'UTF8')), 'hex'), 16) as digest
      from harbor.memories m
     where m.scope = 'session' and m.memory_type = 'summary')
update harbor.memories m
   set id = case when r.rank = 1 then r.base else r.base || ':' || r.digest end
  from ranked r
 where m.tenant_id = r.tenant_id and m.id = r.id
"""
    )
    _restore()
