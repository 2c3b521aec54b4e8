"""The inspector over plain HTTP: the loopback default, the token rule, the identity gate.

The app runs under uvicorn on 127.0.0.1 (tests/inspect/conftest.py); the token
rule is exercised by an app whose settings name a non-loopback address, which
is what decides the rule (it is served on loopback all the same).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import psycopg
import pytest

from harbor_pg.access_tokens import TokenStore
from harbor_pg.db.connection import Database
from harbor_pg.inspect import InspectorSettings
from harbor_pg.inspect.access import IDENTITY_COOKIE, TOKEN_COOKIE, encode_identity, is_loopback
from harbor_pg.owner import MemoryOwner
from tests.conftest import PgDatabase
from tests.inspect.conftest import DANA, EVE, EVE_MARK, STRANGER, STRANGER_MARK, Seed, served


def _token(db: PgDatabase, owner: MemoryOwner, *, admin: bool = False) -> tuple[str, str]:
    async def make() -> tuple[str, str]:
        async with Database(db.app_url, db.admin_url, min_size=1, max_size=1) as database:
            issued = await TokenStore(database).create(owner, is_admin=admin)
            return issued.token, issued.record.id

    return asyncio.run(make())


def _revoke(db: PgDatabase, tenant: str, token_id: str) -> None:
    async def revoke() -> None:
        async with Database(db.app_url, db.admin_url, min_size=1, max_size=1) as database:
            await TokenStore(database).revoke(tenant, token_id)

    asyncio.run(revoke())


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("inspector.example", False),
    ],
)
def test_which_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    assert InspectorSettings(host=host).needs_token is not loopback


def test_loopback_is_the_default_and_needs_no_token(seeded: Seed) -> None:
    assert InspectorSettings().host == "127.0.0.1"
    with (
        served(seeded.db, InspectorSettings(tenant="acme")) as url,
        httpx.Client(base_url=url) as client,
    ):
        # no identity yet: the pages send you to choose one
        r = client.get("/memories")
        assert r.status_code == 303 and r.headers["location"].startswith("/identity")
        r = client.get("/identity")
        assert r.status_code == 200
        assert "user <b>dana</b>" in r.text and "user <b>eve</b>" in r.text
        assert "content-security-policy" in r.headers
        r = client.post("/identity", data={"tenant_id": "acme", "user_id": "dana"})
        assert r.status_code == 303 and IDENTITY_COOKIE in r.cookies
        r = client.get("/memories")
        assert r.status_code == 200
        assert "Dana owns the ingest pipeline" in r.text
        assert EVE_MARK not in r.text and STRANGER_MARK not in r.text
        # a page of another origin reaching this port through a name of its own is refused
        r = client.get("/identity", headers={"host": "attacker.example"})
        assert r.status_code == 400


def test_state_changing_requests_from_another_site_are_refused(seeded: Seed) -> None:
    """A form another site's page posts (the browser says cross-site, or its Origin is
    not the inspector's) neither chooses an identity nor logs in or out."""
    form = {"tenant_id": "acme", "user_id": "eve"}
    with (
        served(seeded.db, InspectorSettings(tenant="acme")) as url,
        httpx.Client(base_url=url) as client,
    ):
        for headers in (
            {"sec-fetch-site": "cross-site", "origin": "http://attacker.example"},
            {"sec-fetch-site": "same-site", "origin": "http://localhost:1"},
            {"origin": "http://attacker.example"},  # a browser without Sec-Fetch-Site
            {"origin": "null"},  # a sandboxed page
        ):
            for path in ("/identity", "/login", "/logout"):
                r = client.post(path, data=form, headers=headers)
                assert r.status_code == 403, (path, headers, r.status_code)
                assert IDENTITY_COOKIE not in r.cookies
        # the inspector's own pages, the address bar, and clients that are not browsers
        for headers in (
            {"sec-fetch-site": "same-origin", "origin": url},
            {"sec-fetch-site": "none"},
            {"origin": url},
            {},
        ):
            r = client.post("/identity", data=form, headers=headers)
            assert r.status_code == 303 and IDENTITY_COOKIE in r.cookies, headers


