"""Server selection, checks and clear connection errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryConfigurationError
from tests.conftest import PgDatabase, PgServer, run_cli


def test_redact_hides_passwords() -> None:
    assert server.redact("postgresql://bob:s3cret@db:5432/x") == "postgresql://bob:***@db:5432/x"
    assert "s3cret" not in server.redact("host=db user=bob password=s3cret dbname=x")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:pa/ss@db:5432/x",  # an unencoded '/' (urllib splits there)
        "postgresql://bob:pa@ss@db:5432/x",  # an unencoded '@'
        "postgresql://bob:pa:ss@db:5432/x",  # an unencoded ':'
        "postgresql://bob:pa%2Fss@db:5432/x",  # percent-encoded
    ],
)
def test_redact_hides_passwords_with_reserved_characters(url: str) -> None:
    assert server.redact(url) == "postgresql://bob:***@db:5432/x"
    message = f"connection to {url} failed; password was pa/ss pa@ss pa:ss pa%2Fss"
    scrubbed = server.scrub(message, url)
    password = url.split("bob:", 1)[1].rsplit("@", 1)[0]
    assert password not in scrubbed
    assert "postgresql://bob:***@db:5432/x" in scrubbed


def test_redact_leaves_urls_without_a_password_alone() -> None:
    for url in (
        "postgresql://bob@db:5432/x",
        "postgresql://db:5432/x",
        "postgresql://[::1]:5432/x",
    ):
        assert server.redact(url) == url


@pytest.mark.parametrize(
    ("found", "message"),
    [
        ({"btree_gist": "1.8"}, "does not have the pgvector extension"),
        ({"vector": "0.6.2", "btree_gist": "1.8"}, "has pgvector 0.6.2; harbor-pg needs >= 0.7"),
        ({"vector": "0.8.1"}, "does not have the btree_gist extension"),
    ],
)
def test_missing_extensions_are_named(found: dict[str, str], message: str) -> None:
    with pytest.raises(MemoryConfigurationError, match=message):
        server.check_extensions(found, "db")


def test_embedded_server_has_what_we_need(fresh_db: PgDatabase) -> None:
    server.check_server(fresh_db.superuser_url)


def test_unreachable_server_is_one_clear_error(tmp_path: Path) -> None:
    url = f"postgresql://bob:hunter2@/harbor?host={tmp_path}&connect_timeout=2"
    with pytest.raises(MemoryConfigurationError) as info:
        server.check_server(url)
    text = str(info.value)
    assert "unreachable" in text and "hunter2" not in text and "***" in text


def test_unknown_role_is_bad_credentials(pg_server: PgServer) -> None:
    url = conninfo.make_conninfo(pg_server.superuser_url, user="nobody_here", password="pw1")
    with pytest.raises(MemoryConfigurationError) as info:
        server.check_server(url)
    assert "bad credentials" in str(info.value) and "pw1" not in str(info.value)


async def test_database_open_error_is_clear(tmp_path: Path) -> None:
    db = Database(f"host={tmp_path} dbname=x user=harbor_app connect_timeout=1")
    with pytest.raises(MemoryConfigurationError, match="unreachable"):
        await db.open()


def test_external_url_as_superuser_bootstraps_and_migrates(empty_db: PgDatabase) -> None:
    info = server.resolve_server(empty_db.superuser_url)
    assert info.superuser_url == empty_db.superuser_url
    migrate.upgrade(info.owner_url)
    assert migrate.current_revision(info.owner_url) == migrate.head_revision()


async def test_privileged_login_is_switched_to_the_app_role(fresh_db: PgDatabase) -> None:
    # a superuser URL must not skip row-level security: the pool switches role
    db = Database(fresh_db.superuser_url)
    await db.open()
    try:
        async with db.transaction(None) as conn:
            row = await (await conn.execute("select current_user")).fetchone()
            assert row == {"current_user": "harbor_app"}
    finally:
        await db.close()


def test_cli_up_and_status_start_and_reuse_the_embedded_server(tmp_path: Path) -> None:
    env = {**os.environ, "HARBOR_DATA_DIR": str(tmp_path / "data")}
    env.pop("HARBOR_DATABASE_URL", None)
    try:
        up = subprocess.run(
            [sys.executable, "-m", "harbor_pg.cli", "up"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert up.returncode == 0, up.stderr
        assert "harbor-pg is up" in up.stdout and "application URL" in up.stdout
        assert "stop it with: harbor-pg stop" in up.stdout
        status = subprocess.run(
            [sys.executable, "-m", "harbor_pg.cli", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.returncode == 0, status.stderr
        assert "up to date" in status.stdout and "short-term 0" in status.stdout
        # the embedded server's buffers, as harbor-pg sized them
        expected = server.embedded_settings()["shared_buffers"]
        assert f"memory:   shared_buffers {expected}, database " in status.stdout
        demo = subprocess.run(
            [sys.executable, "-m", "harbor_pg.cli", "demo"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert demo.returncode == 0, demo.stderr
        assert "saved twice, stored once" in demo.stdout
        assert "eve sees 0 of dana's turns" in demo.stdout
        # extraction queued with the turns and run by the demo's own process
        assert "then       : [user] Dana lives in Lisbon, superseding 'Dana lives in Berlin'" in (
            demo.stdout
        )
        assert "queue      : 2 extraction jobs run" in demo.stdout
        assert demo.stdout.rstrip().endswith(
            "the embedded server keeps running; stop it with: harbor-pg stop"
        )
        # recall with its signals, and the context of the next turn
        assert "relev recency import   score  content" in demo.stdout
        assert "Dana owns the ingest pipeline of the handbook project" in demo.stdout
        assert "recalled : [user] Dana owns the ingest pipeline" in demo.stdout
        # the sensitivity ceiling: the sensitive memory only with the opt-in
        lines = demo.stdout.splitlines()
        shown = next(x for x in lines if x.startswith("  recall 'when is Dana on leave?'"))
        opted = next(x for x in lines if "with recall_max_sensitivity='sensitive'" in x)
        assert "medical leave" not in shown and "medical leave" in opted
        # the context of a follow-up turn: a rolling summary of the older turns (the
        # extractive no-model one, default policy) and a rewritten standalone query
        assert "rewrite: a scripted stand-in model" in demo.stdout
        summary = re.search(
            r"summary  : rolling summary of messages #(\d+)-#(\d+), refreshed this turn: yes"
            r".*\n {13}(?:User|Assistant): (.+)",
            demo.stdout,
        )
        assert summary is not None, demo.stdout
        assert int(summary.group(1)) < int(summary.group(2))
        # the extractive summary keeps what the next turn needs: who owns what,
        # the decision and the stated preference, not the pasted run report's figures
        folded = " ".join(demo.stdout.split("summary  :")[1].split("question :")[0].split())
        assert "I look after the ingest pipeline" in folded, folded
        assert "decided to move the embeddings into Postgres with pgvector" in folded, folded
        assert "Please keep answers short" in folded, folded
        assert "406 were retried" not in folded and "02:47" not in folded, folded
        assert "question : 'And who looks after it?'" in demo.stdout
        assert (
            "query    : 'Who looks after the ingest pipeline of the handbook project?' "
            "(rewritten: True, by the scripted model; wanted types: fact)"
        ) in demo.stdout
        assert "degraded :" not in demo.stdout
        # extraction, supersession, and an as-of recall on both sides of the change
        assert "extracted  : [user] Dana lives in Berlin" in demo.stdout
        assert (
            "then       : [user] Dana lives in Lisbon, superseding 'Dana lives in Berlin'"
            in demo.stdout
        )
        assert "as of before the move: ['Dana lives in Berlin']" in demo.stdout
        assert "as of now            : ['Dana lives in Lisbon']" in demo.stdout
        again = subprocess.run(
            [sys.executable, "-m", "harbor_pg.cli", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "short-term 17" in again.stdout  # 5 + 10 turns, then 2 for extraction
    finally:
        server.stop_embedded(tmp_path / "data" / "pgdata")


def test_cli_reports_a_bad_url_without_traceback() -> None:
    env = {**os.environ, "HARBOR_DATABASE_URL": "postgresql://u:topsecret@/x?host=/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-m", "harbor_pg.cli", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "topsecret" not in out.stderr
    assert "cannot connect to PostgreSQL" in out.stderr


def test_psycopg_is_used_for_checks(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.superuser_url) as conn:
        assert conn.execute("select extname from pg_extension where extname = 'vector'").fetchone()


def test_cli_status_names_functions_with_another_owner(fresh_db: PgDatabase) -> None:
    """A function re-created by hand as a superuser blocks the next migration;
    `status` names it, says how to give it back, and exits 1."""

    def status() -> subprocess.CompletedProcess[str]:
        return run_cli("status", url=fresh_db.superuser_url)

    fine = status()
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert "owners:" not in fine.stdout
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        (me,) = su.execute("select current_user::text").fetchone() or ("",)
        su.execute("alter function harbor.approximate_tokens(text) owner to current_user")
        su.execute(
            "alter function harbor._lexical_candidates(text, harbor.memory_scope[],"
            " timestamptz, integer, integer, integer, harbor.sensitivity, harbor.memory_type[],"
            " public.vector, text, integer) owner to current_user"
        )
        try:
            bad = status()
        finally:
            su.execute("alter function harbor.approximate_tokens(text) owner to harbor_owner")
            su.execute("grant create on schema harbor to harbor_search")
            su.execute(
                "alter function harbor._lexical_candidates(text, harbor.memory_scope[],"
                " timestamptz, integer, integer, integer, harbor.sensitivity,"
                " harbor.memory_type[], public.vector, text, integer) owner to harbor_search"
            )
            su.execute("revoke create on schema harbor from harbor_search")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "owners:   2 harbor function(s) not owned as a migration leaves them" in bad.stdout
    assert (
        f"harbor._lexical_candidates(text,harbor.memory_scope[],timestamp with time zone,"
        f"integer,integer,integer,harbor.sensitivity,harbor.memory_type[],vector,text,integer)"
        f" is owned by {me}:"
        " alter function"
        " harbor._lexical_candidates("
    ) in bad.stdout
    assert "owner to harbor_search;" in bad.stdout
    assert (
        f"harbor.approximate_tokens(text) is owned by {me}: alter function"
        " harbor.approximate_tokens(text) owner to harbor_owner;"
    ) in bad.stdout
    assert status().returncode == 0


def test_a_process_that_died_holding_the_server_does_not_keep_it_up(tmp_path: Path) -> None:
    """With ``cleanup_mode="stop"`` the wheel stops the server when the last process
    in its list of holders exits. A holder that was killed stays in that list; it
    must not keep every later process from stopping the server."""
    data = tmp_path / "data"
    pgdata = data / "pgdata"
    start = (
        "import sys; from pathlib import Path; from harbor_pg.db import server;"
        " server.start_embedded(Path(sys.argv[1]),"
        " cleanup_mode=None if sys.argv[2] == 'none' else sys.argv[2])"
    )

    def run(mode: str) -> None:
        out = subprocess.run(
            [sys.executable, "-c", start, str(data), mode],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr

    try:
        run("none")  # started and left running
        assert (pgdata / "postmaster.pid").exists()
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        (pgdata / ".handle_pids.json").write_text(json.dumps([gone.pid]))
        run("stop")  # the last live holder: it stops the server as it exits
        assert not (pgdata / "postmaster.pid").exists()
        assert json.loads((pgdata / ".handle_pids.json").read_text()) == []
    finally:
        server.stop_embedded(pgdata)
