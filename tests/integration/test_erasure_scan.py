"""Erasure by provenance, checked by a scan of every text column the catalog lists.

Every value derived from the erased user carries one tag, unique to the test
run, so a single string finds them all. The columns are read from the catalog,
so a column added later is scanned too: before the erasure every column that
can hold text must hold the tag somewhere (or be listed in NOT_PERSONAL with
the reason it cannot hold a person's text), and after it none may.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from harbor_pg.access_tokens import TokenStore
from harbor_pg.context.summarizer import SessionSummarizer
from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.conftest import PgDatabase

TAG = "zq" + uuid.uuid4().hex[:12]
DANA_ID = f"dana{TAG}"
#: Dana in session s1 (Erin has an s1 too), and in a session and project of her own
DANA = MemoryOwner(tenant_id="t1", project_id="p1", principal_id=DANA_ID, session_id="s1")
DANA2 = MemoryOwner(
    tenant_id="t1",
    project_id=f"proj{TAG}",
    principal_id=DANA_ID,
    session_id=f"s2{TAG}",
    run_id=f"run{TAG}",
)
ERIN = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="erin", session_id="s1")
ERIN_SUPPORT = ERIN.model_copy(update={"session_id": "support"})
#: Dana answering as a support agent in Erin's support session
DANA_IN_ERINS = ERIN_SUPPORT.model_copy(update={"principal_id": DANA_ID, "user_id": "erin"})
#: an agent working for Dana in her session s1
BOT = DANA.model_copy(update={"principal_id": "helper-bot", "user_id": DANA_ID})

#: text columns that cannot hold a person's text, and why
NOT_PERSONAL = {
    ("harbor", "messages", "tenant_id"): "the tenant, shared by everyone in it",
    ("harbor", "working_state", "tenant_id"): "the tenant",
    ("harbor", "memories", "tenant_id"): "the tenant",
    ("harbor", "memories", "source_tenant_id"): "the tenant",
    ("harbor", "memory_embeddings", "tenant_id"): "the tenant",
    ("harbor", "session_state", "tenant_id"): "the tenant",
    ("harbor", "owner_locks", "tenant_id"): "the tenant",
    ("harbor", "role_bindings", "tenant_id"): "the tenant",
    ("harbor", "memory_hits", "tenant_id"): "the tenant",
    ("harbor", "memories", "content_hash"): "a SHA-256 digest, never the text",
    ("harbor", "memories", "context_hash"): "a SHA-256 digest, never the text",
    ("harbor", "memories", "source"): "a fixed vocabulary (check constraint)",
    ("harbor", "memories", "superseded_by"): "a memory id; ON DELETE SET NULL clears erased ones",
    ("public", "harbor_alembic_version", "version_num"): "the schema revision",
    ("public", "harbor_idempotent_sql", "sha256"): "a digest of harbor-pg's own SQL files",
    ("harbor", "access_tokens", "tenant_id"): "the tenant",
    ("harbor", "access_tokens", "id"): "a random uuid",
    ("harbor", "access_tokens", "token_hash"): "a SHA-256 digest of a random token",
    ("harbor_jobs", "procrastinate_jobs", "queue_name"): "harbor-pg's queue names",
    ("harbor_jobs", "procrastinate_jobs", "task_name"): "harbor-pg's task names",
    ("harbor_jobs", "procrastinate_periodic_defers", "task_name"): "harbor-pg's task names",
    ("harbor_jobs", "procrastinate_periodic_defers", "periodic_id"): "an upkeep schedule's id",
}


def text_columns(conn: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str, str]]:
    """(schema, table, column) of every column of a user table whose type can hold text:
    strings, json, text vectors, and arrays of those."""
    rows = conn.execute(
        """
        select n.nspname, c.relname, a.attname
          from pg_catalog.pg_attribute a
          join pg_catalog.pg_class c on c.oid = a.attrelid
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace
          join pg_catalog.pg_type ty on ty.oid = a.atttypid
          left join pg_catalog.pg_type el on el.oid = ty.typelem and ty.typcategory = 'A'
         where c.relkind in ('r', 'p') and a.attnum > 0 and not a.attisdropped
           and n.nspname not in ('pg_catalog', 'information_schema')
           and n.nspname not like 'pg_toast%%'
           and (coalesce(el.typcategory, ty.typcategory) = 'S'
                or coalesce(el.typname, ty.typname) in ('json', 'jsonb', 'tsvector'))
         order by 1, 2, 3
        """
    ).fetchall()
    return [(str(s), str(t), str(c)) for s, t, c in rows]


def columns_holding(db: PgDatabase, needle: str) -> set[tuple[str, str, str]]:
    """The text columns of any table where some row holds ``needle``."""
    found = set()
    with psycopg.connect(db.superuser_url) as conn:
        for schema, table, column in text_columns(conn):
            query = sql.SQL("select exists (select 1 from {}.{} where {}::text like %s)").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(column)
            )
            row = conn.execute(query, (f"%{needle}%",)).fetchone()
            if row and row[0]:
                found.add((schema, table, column))
    return found


@pytest.fixture
def dana_role(fresh_db: PgDatabase) -> Iterator[str]:
    """A database role an administrator binds to Dana (roles are cluster-wide)."""
    name = f"harbor_test_{TAG}_{os.getpid()}"
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(name)))
        conn.execute(sql.SQL("grant harbor_app to {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def bind(db: PgDatabase, role: str, owner: MemoryOwner) -> None:
    with psycopg.connect(db.admin_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1')")
        conn.execute(
            "select harbor.bind_role(%s, 't1', project_id => %s, user_id => %s)",
            (role, owner.project_id, owner.user_id),
        )


async def summarise(database: Database, owner: MemoryOwner) -> None:
    summariser = SessionSummarizer(
        policy=MemoryPolicy(
            summarise_after_turns=4, summary_keep_messages=1, summary_cooldown_seconds=0
        ),
        messages=PostgresShortTermStore(database),
        memories=PostgresLongTermStore(database),
    )
    assert await summariser.maybe_summarise(owner)


async def fill(manager: MemoryManager, database: Database, fresh_db: PgDatabase) -> str:
    """Dana's rows, what was derived from them, and Erin's; returns Erin's superseded fact id."""
    say = manager.append
    # Dana's own session, project and run: every column of a turn and a run
    await say(DANA2, ConversationMessage(role="user", content=f"my locker code is code{TAG}"))
    await say(
        DANA2,
        ConversationMessage(
            role="assistant",
            content="looking it up",
            tool_calls=[{"id": f"call{TAG}", "name": "lookup", "args": {"q": f"q{TAG}"}}],
            metadata={"note": f"meta{TAG}"},
        ),
    )
    await say(
        DANA2,
        ConversationMessage(
            role="tool", content=f"found {TAG}", name=f"tool{TAG}", tool_call_id=f"call{TAG}"
        ),
    )
    await say(DANA2, ConversationMessage(role="user", content=f"thanks {TAG}"))
    await manager.update(DANA2, {"note": f"state{TAG}"}, ttl_seconds=3600)
    await summarise(database, DANA2)  # her own rolling summary and its bookkeeping
    await manager.save(
        DANA2,
        Memory(
            id=f"id{TAG}",
            content=f"Dana keeps fact{TAG}",
            context=f"ctx{TAG}",
            entity_ids=[f"ent{TAG}"],
            metadata={"m": f"meta{TAG}"},
        ),
        embedding=[1.0, 0.0, 0.0],
        model_id=f"model{TAG}",
    )
    await manager.save(DANA2, Memory(content=f"Dana's project note {TAG}", scope="project"))
    run_note = await manager.save(
        DANA2,
        Memory(content=f"Dana's run note {TAG}", scope="run", source_message_ids=[f"ext{TAG}"]),
    )
    # recall hits of her memories (importance decay's counts), under their owner keys
    await PostgresLongTermStore(database).record_hits(DANA2, [f"id{TAG}", run_note.memory.id or ""])
    # session s1: a turn, and what others derived from it in wider scopes
    turn = await say(DANA, ConversationMessage(role="user", content=f"I moved to city{TAG}"))
    await manager.save(
        DANA,
        Memory(
            content=f"Someone in the company moved to city{TAG}",
            scope=MemoryScope.GLOBAL,
            source_message_ids=[str(turn.id)],
        ),
    )
    await manager.save(
        DANA,
        Memory(content=f"A tenant note from chat {TAG}", scope="tenant", source_session_id="s1"),
    )
    await manager.save(
        BOT,
        Memory(content=f"Agent's project note {TAG}", scope="project", source_session_id="s1"),
    )
    # Erin: her own s1 and what was derived from it stay
    await say(ERIN, ConversationMessage(role="user", content="Erin's own turn in s1"))
    await manager.save(
        ERIN,
        Memory(content="Erin's note derived from her s1", scope="project", source_session_id="s1"),
    )
    await manager.save(
        ERIN,
        Memory(content="Erin's tenant note from her s1", scope="tenant", source_session_id="s1"),
    )
    # a project fact of Erin's that Dana superseded
    prior = await manager.save(ERIN, Memory(content="The release is on Monday", scope="project"))
    store = manager.long_term
    assert isinstance(store, PostgresLongTermStore)
    successor = await store.supersede(
        DANA,
        str(prior.memory.id),
        Memory(content=f"The release is on Friday {TAG}", scope="project"),
    )
    assert successor is not None and successor.created
    # Dana's answers in Erin's support session, folded into Erin's rolling summary
    for i in range(3):
        await say(ERIN_SUPPORT, ConversationMessage(role="user", content=f"Erin asks {i}"))
        await say(DANA_IN_ERINS, ConversationMessage(role="assistant", content=f"sup{TAG} {i}"))
    await summarise(database, ERIN_SUPPORT)
    summary = await store.load_summary(ERIN_SUPPORT)
    assert summary is not None and TAG in summary.content
    # jobs queued for Dana (their arguments, lock and queueing lock name her) and Erin
    for owner in (DANA2, ERIN):
        queue_job(fresh_db, owner)
    return str(prior.memory.id)


