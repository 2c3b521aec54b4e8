"""Access tokens: bearer tokens that the MCP server maps to a bound identity.

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-01

``harbor-pg token create`` stores a token as the SHA-256 of its text, with the
identity it stands for (tenant, and optionally project, principal, user,
session and run) and whether it may erase. The token's text is shown once
and kept nowhere. ``harbor-pg token revoke`` sets ``revoked_at``; a revoked
or expired token authenticates nothing.

Row-level security (sql/policies/tokens.sql): the application role reads a
token's row only when it names that row's hash in the transaction setting
``harbor.token_hash``, that is only when it holds the token; the elevated
role manages its tenant's tokens. Every key starts with tenant_id (Citus).
"""

from alembic import op

revision = "0014"
down_revision = "0011"
branch_labels = None
depends_on = None

_UP = """
create table harbor.access_tokens (
    tenant_id    text not null check (tenant_id <> ''),
    id           text not null default (pg_catalog.gen_random_uuid())::text,
    token_hash   text not null check (token_hash ~ '^[0-9a-f]{64}$'),
    name         text not null default '',
    project_id   text check (project_id <> ''),
    principal_id text check (principal_id <> ''),
    user_id      text check (user_id <> ''),
    session_id   text check (session_id <> ''),
    run_id       text check (run_id <> ''),
    is_admin     boolean not null default false,
    created_at   timestamptz not null default pg_catalog.now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    primary key (tenant_id, id),
    constraint access_tokens_hash_key unique (tenant_id, token_hash)
);
create index access_tokens_hash_idx on harbor.access_tokens (token_hash);
alter table harbor.access_tokens enable row level security;
alter table harbor.access_tokens force row level security;
grant select on harbor.access_tokens to harbor_app;
grant select, insert on harbor.access_tokens to harbor_admin;
grant update (revoked_at) on harbor.access_tokens to harbor_admin;
"""


def upgrade() -> None:
    op.execute(_UP)


def downgrade() -> None:
    op.execute("drop table harbor.access_tokens")
