"""The MCP server, driven by the SDK's own client over stdio and streamable HTTP.

The server runs as ``harbor-pg mcp`` in a subprocess against a fresh database;
what it writes is checked with a superuser connection. Over HTTP every
request needs a bearer token from ``harbor-pg token create``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import psycopg
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.conftest import PgDatabase, run_cli

DANA = ("--tenant", "acme", "--principal", "dana", "--session", "s1")


def _env(db: PgDatabase) -> dict[str, str]:
    env = {**os.environ, "HARBOR_DATABASE_URL": db.superuser_url, "HF_HUB_OFFLINE": "1"}
    env.pop("HARBOR_ADMIN_DATABASE_URL", None)
    env.pop("HARBOR_EMBED_MODEL_PATH", None)
    return env


def _rows(db: PgDatabase, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _counts(db: PgDatabase) -> tuple[Any, ...]:
    [row] = _rows(
        db,
        "select (select count(*) from harbor.memories), (select count(*) from harbor.messages),"
        " (select count(*) from harbor.memory_embeddings),"
        " (select count(*) from harbor.access_tokens)",
    )
    return row


def _data(result: Any) -> Any:
    assert not result.is_error, result.content
    return result.structured_content


def _error(result: Any) -> str:
    assert result.is_error, result.structured_content
    return " ".join(getattr(c, "text", "") for c in result.content)


@contextlib.asynccontextmanager
async def stdio_session(db: PgDatabase, *identity: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "harbor_pg.cli", "mcp", *identity],
        env=_env(db),
    )
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


# -- stdio ----------------------------------------------------------------------------


async def test_stdio_every_tool_and_the_resource(module_db: PgDatabase) -> None:
    async with stdio_session(module_db, *DANA) as s:
        names = {t.name for t in (await s.list_tools()).tools}
        assert names == {"remember", "recall", "context", "forget", "history", "erase"}
        descriptions = {t.name: t.description or "" for t in (await s.list_tools()).tools}
        assert "never from arguments" not in descriptions["recall"]  # the instructions say it
        assert all(len(d) > 80 for d in descriptions.values())

        saved = _data(
            await s.call_tool(
                "remember",
                {
                    "content": "Dana owns the ingest pipeline",
                    "importance": 0.9,
                    "sensitivity": "low",
                    "entities": ["dana", "ingest"],
                },
            )
        )
        assert saved["created"] is True
        again = _data(await s.call_tool("remember", {"content": "Dana owns the ingest pipeline"}))
        assert again == {**saved, "created": False}
        _data(
            await s.call_tool(
                "remember",
                {
                    "content": "The session talks about ingest",
                    "scope": "session",
                    "memory_type": "episode",
                },
            )
        )

        hits = _data(await s.call_tool("recall", {"query": "who owns the ingest pipeline?"}))
        top = hits["memories"][0]
        assert top["id"] == saved["id"] and top["rank"] == 1
        assert top["lexical_rank"] is not None and top["score"] > 0
        for signal in ("relevance", "recency", "entity", "type_boost", "dense_rank", "similarity"):
            assert signal in top

        built = _data(await s.call_tool("context", {"message": "and who owns ingest?"}))
        assert saved["id"] in [m["id"] for m in built["memories"]]
        assert built["standalone_query"] == "and who owns ingest?"

        chain = _data(await s.call_tool("history", {"memory_id": saved["id"]}))
        assert [v["id"] for v in chain["versions"]] == [saved["id"]]

        listed = await s.read_resource("harbor://memories/all")
        current = json.loads(listed.contents[0].text)  # type: ignore[union-attr]
        assert {m["content"] for m in current} == {
            "Dana owns the ingest pipeline",
            "The session talks about ingest",
        }
        user_only = json.loads(
            (await s.read_resource("harbor://memories/user")).contents[0].text  # type: ignore[union-attr]
        )
        assert [m["id"] for m in user_only] == [saved["id"]]
        profile = json.loads(
            (await s.read_resource("harbor://profile/user")).contents[0].text  # type: ignore[union-attr]
        )
        assert profile["stable"] == []
        assert [m["id"] for m in profile["recent"]] == [saved["id"]]
        assert profile["tokens"] > 0
        both = json.loads(
            (await s.read_resource("harbor://profile/all")).contents[0].text  # type: ignore[union-attr]
        )
        assert {m["content"] for m in both["recent"]} == {m["content"] for m in current}

        refused = _error(await s.call_tool("erase", {"user_id": "dana"}))
        assert "administrator" in refused

        gone = _data(await s.call_tool("forget", {"memory_id": saved["id"]}))
        assert gone == {"deleted": saved["id"]}
        assert "no memory" in _error(await s.call_tool("forget", {"memory_id": saved["id"]}))

    [(tenant, user, principal, source, sensitivity, importance)] = _rows(
        module_db,
        "select tenant_id, user_id, principal_id, source, sensitivity::text, importance"
        " from harbor.memories where scope = 'session'",
    )
    assert (tenant, user, principal, source) == ("acme", "dana", "dana", "tool:mcp")
    assert (sensitivity, importance) == ("none", 0.5)


async def test_stdio_history_shows_the_supersession_chain(fresh_db: PgDatabase) -> None:
    owner = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
    db = Database(fresh_db.app_url, fresh_db.admin_url)
    await db.open()
    try:
        manager = MemoryManager.from_database(db)
        first = await manager.inject_memory(owner, "Dana lives in Lisbon")
        store: Any = manager.long_term
        second = await store.supersede(
            owner, first.memory.id, Memory(content="Dana lives in Porto")
        )
    finally:
        await db.close()
    async with stdio_session(fresh_db, *DANA) as s:
        for start in (first.memory.id, second.memory.id):
            chain = _data(await s.call_tool("history", {"memory_id": start}))["versions"]
            assert [v["content"] for v in chain] == ["Dana lives in Lisbon", "Dana lives in Porto"]
            assert chain[0]["invalid_at"] is not None and chain[1]["invalid_at"] is None
            assert chain[0]["superseded_by"] == second.memory.id


async def test_stdio_identity_in_arguments_is_ignored(fresh_db: PgDatabase) -> None:
    forged = {
        "tenant_id": "evil",
        "user_id": "bob",
        "principal_id": "bob",
        "session_id": "x",
        "owner": {"tenant_id": "evil"},
    }
    async with stdio_session(fresh_db, *DANA) as s:
        _data(await s.call_tool("remember", {"content": "Dana prefers tea", **forged}))
        hits = _data(await s.call_tool("recall", {"query": "tea", **forged}))
        assert [m["content"] for m in hits["memories"]] == ["Dana prefers tea"]
    assert _rows(fresh_db, "select tenant_id, user_id, principal_id from harbor.memories") == [
        ("acme", "dana", "dana")
    ]


async def test_stdio_bad_arguments_are_clear_errors_and_write_nothing(
    fresh_db: PgDatabase,
) -> None:
    async with stdio_session(fresh_db, "--tenant", "acme", "--principal", "dana") as s:
        before = _counts(fresh_db)
        cases = [
            ("remember", {"content": "x", "importance": 5}, "importance"),
            ("remember", {"content": "x", "scope": "tenant"}, "scope"),
            ("remember", {"content": "x", "memory_type": "summary"}, "memory_type"),
            ("remember", {"content": ""}, "content"),
            ("remember", {}, "content"),
            ("remember", {"content": "x", "scope": "session"}, "session_id"),  # no session
            ("remember", {"content": "x" * 20_001}, "20000"),
            ("recall", {"query": "x", "top_k": 0}, "top_k"),
            ("recall", {"query": "x", "top_k": "many"}, "top_k"),
            ("context", {"message": "hello"}, "session_id"),
            ("forget", {"memory_id": "no-such-id"}, "no memory"),
            ("history", {"memory_id": "no-such-id"}, "no memory"),
        ]
        for tool, arguments, expected in cases:
            message = _error(await s.call_tool(tool, arguments))
            assert expected in message, (tool, arguments, message)
        assert _counts(fresh_db) == before


# -- streamable HTTP -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_server(module_db: PgDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("mcp") / "server.log"
    with open(log, "w") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harbor_pg.cli", "mcp", "--http", "--port", str(port)],
            env=_env(module_db),
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited: {log.read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the MCP server did not listen within 90 s")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _token(db: PgDatabase, *args: str) -> tuple[str, str]:
    done = run_cli("token", "create", *args, url=db.superuser_url)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    token_id = done.stderr.split()[1]
    return token, token_id


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _post(url: str, token: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": "written without a token"}},
    }
    return httpx2.post(url, json=body, headers=headers, timeout=30)


def test_http_without_a_valid_token_is_401_and_touches_nothing(
    http_server: str, module_db: PgDatabase
) -> None:
    before = _counts(module_db)
    for token in (None, "hpg_not-a-token", "x" * 500):
        response = _post(http_server, token)
        assert response.status_code == 401, (token, response.text)
    assert _counts(module_db) == before
    assert _rows(
        module_db, "select count(*) from harbor.memories where content like 'written%%'"
    ) == [(0,)]


async def test_http_every_tool_with_a_token(http_server: str, module_db: PgDatabase) -> None:
    token, _ = _token(module_db, "--tenant", "http", "--principal", "ana", "--session", "s9")
    async with http_session(http_server, token) as s:
        saved = _data(
            await s.call_tool(
                "remember",
                {"content": "Ana reviews the billing code", "tenant_id": "other", "user_id": "zed"},
            )
        )
        hits = _data(await s.call_tool("recall", {"query": "who reviews billing?"}))
        assert hits["memories"][0]["id"] == saved["id"]
        assert hits["memories"][0]["lexical_rank"] == 1
        built = _data(await s.call_tool("context", {"message": "who reviews billing?"}))
        assert [m["id"] for m in built["memories"]] == [saved["id"]]
        chain = _data(await s.call_tool("history", {"memory_id": saved["id"]}))
        assert len(chain["versions"]) == 1
        current = json.loads(
            (await s.read_resource("harbor://memories/all")).contents[0].text  # type: ignore[union-attr]
        )
        assert [m["id"] for m in current] == [saved["id"]]
        assert "administrator" in _error(await s.call_tool("erase", {"user_id": "ana"}))
        _data(await s.call_tool("forget", {"memory_id": saved["id"]}))
        # bad arguments over HTTP: a clear error, nothing written
        before = _counts(module_db)
        assert "importance" in _error(
            await s.call_tool("remember", {"content": "x", "importance": -1})
        )
        assert _counts(module_db) == before
    assert _rows(module_db, "select count(*) from harbor.memories where tenant_id = 'other'") == [
        (0,)
    ]


async def test_http_admin_token_erases_in_its_own_tenant_only(
    http_server: str, module_db: PgDatabase
) -> None:
    user, _ = _token(module_db, "--tenant", "er", "--principal", "kim")
    other, _ = _token(module_db, "--tenant", "er2", "--principal", "kim")
    admin, _ = _token(module_db, "--tenant", "er", "--principal", "boss", "--admin")
    for token in (user, other):
        async with http_session(http_server, token) as s:
            _data(await s.call_tool("remember", {"content": "Kim likes green"}))
    async with http_session(http_server, admin) as s:
        receipt = _data(await s.call_tool("erase", {"user_id": "kim", "tenant_id": "er2"}))
    assert receipt["long_term"] == 1
    assert _rows(
        module_db, "select tenant_id from harbor.memories where content = 'Kim likes green'"
    ) == [("er2",)]


async def test_http_revoked_token_is_refused_at_once(
    http_server: str, module_db: PgDatabase
) -> None:
    token, token_id = _token(module_db, "--tenant", "rv", "--principal", "lee")
    async with http_session(http_server, token) as s:
        _data(await s.call_tool("remember", {"content": "Lee is on call this week"}))
    done = run_cli("token", "revoke", token_id, "--tenant", "rv", url=module_db.superuser_url)
    assert done.returncode == 0, done.stderr
    assert _post(http_server, token).status_code == 401
    again = run_cli("token", "revoke", token_id, "--tenant", "rv", url=module_db.superuser_url)
    assert again.returncode == 2 and "no live token" in again.stderr
    listed = run_cli("token", "list", "--tenant", "rv", url=module_db.superuser_url)
    assert f"{token_id}  revoked" in listed.stdout and token not in listed.stdout


async def test_http_two_tokens_of_two_users_are_isolated(
    http_server: str, module_db: PgDatabase
) -> None:
    dana, _ = _token(module_db, "--tenant", "iso", "--principal", "dana")
    eve, _ = _token(module_db, "--tenant", "iso", "--principal", "eve")
    async with http_session(http_server, dana) as s:
        remember = {"content": "Dana keeps the spare badge in locker 4411"}
        mine = _data(await s.call_tool("remember", remember))
    async with http_session(http_server, eve) as s:
        hits = _data(await s.call_tool("recall", {"query": "spare badge locker 4411"}))
        assert hits["memories"] == []
        assert "no memory" in _error(await s.call_tool("forget", {"memory_id": mine["id"]}))
        assert "no memory" in _error(await s.call_tool("history", {"memory_id": mine["id"]}))
        current = json.loads(
            (await s.read_resource("harbor://memories/all")).contents[0].text  # type: ignore[union-attr]
        )
        assert current == []
    async with http_session(http_server, dana) as s:
        hits = _data(await s.call_tool("recall", {"query": "spare badge locker 4411"}))
        assert [m["id"] for m in hits["memories"]] == [mine["id"]]


def test_tokens_are_stored_hashed_and_hidden_from_the_app_role(module_db: PgDatabase) -> None:
    token, token_id = _token(module_db, "--tenant", "hash", "--principal", "max")
    [(stored,)] = _rows(
        module_db, "select to_jsonb(t)::text from harbor.access_tokens t where id = %s", token_id
    )
    assert token not in stored
    assert hashlib.sha256(token.encode()).hexdigest() in stored
    with psycopg.connect(module_db.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('hash', principal_id => 'max')")
        assert conn.execute("select count(*) from harbor.access_tokens").fetchone() == (0,)
        conn.execute(
            "select set_config('harbor.token_hash', %s, false)",
            (hashlib.sha256(token.encode()).hexdigest(),),
        )
        assert conn.execute("select id from harbor.access_tokens").fetchall() == [(token_id,)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "insert into harbor.access_tokens (tenant_id, token_hash) values ('hash', %s)",
                ("0" * 64,),
            )
