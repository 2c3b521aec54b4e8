"""Alembic environment for harbor-pg.

Revisions hold run-once changes (frozen SQL under migrations/versions/). After
the revisions run, the re-runnable files (functions, policies, grants; see
harbor_pg.db.sqlfiles.IDEMPOTENT_FILES) are applied again whenever the schema
exists, so a fresh install (sql/schema.sql + those files) and an upgraded
database end up identical; tests/migration proves it from the catalogs.

They are applied only when a revision ran or their sha256 differs from the one
recorded in ``public.harbor_idempotent_sql``: re-creating policies takes an
exclusive lock on every table, so a start against an up-to-date schema must
not do it. The whole run holds an advisory lock (query ``migration_lock``),
so concurrent starts and upgrades run one after another.

Migrations run as the schema owner (harbor_owner): a login that is a member of
it switches with SET ROLE.
"""

from __future__ import annotations

import os
from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool, text

from harbor_pg.db import citus
from harbor_pg.db.migrate import _sqlalchemy_url
from harbor_pg.db.sqlfiles import idempotent_files, idempotent_sha256, query

config = context.config
VERSION_TABLE = config.get_main_option("version_table", "harbor_alembic_version")
VERSION_SCHEMA = config.get_main_option("version_table_schema", "public")


def _url() -> str:
    url = (
        config.attributes.get("url")
        or os.environ.get("HARBOR_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise RuntimeError("set HARBOR_DATABASE_URL (or sqlalchemy.url) to migrate")
    return _sqlalchemy_url(url)


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        is_owner = connection.execute(
            text("select current_user = 'harbor_owner' or pg_has_role('harbor_owner', 'MEMBER')")
        ).scalar()
        if not is_owner:
            raise RuntimeError("migrations must run as harbor_owner or a member of it")
        connection.execute(text("set role harbor_owner"))
        raw = connection.connection.driver_connection
        # held until the commit below: every other migration or start waits here
        raw.execute(query("migration_lock"))
        context.configure(
            connection=connection,
            version_table=VERSION_TABLE,
            version_table_schema=VERSION_SCHEMA,
            transaction_per_migration=False,
        )
        with context.begin_transaction():
            migration = context.get_context()
            before = set(migration.get_current_heads())
            context.run_migrations()
            moved = set(migration.get_current_heads()) != before
            schema_exists = connection.execute(
                text("select exists (select 1 from pg_namespace where nspname = 'harbor')")
            ).scalar()
            if schema_exists:
                _apply_idempotent(raw, moved)
            else:
                raw.execute(query("idempotent_state_drop"))
        # the SET ROLE above began SQLAlchemy's transaction: commit it explicitly
        connection.commit()


def _apply_idempotent(raw: Any, moved: bool) -> None:
    """Apply the re-runnable files when a revision ran or they changed since they
    were last applied here, and record their sha256; otherwise touch nothing."""
    sha256 = idempotent_sha256()
    state = raw.execute(query("idempotent_state_exists")).fetchone()
    if not state[0]:
        raw.execute(query("idempotent_state_create"))
    elif not moved:
        row = raw.execute(query("idempotent_state_read")).fetchone()
        if row is not None and row[0] == sha256:
            return
    if citus.is_distributed(raw):
        # a Citus coordinator after `harbor-pg distribute`: the policies in the form
        # Citus accepts, then the functions in the form it runs (harbor_pg.db.citus)
        citus.apply_idempotent(raw, idempotent_files())
    else:
        for _name, sql in idempotent_files():
            raw.execute(sql)
    raw.execute(query("idempotent_state_record"), {"sha256": sha256})


if context.is_offline_mode():  # pragma: no cover
    raise RuntimeError("harbor-pg migrations run online only")
run_migrations_online()