def _queue_job(db: PgDatabase, owner: MemoryOwner, *, fail: bool = False) -> int:
    """A job queued as the application queues one for ``owner`` (failed, with ``fail``)."""
    with psycopg.connect(db.app_url) as app:
        app.execute(
            "select harbor.set_identity(%s::text, %s::text, %s::text, null, %s::text, %s::text,"
            " true)",
            (owner.tenant_id, owner.project_id, owner.principal_id, owner.session_id, owner.run_id),
        )
        [(ids,)] = app.execute("select harbor_jobs.queue_turn_jobs(1, true, false, 0)").fetchall()
    if fail:
        with psycopg.connect(db.admin_url) as admin:
            admin.execute(
                "update harbor_jobs.procrastinate_jobs set status = 'failed', attempts = 5"
                " where id = %s",
                (ids[0],),
            )
    return int(ids[0])


def test_the_session_page_lists_the_sessions_waiting_and_failed_jobs(seeded: Seed) -> None:
    waiting = _queue_job(seeded.db, DANA)
    failed = _queue_job(seeded.db, DANA, fail=True)
    elsewhere = _queue_job(seeded.db, EVE)
    try:
        with (
            served(seeded.db, InspectorSettings(tenant="acme")) as url,
            httpx.Client(base_url=url) as client,
        ):
            client.cookies.set(IDENTITY_COOKIE, encode_identity(DANA))
            text = client.get("/session", params={"session": "s1"}).text
        assert f"#{waiting} · 0 run(s)" in text and f"#{failed} · 5 run(s)" in text
        assert "<b>waiting</b> harbor.extract_turn" in text
        assert "<b>failed</b> harbor.extract_turn" in text and "harbor-pg jobs" in text
        assert f"#{elsewhere} · 0 run(s)" not in text  # the job of eve's session
    finally:
        with psycopg.connect(seeded.db.admin_url) as admin:
            admin.execute(
                "delete from harbor_jobs.procrastinate_jobs where id = any(%s)",
                ([waiting, failed, elsewhere],),
            )


def test_a_forged_identity_cookie_only_names_an_identity(seeded: Seed) -> None:
    """On loopback any identity may be chosen; whichever it is, rows come through its
    own policies: eve's cookie shows eve's memory and not dana's."""
    with served(seeded.db, InspectorSettings()) as url, httpx.Client(base_url=url) as client:
        client.cookies.set(IDENTITY_COOKIE, encode_identity(EVE))
        text = client.get("/memories").text
        assert EVE_MARK in text and "Dana owns the ingest pipeline" not in text
        client.cookies.set(IDENTITY_COOKIE, "not-base64!")
        assert client.get("/memories").status_code == 303  # no identity: choose one


