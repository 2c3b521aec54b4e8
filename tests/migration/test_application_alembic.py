"""harbor-pg's revisions from an application's own Alembic environment.

A temporary Alembic project outside this repository, with revisions of its own,
calls upgrade_harbor() from its env.py and filters autogenerate with
include_name: upgrading runs both histories, downgrading its own revisions
leaves harbor-pg's schema and version alone, and autogenerate finds no
difference although the database holds the whole harbor schema.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool

import harbor_pg
import harbor_pg.tables
from harbor_pg.alembic_env import include_name
from harbor_pg.db import migrate
from harbor_pg.db.migrate import _sqlalchemy_url
from tests.conftest import PgDatabase

ENV = textwrap.dedent(
    """
    import os

    from alembic import context
    from sqlalchemy import create_engine, pool

    from app_models import metadata
    from harbor_pg.alembic_env import include_name, upgrade_harbor


    def run_migrations_online() -> None:
        engine = create_engine(os.environ["APP_DATABASE_URL"], poolclass=pool.NullPool)
        with engine.connect() as connection:
            upgrade_harbor(connection)
            context.configure(
                connection=connection,
                target_metadata=metadata,
                include_schemas=True,
                include_name=include_name,
            )
            with context.begin_transaction():
                context.run_migrations()


    run_migrations_online()
    """
)

MODELS = textwrap.dedent(
    """
    from sqlalchemy import Column, Integer, MetaData, Table, Text

    metadata = MetaData()
    notes = Table(
        "app_notes",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("body", Text, nullable=False),
        Column("tag", Text),
    )
    """
)

FIRST = textwrap.dedent(
    """
    import sqlalchemy as sa
    from alembic import op

    revision = "a1"
    down_revision = None
    branch_labels = None
    depends_on = None


    def upgrade() -> None:
        op.create_table(
            "app_notes",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("body", sa.Text, nullable=False),
        )


    def downgrade() -> None:
        op.drop_table("app_notes")
    """
)

SECOND = textwrap.dedent(
    """
    import sqlalchemy as sa
    from alembic import op

    revision = "a2"
    down_revision = "a1"
    branch_labels = None
    depends_on = None


    def upgrade() -> None:
        op.add_column("app_notes", sa.Column("tag", sa.Text))


    def downgrade() -> None:
        op.drop_column("app_notes", "tag")
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    versions = root / "app_migrations" / "versions"
    versions.mkdir(parents=True)
    (root / "alembic.ini").write_text("[alembic]\nscript_location = %(here)s/app_migrations\n")
    (root / "app_models.py").write_text(MODELS)
    (root / "app_migrations" / "env.py").write_text(ENV)
    (versions / "a1_notes.py").write_text(FIRST)
    (versions / "a2_tag.py").write_text(SECOND)
    return root


def _alembic(project: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARBOR_")}
    env["APP_DATABASE_URL"] = _sqlalchemy_url(url)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(harbor_pg.__file__).parent.parent), str(project)])
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(project / "alembic.ini"), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _state(url: str) -> tuple[str | None, list[str], bool]:
    """(the app's revision, app_notes' columns, whether harbor.memories exists)."""
    with psycopg.connect(url) as conn:
        app = conn.execute("select to_regclass('public.alembic_version') is not null").fetchone()
        version = None
        if app and app[0]:
            row = conn.execute("select version_num from public.alembic_version").fetchone()
            version = row[0] if row else None
        columns = [
            r[0]
            for r in conn.execute(
                "select column_name from information_schema.columns "
                "where table_schema = 'public' and table_name = 'app_notes' "
                "order by ordinal_position"
            )
        ]
        memories = conn.execute("select to_regclass('harbor.memories') is not null").fetchone()
    return version, columns, bool(memories and memories[0])


def test_an_application_env_runs_both_histories(project: Path, empty_db: PgDatabase) -> None:
    url = empty_db.superuser_url
    up = _alembic(project, url, "upgrade", "head")
    assert up.returncode == 0, up.stderr[-3000:]
    head = migrate.head_revision()
    assert migrate.current_revision(url) == head
    assert _state(url) == ("a2", ["id", "body", "tag"], True)

    down = _alembic(project, url, "downgrade", "-1")
    assert down.returncode == 0, down.stderr[-3000:]
    assert _state(url) == ("a1", ["id", "body"], True)
    assert migrate.current_revision(url) == head  # our history untouched

    base = _alembic(project, url, "downgrade", "base")
    assert base.returncode == 0, base.stderr[-3000:]
    assert _state(url) == (None, [], True)
    assert migrate.current_revision(url) == head

    again = _alembic(project, url, "upgrade", "head")
    assert again.returncode == 0, again.stderr[-3000:]
    check = _alembic(project, url, "check")
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-3000:]
    assert "No new upgrade operations detected" in check.stdout + check.stderr


def test_include_name_is_what_keeps_autogenerate_empty(project: Path, empty_db: PgDatabase) -> None:
    url = empty_db.superuser_url
    assert _alembic(project, url, "upgrade", "head").returncode == 0
    sys.path.insert(0, str(project))
    try:
        from app_models import metadata  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(project))
    engine = create_engine(_sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            bare = MigrationContext.configure(conn, opts={"include_schemas": True})
            filtered = MigrationContext.configure(
                conn, opts={"include_schemas": True, "include_name": include_name}
            )
            unfiltered_diff = compare_metadata(bare, metadata)
            filtered_diff = compare_metadata(filtered, metadata)
    finally:
        engine.dispose()
    assert any("harbor" in repr(d) for d in unfiltered_diff)  # without it: drop our tables
    assert filtered_diff == []