def queue_job(db: PgDatabase, owner: MemoryOwner) -> None:
    """A job on the queue for ``owner``, its arguments as the application's jobs carry them."""
    args = {
        "tenant_id": owner.tenant_id,
        "project_id": owner.project_id or "",
        "principal_id": owner.principal_id or "",
        "user_id": owner.user_id or "",
        "session_id": owner.session_id or "",
        "run_id": owner.run_id or "",
        "message_id": 1,
    }
    key = f"{owner.tenant_id}/{owner.user_id}/{owner.session_id}"
    # queued through procrastinate's own enqueue, by the queue's role (what the
    # application queues, harbor_jobs.queue_turn_jobs, fills no queueing lock)
    with psycopg.connect(db.admin_url) as conn:
        [job_ids] = conn.execute(
            "select harbor_jobs.procrastinate_defer_jobs_v1(array[row('harbor', 'harbor.test',"
            " 0, %s, %s, %s, null)::harbor_jobs.procrastinate_job_to_defer_v1])",
            (f"lock:{key}", f"queue:{key}", Jsonb(args)),
        ).fetchone()
    # a failed run of it: the error and the model output that broke it may quote the turn
    with psycopg.connect(db.admin_url) as conn:
        conn.execute(
            "insert into harbor_jobs.job_errors (job_id, attempt, error, raw_output)"
            " values (%s, 0, %s, %s)",
            (job_ids[0], f"ValueError: {key}", f"facts about {key}"),
        )


