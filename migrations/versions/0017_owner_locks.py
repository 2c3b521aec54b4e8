"""Serialisation locks that only their owner can take: harbor.owner_locks.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

Appending a turn took ``pg_advisory_xact_lock(1751216738, hashtext(tenant,
user, session))`` so that within a session ids are in commit order, and a
working-state write took an advisory lock keyed by its run. An advisory key
can be taken by any login, even one with no grants (pg_locks shows every held
key), so anyone who knew or guessed another user's session or run could hold
its key and stop that user's appends or working-state writes.

From this revision those locks are row locks on ``harbor.owner_locks``: one
row per session (scope 'session') and per run (scope 'run'), created by the
first append or write and locked by each one after, with ``INSERT ... ON
CONFLICT DO UPDATE ... WHERE false`` (the conflicting row is locked even when
its WHERE turns the update down, so nothing is written after the first time).
Row-level security (sql/policies/locks.sql) lets harbor_app propose only a row
of its own identity, so a caller can lock only its own session's or run's row;
a login with no grants cannot touch the table. The application role has
INSERT, SELECT and UPDATE of one column only: with no table-level UPDATE,
DELETE or TRUNCATE, ``LOCK TABLE`` allows it nothing stronger than ROW
EXCLUSIVE, which no statement of harbor-pg waits for.

Also: harbor_app's INSERT on messages and working_state becomes column-level,
every column but the identity ``id``. With table-level INSERT a caller could
write ``OVERRIDING SYSTEM VALUE`` with an id the sequence had not reached and
keep its transaction open: whoever later drew that id (any user of the
tenant) waited on it, then failed with a unique violation.

The table is distributed by tenant_id and co-located with memories on Citus
(harbor_pg.db.citus.CO_LOCATED); erasure deletes the rows of the erased
owner (harbor.erase).
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_MESSAGE_COLUMNS = (
    "tenant_id, user_id, session_id, project_id, principal_id, role, content, name,"
    " tool_calls, tool_call_id, metadata, token_estimate, created_at"
)
_WORKING_COLUMNS = (
    "tenant_id, project_id, user_id, session_id, run_id, principal_id, state, expires_at,"
    " updated_at"
)

_UP = f"""
create table harbor.owner_locks (
    tenant_id  text not null check (tenant_id <> ''),
    user_id    text not null check (user_id <> ''),
    session_id text not null check (session_id <> ''),
    scope      harbor.memory_scope not null check (scope in ('session', 'run')),
    project_id text not null default '',
    run_id     text not null default '',
    check (scope = 'run' or (project_id = '' and run_id = '')),
    primary key (tenant_id, user_id, session_id, scope, project_id, run_id)
);
alter table harbor.owner_locks enable row level security;
alter table harbor.owner_locks force row level security;
grant select, insert on harbor.owner_locks to harbor_app;
grant update (scope) on harbor.owner_locks to harbor_app;
grant select, delete on harbor.owner_locks to harbor_admin;

revoke insert on harbor.messages from harbor_app;
grant insert ({_MESSAGE_COLUMNS}) on harbor.messages to harbor_app;
revoke insert on harbor.working_state from harbor_app;
grant insert ({_WORKING_COLUMNS}) on harbor.working_state to harbor_app;
"""

_DOWN = """
revoke insert on harbor.working_state from harbor_app;
grant insert on harbor.working_state to harbor_app;
revoke insert on harbor.messages from harbor_app;
grant insert on harbor.messages to harbor_app;
drop table harbor.owner_locks;
"""


def upgrade() -> None:
    op.execute(_UP)


def downgrade() -> None:
    op.execute(_DOWN)
