"""harbor-pg's schema from an application's own Alembic environment.

An application that already runs Alembic keeps its own ``env.py`` and
revisions; harbor-pg's revisions stay a separate history with their own
version table (``public.harbor_alembic_version``), so neither side's
``upgrade`` or ``downgrade`` touches the other's. Two additions to ``env.py``::

    from harbor_pg.alembic_env import include_name, upgrade_harbor

    def run_migrations_online() -> None:
        connectable = engine_from_config(config.get_section(config.config_ini_section))
        with connectable.connect() as connection:
            upgrade_harbor(connection)  # harbor-pg's revisions first (a no-op at head)
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                include_name=include_name,  # autogenerate leaves the harbor schema alone
            )
            with context.begin_transaction():
                context.run_migrations()

:func:`upgrade_harbor` runs as the connection's login, which must be
``harbor_owner`` or a member of it (or a superuser); see ``harbor-pg migrate``.
"""

from __future__ import annotations

from typing import Any

from harbor_pg.db import migrate

__all__ = [
    "HARBOR_SCHEMA",
    "HARBOR_SCHEMAS",
    "HARBOR_VERSION_TABLE",
    "include_name",
    "include_object",
    "upgrade_harbor",
]

#: The schema harbor-pg owns.
HARBOR_SCHEMA = "harbor"
#: Every schema harbor-pg owns: its own and its job queue's (procrastinate's tables)
HARBOR_SCHEMAS = frozenset({HARBOR_SCHEMA, "harbor_jobs"})
#: harbor-pg's Alembic version table (in the ``public`` schema, beside the application's).
HARBOR_VERSION_TABLE = "harbor_alembic_version"
#: harbor-pg's tables in ``public``: its version table and the record of the
#: re-runnable SQL last applied (harbor_pg.db.migrate)
HARBOR_PUBLIC_TABLES = frozenset({HARBOR_VERSION_TABLE, "harbor_idempotent_sql"})


def include_name(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Alembic ``include_name`` hook: skip harbor-pg's schemas and its tables in public.

    Pass it to ``context.configure(include_name=...)`` so autogenerate (and
    ``alembic check``) neither proposes dropping harbor-pg's tables (its job
    queue's included) nor
    reflects them, with or without ``include_schemas=True``.
    """
    if type_ == "schema":
        return name not in HARBOR_SCHEMAS
    if parent_names.get("schema_name") in HARBOR_SCHEMAS:
        return False
    return not (type_ == "table" and name in HARBOR_PUBLIC_TABLES)


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic ``include_object`` hook with the same rule as :func:`include_name`."""
    schema = getattr(obj, "schema", None)
    table = getattr(obj, "table", None)
    if schema in HARBOR_SCHEMAS or getattr(table, "schema", None) in HARBOR_SCHEMAS:
        return False
    return not (type_ == "table" and name in HARBOR_PUBLIC_TABLES)


def _libpq_url(target: Any) -> str:
    if isinstance(target, str):
        return target.replace("postgresql+psycopg://", "postgresql://", 1)
    engine = getattr(target, "engine", target)
    url = engine.url.set(drivername="postgresql")
    return str(url.render_as_string(hide_password=False))


def upgrade_harbor(target: Any, revision: str = "head") -> None:
    """Bring harbor-pg's schema to ``revision`` from inside another Alembic run.

    ``target`` is a SQLAlchemy ``Connection`` or ``Engine`` (its URL is used,
    on a connection of harbor-pg's own that commits on its own), or a database
    URL. The calling environment's Alembic context is left as it was, so
    ``env.py`` goes on to configure and run its own revisions.

    Raises:
        MemoryConfigurationError: the login may not migrate (not harbor_owner).
        MemoryDatabaseError: any other database failure.
    """
    from alembic import context

    # Alembic keeps the running environment in module globals; harbor-pg's own
    # run replaces and then removes them, so the caller's is put back afterwards.
    outer = getattr(context, "_proxy", None)
    try:
        migrate.upgrade(_libpq_url(target), revision, progress=None)
    finally:
        if outer is not None:
            outer._install_proxy()