async def test_erasing_a_user_leaves_no_text_of_theirs_in_any_column(
    database: Database, fresh_db: PgDatabase, dana_role: str
) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    prior_id = await fill(manager, database, fresh_db)
    bind(fresh_db, dana_role, DANA2)
    # an access token (MCP over HTTP) that stands for Dana names her
    await TokenStore(database).create(DANA2, name=f"badge{TAG}")
    with psycopg.connect(fresh_db.superuser_url) as conn:
        every = set(text_columns(conn))
    uncovered = every - set(NOT_PERSONAL) - columns_holding(fresh_db, TAG)
    assert uncovered == set(), f"fill() puts no tagged text in {sorted(uncovered)}"

    receipt = await manager.erase("t1", user_id=DANA_ID)

    assert columns_holding(fresh_db, TAG) == set()
    with psycopg.connect(fresh_db.admin_url) as conn:
        queued = conn.execute(
            "select args ->> 'user_id' from harbor_jobs.procrastinate_jobs"
        ).fetchall()
    assert queued == [("erin",)]  # Erin's job stays
    assert receipt.role_bindings == 1
    # what Erin wrote stays: her turns, her notes derived from her own s1, her summary's
    # session (re-folded from the turns that remain on its next run)
    assert [t.content for t in await manager.recent(ERIN)] == ["Erin's own turn in s1"]
    assert [t.content for t in await manager.recent(ERIN_SUPPORT)] == [
        f"Erin asks {i}" for i in range(3)
    ]
    kept = {m.content for m in await manager.search(ERIN, "Erin's note tenant")}
    assert kept == {"Erin's note derived from her s1", "Erin's tenant note from her s1"}
    # the fact Dana had superseded is current again
    store = manager.long_term
    assert isinstance(store, PostgresLongTermStore)
    reopened = await manager.get(ERIN, prior_id)
    assert reopened is not None
    assert reopened.invalid_at is None and reopened.superseded_by is None
    assert [m.content for m in await manager.search(ERIN, "release")] == [
        "The release is on Monday"
    ]
    await manager.append(ERIN_SUPPORT, ConversationMessage(role="user", content="Erin again"))
    await summarise(database, ERIN_SUPPORT)
    refolded = await store.load_summary(ERIN_SUPPORT)
    assert refolded is not None and TAG not in refolded.content
