"""Recall hits: ``harbor.memory_hits``, how often and when last recall returned a memory.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06

A memory's importance may decay with the time since recall last returned it, on
a half-life the recall policy sets (``importance_half_life_hours``; off by
default). That needs the time of the last hit, and memories are add-only, so
the hits live in a table of their own, written after a recall returns
(``harbor.record_hits()``), never inside ``harbor.recall()``'s statement. The
owner columns are the memory's, kept equal by a trigger
(``memory_hits_owner``), so that the row policies compare them without a
sub-select (as Citus requires); the foreign key deletes a memory's hits with
it (erasure, retention). Distributed by ``tenant_id`` on Citus, co-located
with the memories.

Downgrade drops the table.
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
create table harbor.memory_hits (
    tenant_id        text not null,
    memory_id        text not null,
    scope            harbor.memory_scope not null,
    project_id       text not null default '',
    user_id          text not null default '',
    session_id       text not null default '',
    run_id           text not null default '',
    hits             bigint not null default 0 check (hits >= 0),
    last_recalled_at timestamptz not null default pg_catalog.now(),
    primary key (tenant_id, memory_id),
    constraint memory_hits_memory_fkey foreign key (tenant_id, memory_id)
        references harbor.memories (tenant_id, id) on delete cascade
);
alter table harbor.memory_hits enable row level security;
alter table harbor.memory_hits force row level security;
grant select, insert on harbor.memory_hits to harbor_app;
grant update (hits, last_recalled_at) on harbor.memory_hits to harbor_app;
grant select, delete on harbor.memory_hits to harbor_admin;
grant select on harbor.memory_hits to harbor_search;
"""
    )


def downgrade() -> None:
    op.execute("drop table harbor.memory_hits")