def test_non_loopback_needs_a_live_token_on_every_request(seeded: Seed) -> None:
    db = seeded.db
    token, token_id = _token(db, DANA)
    settings = InspectorSettings(host="0.0.0.0")
    with served(db, settings) as url, httpx.Client(base_url=url) as client:
        for path in ("/", "/memories", "/identity", "/ranking?q=ingest", "/session"):
            r = client.get(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert "Dana" not in r.text
        # a browser is sent to the login form instead
        r = client.get("/memories", headers={"accept": "text/html"})
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
        assert client.get("/login").status_code == 200
        assert client.get("/static/inspector.css").status_code == 200
        r = client.get("/memories", headers={"authorization": "Bearer hpg_not-a-token"})
        assert r.status_code == 401

        # a live token: the identity is exactly the token's
        auth = {"authorization": f"Bearer {token}"}
        r = client.get("/memories", headers=auth)
        assert r.status_code == 200
        assert "Dana owns the ingest pipeline" in r.text and EVE_MARK not in r.text
        r = client.post("/identity", headers=auth, data={"tenant_id": "acme", "user_id": "eve"})
        assert r.status_code == 403
        client.cookies.set(IDENTITY_COOKIE, encode_identity(EVE))  # ignored: fixed by the token
        r = client.get("/memories", headers=auth)
        assert EVE_MARK not in r.text and "Dana owns the ingest pipeline" in r.text
        client.cookies.clear()

        # the login form keeps the token in an HttpOnly cookie
        r = client.post("/login", data={"token": "hpg_wrong", "next": "/memories"})
        assert r.status_code == 401
        r = client.post("/login", data={"token": token, "next": "/memories"})
        assert r.status_code == 303 and r.headers["location"] == "/memories"
        assert "httponly" in r.headers["set-cookie"].lower()
        assert TOKEN_COOKIE in client.cookies
        assert client.get("/memories").status_code == 200

        # checked on every request: revoked, it stops working at once
        _revoke(db, "acme", token_id)
        assert client.get("/memories").status_code == 401
        assert client.get("/memories", headers=auth).status_code == 401


def test_an_administrator_token_chooses_within_its_tenant(seeded: Seed) -> None:
    db = seeded.db
    token, _ = _token(db, MemoryOwner(tenant_id="acme", user_id="ops"), admin=True)
    auth = {"authorization": f"Bearer {token}"}
    with (
        served(db, InspectorSettings(host="0.0.0.0")) as url,
        httpx.Client(base_url=url, headers=auth) as client,
    ):
        r = client.get("/identity")
        assert r.status_code == 200 and "user <b>eve</b>" in r.text
        assert client.post("/identity", data={"tenant_id": "acme", "user_id": "eve"}).is_redirect
        assert EVE_MARK in client.get("/memories").text
        r = client.post("/identity", data={"tenant_id": "globex", "user_id": "dana"})
        assert r.status_code == 403
        client.cookies.set(IDENTITY_COOKIE, encode_identity(STRANGER))
        r = client.get("/memories")  # a cookie naming another tenant is not taken
        assert r.status_code == 303 and STRANGER_MARK not in r.text


def test_a_bound_login_reads_only_as_its_binding(seeded: Seed, pg_server: object) -> None:
    db = seeded.db
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        conn.execute("drop role if exists inspect_eve")
        conn.execute("create role inspect_eve login in role harbor_app")
        conn.execute(f'grant connect on database "{db.name}" to inspect_eve')
    with psycopg.connect(db.admin_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('acme')")
        conn.execute("select harbor.bind_role('inspect_eve', 'acme', user_id => 'eve')")
    bound = PgDatabase(
        db.name, db.superuser_url, db.url_for("inspect_eve"), db.admin_url, db.owner_url
    )
    try:
        with served(bound, InspectorSettings()) as url, httpx.Client(base_url=url) as client:
            r = client.get("/memories")  # the binding is the identity: nothing to choose
            assert r.status_code == 200 and EVE_MARK in r.text
            assert "Dana owns the ingest pipeline" not in r.text
            r = client.post("/identity", data={"tenant_id": "acme", "user_id": "dana"})
            assert r.status_code == 403
            client.cookies.set(IDENTITY_COOKIE, encode_identity(DANA))
            text = client.get("/memories").text
            assert "Dana owns the ingest pipeline" not in text and EVE_MARK in text
    finally:
        with psycopg.connect(db.superuser_url, autocommit=True) as conn:
            conn.execute("select harbor.unbind_role('inspect_eve')")
            conn.execute(f'revoke connect on database "{db.name}" from inspect_eve')
            conn.execute("drop role inspect_eve")


def test_the_command_prints_its_url_and_serves_on_loopback(seeded: Seed) -> None:
    env = {**os.environ, "HARBOR_DATABASE_URL": seeded.db.superuser_url, "HF_HUB_OFFLINE": "1"}
    env.pop("HARBOR_ADMIN_DATABASE_URL", None)
    with subprocess.Popen(
        [sys.executable, "-m", "harbor_pg.cli", "inspect", "--port", "0", "--tenant", "acme"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("harbor-pg inspect at http://127.0.0.1:"), line
            assert "no token needed" in line
            url = line.split(" at ", 1)[1].split(" ", 1)[0]
            deadline = time.monotonic() + 10
            while True:
                try:
                    r = httpx.get(url + "identity?tenant=acme")
                    break
                except httpx.ConnectError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            assert r.status_code == 200 and "user <b>dana</b>" in r.text
        finally:
            proc.terminate()
            proc.wait(timeout=30)
