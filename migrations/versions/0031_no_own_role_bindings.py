"""Refuse to upgrade a database that binds one of harbor-pg's own roles.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07

From this revision the identity functions (sql/functions/identity.sql) look no
binding up for a caller whose login, current user and role set are all harbor-pg's
own roles (harbor_owner, harbor_app, harbor_admin, harbor_search): no binding may
name them, and the lookup was about half of each identity call, of which a save
makes five to seven. harbor._role_binding_one_tenant has refused such bindings for
every writer since before this revision, but a database bound under an earlier
version may still hold one, and with the lookup skipped that binding would stop
confining the role. So the upgrade stops there, before anything changes, and says
which role to unbind (``harbor.unbind_role``, or a DELETE by the table's owner).
The owner reads every binding with the table's row security lifted for the read
(as 0010 did for the vectors), in the revision's transaction.

Downgrade changes nothing.
"""

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("alter table harbor.role_bindings no force row level security")
    op.execute(
        """
do $$
declare
    v_roles text;
begin
    select pg_catalog.string_agg(distinct b.role_name::text, ', ' order by b.role_name::text)
      into v_roles
      from harbor.role_bindings b
     where b.role_name in ('harbor_owner', 'harbor_app', 'harbor_admin', 'harbor_search');
    if v_roles is not null then
        raise exception 'harbor-pg: role_bindings binds harbor-pg''s own role(s) %', v_roles
            using errcode = '55000',
                  hint = 'harbor-pg''s own roles are never bound (a binding of them is '
                         'refused since harbor.bind_role checks the name); remove the '
                         'binding (harbor.unbind_role as its tenant''s administrator, or a '
                         'DELETE from harbor.role_bindings by its owner) and upgrade again.';
    end if;
end
$$;
"""
    )
    op.execute("alter table harbor.role_bindings force row level security")


def downgrade() -> None:
    pass
