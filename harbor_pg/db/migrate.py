"""Run the Alembic migrations shipped with harbor-pg."""

from __future__ import annotations

import io
from importlib import resources

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

__all__ = ["alembic_config", "current_revision", "downgrade", "head_revision", "upgrade"]


def _sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if "://" not in url:  # key=value conninfo
        return "postgresql+psycopg:///?" + "&".join(p.replace("'", "") for p in url.split())
    return url


def alembic_config(owner_url: str) -> Config:
    """An Alembic config for the shipped migrations, pointed at ``owner_url``."""
    location = resources.files("harbor_pg._migrations")
    cfg = Config(str(location.joinpath("alembic.ini")), stdout=io.StringIO())
    cfg.set_main_option("script_location", str(location))
    cfg.attributes["url"] = owner_url
    return cfg


def upgrade(owner_url: str, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(owner_url), revision)


def downgrade(owner_url: str, revision: str = "base") -> None:
    """Migrate the database down to ``revision`` (default: nothing left)."""
    command.downgrade(alembic_config(owner_url), revision)


def head_revision() -> str | None:
    """The newest revision shipped."""
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    return script.get_current_head()


def current_revision(url: str) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with psycopg.connect(url, autocommit=True) as conn:
        table = conn.execute("select to_regclass('public.harbor_alembic_version')").fetchone()
        if table is None or table[0] is None:
            return None
        row = conn.execute("select version_num from public.harbor_alembic_version").fetchone()
        return None if row is None else str(row[0])
