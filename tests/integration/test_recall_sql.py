"""harbor.recall() from plain SQL, as the application role under row-level security."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

from tests.conftest import PgDatabase

Conn = psycopg.Connection[Any]
Row = dict[str, Any]


def _literal(v: list[float]) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def _store_views(
    db: PgDatabase, n: int, views_of: Callable[[int], list[list[float]]]
) -> dict[str, list[list[float]]]:
    """n USER memories of u1 in t1, the i-th with the vectors views_of(i) (the second,
    if any, as its context vector); returns the vectors by memory id."""
    views: dict[str, list[list[float]]] = {}
    with psycopg.connect(db.superuser_url, autocommit=True) as su:
        for i in range(n):
            (memory_id,) = su.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
                " values ('t1', 'user', 'u1', %s, md5(%s) || md5(%s)) returning id",
                (f"memory {i}", str(i), f"x{i}"),
            ).fetchone() or ("",)
            views[memory_id] = views_of(i)
            for with_context, v in enumerate(views[memory_id]):
                su.execute(
                    "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                    " embedding, scope, user_id, with_context) values ('t1', %s, 'm384', 384,"
                    " %s::vector, 'user', 'u1', %s)",
                    (memory_id, _literal(v), bool(with_context)),
                )
        # in the HNSW graph (as an owner key of harbor.graph_min_vectors() vectors is),
        # so that a test that lowers the exact-scan limit walks it
        su.execute("update harbor.memory_embeddings set in_graph = true")
        su.execute("analyze harbor.memory_embeddings")
    return views


def _unit(rng: random.Random) -> list[float]:
    """A random 384-dimension unit vector."""
    v = [rng.gauss(0, 1) for _ in range(384)]
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def _hash(n: int) -> str:
    return f"{n:064x}"


def _insert(
    su: Conn,
    n: int,
    content: str,
    *,
    scope: str = "user",
    user: str = "u1",
    session: str = "",
    importance: float = 0.5,
    entities: tuple[str, ...] = (),
    memory_type: str = "fact",
    vector: str | None = None,
    age_hours: float = 0.0,
    content_hash: str | None = None,
    valid: str | None = None,
) -> str:
    row = su.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, session_id, content,"
        " content_hash, importance, entity_ids, memory_type, valid) values ('t1', %s, %s, %s,"
        " %s, %s, %s, %s, %s, coalesce(%s::tstzrange,"
        " tstzrange(now() - make_interval(secs => %s), null))) returning id",
        (
            scope,
            user,
            session,
            content,
            content_hash or _hash(n),
            importance,
            list(entities),
            memory_type,
            valid,
            age_hours * 3600,
        ),
    ).fetchone()
    assert row is not None
    if vector is not None:
        su.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope, user_id, session_id) select tenant_id, id, 'm', 3, %s::vector,"
            " scope, user_id, session_id from harbor.memories where id = %s",
            (vector, row[0]),
        )
    return str(row[0])


def recall(app: Conn, query: str, **kw: Any) -> list[Row]:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    sql = f"select * from harbor.recall(%(q)s{', ' if args else ''}{args})"
    return list(app.execute(sql, {"q": query, **kw}).fetchall())


def test_every_signal_is_visible_and_the_score_follows_the_formula(
    conns: tuple[Conn, Conn],
) -> None:
    su, app = conns
    _insert(
        su,
        1,
        "The deploy pipeline broke on Friday",
        importance=0.9,
        vector="[0,1,0]",
        entities=("deploy", "ci"),
        age_hours=48,
    )
    _insert(
        su,
        2,
        "Alice prefers green tea",
        importance=0.2,
        vector="[1,0,0]",
        memory_type="preference",
        age_hours=1,
    )
    _insert(su, 3, "Friday is the team offsite", importance=0.5, vector="[0.7,0.7,0]")
    rows = recall(
        app,
        "what broke on friday",
        query_embedding="[0,1,0]",
        model_id="m",
        top_k=10,
        anchor_entity_ids=["deploy"],
        wanted_types=["preference"],
        recency_half_life_hours=24.0,
        entity_weight=0.5,
        type_weight=0.25,
        rrf_k=60,
    )
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert len(rows) == 3
    for r in rows:
        # the default leg weights: dense 0.75, lexical 1
        fused = sum(
            w / (60 + rank)
            for w, rank in ((0.75, r["dense_rank"]), (1.0, r["lexical_rank"]))
            if rank
        )
        assert r["relevance"] == pytest.approx(fused)
        assert r["score"] == pytest.approx(
            r["relevance"]
            * (1 + r["recency"])
            * (1 + r["importance"])
            * (1 + r["entity"])
            * (1 + r["type_boost"]),
            rel=1e-6,
        )
    by = {r["content"]: r for r in rows}
    pipeline = by["The deploy pipeline broke on Friday"]
    assert pipeline["dense_rank"] == 1 and pipeline["lexical_rank"] == 1
    assert pipeline["similarity"] == pytest.approx(1.0)
    assert pipeline["recency"] == pytest.approx(0.25, rel=1e-3)  # two half-lives
    assert pipeline["entity"] == pytest.approx(0.5 * 1 / 2)  # one of its two entities
    tea = by["Alice prefers green tea"]
    assert tea["type_boost"] == pytest.approx(0.25)
    assert tea["lexical_rank"] is None and tea["dense_rank"] == 3
    assert rows[0]["content"] == "The deploy pipeline broke on Friday"
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)


def test_lexical_leg_uses_or_semantics(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "Melanie painted a sunrise over the lake")
    _insert(su, 2, "Caroline went to a support group")
    rows = recall(app, "When did Melanie paint a sunrise and what did Caroline research?")
    assert {r["content"] for r in rows} == {
        "Melanie painted a sunrise over the lake",
        "Caroline went to a support group",
    }
    assert rows[0]["content"].startswith("Melanie")  # more (and rarer) terms matched
    assert all(r["dense_rank"] is None for r in rows)


def test_memories_too_large_for_the_lexical_index_are_still_matched(
    conns: tuple[Conn, Conn],
) -> None:
    """The lexical leg reads an owner's rows from a covering index; a row whose
    entry might not fit it (a long text) sits in the second index and is read too."""
    su, app = conns
    words = " ".join(f"w{i}x" for i in range(600))
    _insert(su, 1, f"Melanie painted a sunrise over the lake {words}")
    _insert(su, 2, "Caroline went to a support group")
    fits = dict(
        su.execute(
            "select content like 'Melanie%%', harbor.lexical_entry_fits(tenant_id, project_id,"
            " user_id, session_id, run_id, id, fts, entity_ids) from harbor.memories"
        ).fetchall()
    )
    assert fits == {True: False, False: True}  # one row in each index
    rows = recall(app, "When did Melanie paint a sunrise and what did Caroline research?")
    assert [r["content"][:9] for r in rows] == ["Melanie p", "Caroline "]
    assert [r["lexical_rank"] for r in rows] == [1, 2]


def test_exact_dense_scan_reads_vectors_from_both_owner_indexes(fresh_db: PgDatabase) -> None:
    """384-dimension vectors are read from the index that holds them; a vector whose
    entry would be too large there (a long memory id) is in the second index, and the
    exact scan ranks both together."""
    rng = random.Random(21)
    vectors: dict[str, list[float]] = {}
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        for i in range(120):
            memory_id = f"m{i}-" + ("x" * 900 if i % 3 == 0 else "")
            vectors[memory_id] = _unit(rng)
            su.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, content, content_hash)"
                " values ('t1', %s, 'user', 'u1', %s, md5(%s) || md5(%s))",
                (memory_id, f"memory {i}", str(i), f"y{i}"),
            )
            su.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id) values ('t1', %s, 'm384', 384, %s::vector, 'user',"
                " 'u1')",
                (memory_id, _literal(vectors[memory_id])),
            )
        su.execute("analyze harbor.memory_embeddings")
        split = su.execute(
            "select harbor.vector_owner_entry_fits(dims, tenant_id, model_id, project_id,"
            " user_id, session_id, run_id, memory_id), count(*) from harbor.memory_embeddings"
            " group by 1"
        ).fetchall()
        assert sorted(split) == [(False, 40), (True, 80)]
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        for _ in range(3):
            q = _unit(rng)
            similarity = {
                m: sum(a * b for a, b in zip(q, v, strict=True)) for m, v in vectors.items()
            }
            expected = sorted(similarity, key=lambda m: -similarity[m])[:30]
            got = app.execute(
                "select memory_id from harbor._dense_candidates(%s::vector, 'm384', '{user}',"
                " now(), 30) order by dense_rank",
                (_literal(q),),
            ).fetchall()
            assert [r[0] for r in got] == expected


def test_every_scope_has_its_own_owner_key(fresh_db: PgDatabase) -> None:
    """The covering vector index is keyed on harbor.vector_owner_key(), which spells
    each scope as one letter. A scope without a letter would key its rows as NULL,
    and the exact scan would never find them: a new scope needs its letter there
    (and a migration that rebuilds the index)."""
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        keys = su.execute(
            "select s::text, harbor.vector_owner_key('t', 'm', s, 'u', '', '', '')"
            " from unnest(enum_range(null::harbor.memory_scope)) s"
        ).fetchall()
        assert len(keys) >= 6
        assert all(key is not None for _scope, key in keys), keys
        assert len({key for _scope, key in keys}) == len(keys)
        # the fields are length-prefixed: moving bytes between fields changes the key
        a, b = su.execute(
            "select harbor.vector_owner_key('ab', 'c', 'user', 'd', '', '', ''),"
            " harbor.vector_owner_key('a', 'bc', 'user', 'd', '', '', '')"
        ).fetchone()
        assert a != b


def test_the_largest_entry_the_covering_vector_index_admits_fits_it(
    fresh_db: PgDatabase,
) -> None:
    """The covering vector index holds the owner key and the owner fields, so its
    predicate counts the fields twice. At its bound (twice the fields plus the
    memory id at 900 bytes, with long fields whose headers and length prefixes are
    the largest) the entry is still accepted; one byte more goes to the narrow
    index. The exact scan reads both, for the owner those long ids name."""
    tenant, model, user, session = "T" * 130, "M" * 130, "U" * 130, "S" * 59
    rng = random.Random(5)
    vectors = {"ab": _unit(rng), "abc": _unit(rng)}
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        for memory_id, vector in vectors.items():
            su.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, session_id, content,"
                " content_hash) values (%s, %s, 'session', %s, %s, 'long ids', md5(%s) || md5(%s))",
                (tenant, memory_id, user, session, memory_id, memory_id + "x"),
            )
            su.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id, session_id)"
                " values (%s, %s, %s, 384, %s::vector, 'session', %s, %s)",
                (tenant, memory_id, model, _literal(vector), user, session),
            )
        fits = dict(
            su.execute(
                "select memory_id, harbor.vector_owner_entry_fits(dims, tenant_id, model_id,"
                " project_id, user_id, session_id, run_id, memory_id)"
                " from harbor.memory_embeddings"
            ).fetchall()
        )
        assert fits == {"ab": True, "abc": False}
        # other owners' vectors in the same index (3,000, so that the planner
        # searches it by key rather than reading it through), which the key skips
        su.execute(
            "insert into harbor.memories (tenant_id, id, scope, user_id, content, content_hash)"
            " select 't2', 'o' || i, 'user', 'u' || (i % 30), 'other',"
            "        md5(i::text) || md5(i::text || 'x') from generate_series(1, 3000) i"
        )
        su.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope, user_id)"
            " select 't2', 'o' || i, %s, 384, %s::vector, 'user', 'u' || (i %% 30)"
            " from generate_series(1, 3000) i",
            (model, _literal(_unit(rng))),
        )
        su.execute("analyze harbor.memories, harbor.memory_embeddings")
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute(
            "select harbor.set_identity(%s, principal_id => %s, session_id => %s)",
            (tenant, user, session),
        )
        with app.transaction():
            got = app.execute(
                "select memory_id from harbor._dense_candidates(%s::vector, %s, '{session}',"
                " now(), 5) order by dense_rank",
                (_literal(vectors["abc"]), model),
            ).fetchall()
            # this transaction's own index statistics: each index gave up only the
            # owner's entry, so the key index was searched by key, not read through
            read = dict(
                app.execute(
                    "select c.relname, pg_stat_get_xact_tuples_returned(c.oid) from pg_index i"
                    " join pg_class c on c.oid = i.indexrelid"
                    " where i.indrelid = 'harbor.memory_embeddings'::regclass"
                ).fetchall()
            )
        assert [r[0] for r in got] == ["abc", "ab"]
        assert read["memory_embeddings_owner_vectors_idx"] == 1
        assert read["memory_embeddings_owner_vectors_rest_idx"] == 1


def test_entity_and_type_boosts_only_rerank(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    for i in range(6):
        _insert(
            su,
            i,
            f"note {i} about the budget",
            entities=(f"e{i}",),
            memory_type="decision" if i % 2 else "fact",
        )
    plain = recall(app, "budget", top_k=20, entity_weight=0, type_weight=0)
    boosted = recall(
        app,
        "budget",
        top_k=20,
        anchor_entity_ids=["e5", "nothing"],
        wanted_types=["decision"],
        entity_weight=2.0,
        type_weight=2.0,
    )
    assert {r["id"] for r in plain} == {r["id"] for r in boosted}
    assert boosted[0]["content"] == "note 5 about the budget"
    assert all(r["entity"] >= 0 and r["type_boost"] >= 0 for r in boosted)
    no_anchor = recall(app, "budget", top_k=20, anchor_entity_ids=[], entity_weight=2.0)
    assert all(r["entity"] == 0 for r in no_anchor)


def test_duplicates_by_content_hash_keep_the_best_and_ties_go_narrow(
    conns: tuple[Conn, Conn],
) -> None:
    su, app = conns
    same = _hash(99)
    _insert(su, 1, "Standup moved to ten", scope="user", content_hash=same)
    narrow = _insert(
        su, 2, "Standup moved to ten", scope="session", session="s1", content_hash=same
    )
    rows = recall(app, "standup", scopes="{user,session}")
    assert [r["id"] for r in rows] == [narrow]
    assert rows[0]["scope"] == "session"


def test_top_k_then_token_budget_cut_a_prefix(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "alpha " + "word " * 40, importance=0.9)  # long, ranked first
    _insert(su, 2, "alpha short", importance=0.5)
    _insert(su, 3, "alpha tiny", importance=0.1)
    full = recall(app, "alpha", top_k=3)
    assert [r["content"].split()[1] for r in full] == ["word", "short", "tiny"]
    # the first memory alone exceeds the budget: nothing, not the later short ones
    assert recall(app, "alpha", top_k=3, token_budget=full[0]["tokens"] - 1) == []
    cut = recall(app, "alpha", top_k=3, token_budget=full[0]["tokens"] + full[1]["tokens"])
    assert [r["id"] for r in cut] == [r["id"] for r in full[:2]]
    assert [r["id"] for r in recall(app, "alpha", top_k=2)] == [r["id"] for r in full[:2]]


def test_as_of_returns_what_was_believed_then(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "Alice lives in Berlin", valid="[2026-01-01 00:00+00, 2026-06-01 00:00+00)")
    _insert(su, 2, "Alice lives in Lisbon", valid="[2026-06-01 00:00+00,)")
    before = recall(app, "where does alice live", as_of="2026-03-01 00:00+00")
    after = recall(app, "where does alice live")
    assert [r["content"] for r in before] == ["Alice lives in Berlin"]
    assert [r["content"] for r in after] == ["Alice lives in Lisbon"]
    assert before[0]["invalid_at"] is not None


def test_summaries_are_never_recalled(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(
        su,
        1,
        "Summary: we discussed the budget",
        memory_type="summary",
        scope="session",
        session="s1",
        vector="[1,0,0]",
    )
    _insert(su, 2, "The budget is approved", vector="[0,1,0]")
    rows = recall(app, "budget", query_embedding="[1,0,0]", model_id="m", scopes="{session,user}")
    assert [r["content"] for r in rows] == ["The budget is approved"]


def test_min_similarity_drops_weak_dense_matches(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "close", vector="[1,0,0]")
    _insert(su, 2, "far", vector="[0,1,0]")
    _insert(su, 3, "halfway", vector="[1,1,0]")
    rows = recall(app, "", query_embedding="[1,0,0]", model_id="m", min_similarity=0.5)
    assert [r["content"] for r in rows] == ["close", "halfway"]
    assert all(r["similarity"] >= 0.5 for r in rows)
    # vectors of another model are never compared
    assert recall(app, "", query_embedding="[1,0,0]", model_id="other") == []


def test_each_leg_hands_max_2x_top_k_or_50_candidates_by_default(
    conns: tuple[Conn, Conn],
) -> None:
    """Dense ranks past the leg's depth bring no credit: max(2 x top_k, 50) by
    default, `candidates` to go deeper. Four memories match the word; their
    vectors are the 50th, 51st, 60th and 61st nearest of 70."""
    su, app = conns
    deep = {49: "zebra fifty", 50: "zebra fifty-one", 59: "zebra sixty", 60: "zebra sixty-one"}
    for i in range(70):
        angle = i * 0.01
        vector = f"[{math.cos(angle)},{math.sin(angle)},0]"
        _insert(su, i, deep.get(i, f"memory {i}"), vector=vector)

    def dense_ranks(**kw: Any) -> dict[str, int | None]:
        rows = recall(app, "zebra", query_embedding="[1,0,0]", model_id="m", **kw)
        return {r["content"]: r["dense_rank"] for r in rows if r["content"] in deep.values()}

    # top_k 10: the floor of 50 candidates
    assert dense_ranks(top_k=10) == {
        "zebra fifty": 50,
        "zebra fifty-one": None,
        "zebra sixty": None,
        "zebra sixty-one": None,
    }
    # top_k 30: 2 x 30 = 60 candidates
    assert dense_ranks(top_k=30) == {
        "zebra fifty": 50,
        "zebra fifty-one": 51,
        "zebra sixty": 60,
        "zebra sixty-one": None,
    }
    assert dense_ranks(top_k=10, candidates=70)["zebra sixty-one"] == 61


def test_substring_fallback_has_flat_relevance(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "Deploys go through the pipeline", importance=0.2)
    _insert(su, 2, "Pipeline owners rotate weekly", importance=0.8)
    rows = recall(app, "pipel")  # no lexeme matches a partial word
    assert [r["content"] for r in rows] == [
        "Pipeline owners rotate weekly",
        "Deploys go through the pipeline",
    ]
    # a first-ranked match's relevance at the default rrf_k 5
    assert all(r["substring_match"] and r["relevance"] == pytest.approx(1 / 6) for r in rows)


def test_scopes_narrow_what_is_read(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "user level budget")
    _insert(su, 2, "session level budget", scope="session", session="s1")
    _insert(su, 3, "other session budget", scope="session", session="s2")
    _insert(su, 4, "other user budget", user="u2")
    assert {r["content"] for r in recall(app, "budget", scopes="{session}")} == {
        "session level budget"
    }
    assert {r["content"] for r in recall(app, "budget", scopes="{user,session}")} == {
        "user level budget",
        "session level budget",
    }


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"top_k": -1}, "top_k"),
        ({"rrf_k": 0}, "rrf_k"),
        ({"recency_half_life_hours": 0.0}, "recency_half_life_hours"),
        ({"entity_weight": -1.0}, "weights"),
        ({"token_budget": -5}, "token_budget"),
    ],
)
def test_bad_arguments_raise_a_named_error(
    conns: tuple[Conn, Conn], kw: dict[str, Any], message: str
) -> None:
    _su, app = conns
    with pytest.raises(errors.InvalidParameterValue, match=message):
        recall(app, "anything", **kw)


def test_degenerate_queries_return_nothing(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    _insert(su, 1, "something stored")
    assert recall(app, "") == []
    assert recall(app, "   \n\t") == []
    assert recall(app, "stored", top_k=0) == []
    assert recall(app, "stored", scopes="{}") == []
    huge = "stored " + "x" * 100_000
    assert [r["content"] for r in recall(app, huge)] == ["something stored"]


def test_dense_index_path_matches_an_exact_scan(fresh_db: PgDatabase) -> None:
    """Above the exact-scan limit the HNSW walk returns (almost) the exact top rows."""
    rng = random.Random(5)
    centres = [[rng.gauss(0, 1) for _ in range(384)] for _ in range(20)]

    def vec() -> str:
        c = rng.choice(centres)
        v = [x + rng.gauss(0, 0.6) for x in c]
        norm = math.sqrt(sum(x * x for x in v))
        return "[" + ",".join(f"{x / norm:.5f}" for x in v) + "]"

    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        for tenant, count in (("t1", 1500), ("t2", 1500)):
            with su.cursor() as cur:
                cur.executemany(
                    "with m as (insert into harbor.memories (tenant_id, scope, user_id, content,"
                    " content_hash) values (%s, 'user', 'u1', %s, md5(%s) || md5(%s))"
                    " returning tenant_id, id, scope, user_id)"
                    " insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                    " embedding, scope, user_id) select tenant_id, id, 'm384', 384, %s::vector,"
                    " scope, user_id from m",
                    [
                        (tenant, f"{tenant} memory {i}", f"{tenant}{i}", f"{i}{tenant}", vec())
                        for i in range(count)
                    ],
                )
        # in the graph, as a key of harbor.graph_min_vectors() vectors is (the limit
        # below is lowered to 100 so that the walk runs over a few thousand rows)
        su.execute("update harbor.memory_embeddings set in_graph = true")
        su.execute("analyze harbor.memory_embeddings")
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        for _ in range(5):
            probe = vec()
            sql = (
                "select memory_id from harbor._dense_candidates(%s::vector, 'm384', '{user}',"
                " now(), 25, %s) order by dense_rank"
            )
            exact = [r[0] for r in app.execute(sql, (probe, 5000)).fetchall()]
            walked = [r[0] for r in app.execute(sql, (probe, 100)).fetchall()]
            assert len(exact) == len(walked) == 25
            assert len(set(exact) & set(walked)) >= 23
            # a memory count that understates the owner's rows only chooses the
            # path: the exact scan, whatever the limit, never other rows
            hinted = app.execute(
                sql.replace("%s) order", "%s, p_owner_rows => 10) order"), (probe, 100)
            ).fetchall()
            assert [r[0] for r in hinted] == exact
            owners = app.execute(
                "select distinct tenant_id from harbor.memories where id = any(%s)", (walked,)
            ).fetchall()
            assert owners == [("t1",)]


@pytest.mark.parametrize("owner_rows", [None, 400])
def test_exact_dense_path_looks_past_a_window_crowded_by_superseded_memories(
    fresh_db: PgDatabase, owner_rows: int | None
) -> None:
    """The exact scan first probes only the nearest vectors (2 x limit + 64 of them);
    when superseded memories fill that window it scans every vector of the caller
    again, so the result is still the nearest valid memories. The same with the
    owner's memory count given (as recall() passes the lexical leg's), when the
    vectors are not counted."""
    rng = random.Random(13)
    views = _store_views(fresh_db, 400, lambda i: [_unit(rng)])
    q = _unit(rng)
    similarity = {
        mid: sum(a * b for a, b in zip(q, vs[0], strict=True)) for mid, vs in views.items()
    }
    by_distance = sorted(similarity, key=lambda m: -similarity[m])
    sql = (
        "select memory_id from harbor._dense_candidates(%s::vector, 'm384', '{user}', now(),"
        f" 25, 5000, {'null' if owner_rows is None else owner_rows}) order by dense_rank"
    )
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        assert [r[0] for r in app.execute(sql, (_literal(q),)).fetchall()] == by_distance[:25]
        # part of the window, more than all of it, then all but ten (fewer than asked)
        for closed in (60, 300, 390):
            with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
                su.execute(
                    "update harbor.memories set valid = tstzrange(lower(valid), now())"
                    " where id = any(%s) and upper_inf(valid)",
                    (by_distance[:closed],),
                )
            got = [r[0] for r in app.execute(sql, (_literal(q),)).fetchall()]
            assert got == by_distance[closed : closed + 25]


def test_two_vectors_of_one_memory_count_once_at_the_nearer_on_both_paths(
    fresh_db: PgDatabase,
) -> None:
    """A memory with a context has two vectors; the exact scan and the HNSW walk both
    return it once, at the similarity of its nearer vector."""
    rng = random.Random(9)
    views = _store_views(
        fresh_db, 600, lambda i: [_unit(rng)] + ([_unit(rng)] if i % 2 == 0 else [])
    )
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        for _ in range(5):
            q = _unit(rng)
            nearest = {
                mid: max(sum(a * b for a, b in zip(q, v, strict=True)) for v in vs)
                for mid, vs in views.items()
            }
            expected = sorted(nearest, key=lambda m: -nearest[m])[:25]
            sql = (
                "select memory_id, similarity from harbor._dense_candidates(%s::vector, 'm384',"
                " '{user}', now(), 25, %s) order by dense_rank"
            )
            for exact_limit in (5000, 100):  # exact scan, then the HNSW walk
                got = app.execute(sql, (_literal(q), exact_limit)).fetchall()
                ids = [r[0] for r in got]
                assert len(ids) == len(set(ids)) == 25
                for memory_id, similarity in got:
                    assert similarity == pytest.approx(nearest[memory_id], abs=1e-4)
                assert len(set(ids) & set(expected)) >= (25 if exact_limit == 5000 else 23)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a",
        "abcd",
        "abcde",
        "Standup moved to ten",
        "naïve café",
        "東京で会議",
        "mix 東京 and ascii 🙂",
    ],
)
def test_sql_token_estimate_matches_python(conns: tuple[Conn, Conn], text: str) -> None:
    from harbor_pg.tokens import approximate_tokens

    _su, app = conns
    row = app.execute("select harbor.approximate_tokens(%s) as n", (text,)).fetchone()
    assert row is not None
    assert row["n"] == approximate_tokens(text)


def test_bm25_scores_match_a_reference_computation(conns: tuple[Conn, Conn]) -> None:
    """harbor._bm25 (k1 1.2, b 0.75) against BM25 computed here from each document's
    lexemes and positions: repeated terms, documents of different lengths, and terms
    only some documents hold."""
    _su, app = conns
    texts = [
        "Melanie painted a sunrise over the lake, then painted the lake again",
        "The lake trip was cancelled",
        "Caroline went to a support group meeting about painting",
        "Painting, painting and more painting: the sunrise series grows",
        "Nothing in common here",
    ]
    query = "when did melanie paint the lake at sunrise"
    terms = app.execute(
        "select tsvector_to_array(to_tsvector('english', %s)) as t", (query,)
    ).fetchone()["t"]
    docs = []
    for text in texts:
        lexemes = {
            r["lexeme"]: r["n"]
            for r in app.execute(
                "select lexeme, cardinality(positions) as n"
                " from unnest(to_tsvector('english', %s))",
                (text,),
            ).fetchall()
        }
        docs.append(lexemes)
    matched = [i for i, d in enumerate(docs) if set(d) & set(terms)]
    total = 40.0
    avgdl = max(sum(len(docs[i]) for i in matched) / len(matched), 1)
    df = {t: sum(1 for i in matched if t in docs[i]) for t in terms}
    expected = {}
    for i in matched:
        dl = max(len(docs[i]), 1)
        expected[f"m{i}"] = sum(
            math.log(1 + (max(total, df[t]) - df[t] + 0.5) / (df[t] + 0.5))
            * docs[i][t]
            * 2.2
            / (docs[i][t] + 1.2 * (0.25 + 0.75 * dl / avgdl))
            for t in terms
            if t in docs[i]
        )
    rows = app.execute(
        "select memory_id, lexical_rank, lexical_score from harbor._bm25(%s, %s, 10,"
        " %s, %s, array(select to_tsvector('english', t) from unnest(%s::text[]) t))",
        (
            terms,
            total,
            ["t1"] * len(matched),
            [f"m{i}" for i in matched],
            [texts[i] for i in matched],
        ),
    ).fetchall()
    assert {r["memory_id"]: r["lexical_score"] for r in rows} == pytest.approx(expected)
    ranked = sorted(expected, key=lambda m: -expected[m])
    assert [r["memory_id"] for r in rows] == ranked
    assert [r["lexical_rank"] for r in rows] == list(range(1, len(ranked) + 1))


_LINE_CASES = [
    "Standup moved to ten",
    "  padded with spaces  ",
    "two  spaces",
    "tab\there",
    "new\nline and\r\nwindows",
    "form\ffeed and \x0b vertical tab",
    "trailing tab\t",
    "x",
    "abcdefghijklmnopqrstuvwxyz",
    "naïve café",
    "東京で会議",
    "mix 東京  and\tascii 🙂",
    "em\u2003space",
    "naïve  café",
    "café\tbar",
    "  東京  大阪  ",
    "中文 文本 和 English words",
    " leading space, naïve",
    "bell\x07 and delete\x7f, no white space among them",
    "tilde~ and caret^ at the printable edge",
]


@pytest.mark.parametrize("content", _LINE_CASES)
def test_recall_line_tokens_match_the_collapsed_rendering(
    conns: tuple[Conn, Conn], content: str
) -> None:
    """The regex-free fast path gives what collapsing with regexp_replace gives, and
    (for the whitespace Python and PostgreSQL agree on) what Python renders."""
    from harbor_pg.tokens import approximate_tokens

    _su, app = conns
    digest = "0123456789abcdef" * 4
    row = app.execute(
        "select harbor.recall_line_tokens(%(h)s, %(c)s) as fast,"
        " harbor.approximate_tokens('[' || left(%(h)s, 12) || '] '"
        " || regexp_replace(btrim(%(c)s), '\\s+', ' ', 'g')) as slow",
        {"h": digest, "c": content},
    ).fetchone()
    assert row is not None
    assert row["fast"] == row["slow"]
    if content.isascii():
        assert row["fast"] == approximate_tokens(f"[{digest[:12]}] {' '.join(content.split())}")


def test_hydration_probes_each_candidate_by_key_not_the_owners_rows(fresh_db: PgDatabase) -> None:
    """Rows read for one recall stay near the candidate count, not candidates x owner rows.

    On a skewed table (one owner holding half of 100,000 rows), a plan that probed
    each candidate through the owner-key index (as a join on tenant and id invited)
    read the whole owner once per candidate: 6.3 s at 100,000 rows. Counted with
    the backend's own table statistics, not timed.
    """
    big = 50_000
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        su.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
            " select case when n <= %s then 't1' else 't' || (n %% 500 + 2) end, 'user',"
            " case when n <= %s then 'u1' else 'u' || (n %% 500 + 2) end,"
            " 'shared harbor note ' || n, md5(n::text) || md5((-n)::text)"
            " from generate_series(1, 2 * %s) n",
            (big, big, big),
        )
        # (seeded with the vectors' owner check off: as the superuser, with no policy to
        # give its lookup a tenant, it probes every tenant's part of the key, ~7 ms a
        # row and 11 minutes for these; the rows are consistent by construction)
        su.execute("set session_replication_role = replica")
        su.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope, user_id) select tenant_id, id, 'm', 3,"
            " array[random(), random(), random()]::vector, scope, user_id"
            " from harbor.memories"
        )
        su.execute("reset session_replication_role")
        su.execute("vacuum analyze harbor.memories")
        su.execute("vacuum analyze harbor.memory_embeddings")
    with psycopg.connect(fresh_db.app_url, row_factory=dict_row) as app:
        for _ in range(7):  # past the driver's switch to a prepared statement
            app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
            got = app.execute(
                "select * from harbor.recall('shared harbor note', '[0.5,0.5,0.5]'::vector,"
                " 'm', '{user}', 25)"
            ).fetchall()
            assert len(got) == 25
            read = app.execute(
                "select coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) as n"
                " from pg_stat_xact_user_tables where relid = 'harbor.memories'::regclass"
            ).fetchone()
            app.rollback()  # a fresh transaction: its counters start at zero
            assert read is not None
            # the legs read the owner's matching rows a few times; a probe per
            # candidate over the owner's rows would read about 100 x 50,000
            assert read["n"] < 10 * big, read


def test_lexical_leg_reports_how_many_memories_the_owner_holds(
    conns: tuple[Conn, Conn],
) -> None:
    """Each lexical row carries the owner's memory count (every type and validity,
    other owners not counted); above the scan limit, where the rows are not
    counted, it is null."""
    su, app = conns
    for n in range(5):
        _insert(su, n, f"shared harbor note {n}")
    for n in range(5, 8):
        _insert(su, n, f"unrelated words {n}")
    _insert(su, 8, "shared but superseded", valid="[2020-01-01,2021-01-01)")
    _insert(su, 9, "shared summary", memory_type="summary")
    _insert(su, 10, "shared note of another user", user="u2")
    sql = (
        "select memory_id, owner_rows from harbor._lexical_candidates('shared harbor',"
        " '{user}', now(), 50, %s, %s)"
    )
    # the owner scan; the owner-term lookup (the owner's 10 rows are more than 8, the
    # query's matches fewer)
    for term_limit in (0, 8):
        rows = app.execute(sql, (2000, term_limit)).fetchall()
        assert len(rows) == 5
        assert {r["owner_rows"] for r in rows} == {10}
        # more rows than the scan limit: the GIN path, or the lookup's matches
        rows = app.execute(sql, (3, term_limit)).fetchall()
        assert len(rows) == 5
        assert {r["owner_rows"] for r in rows} == {None}


def test_recall_counts_no_vectors_when_a_word_matched(conns: tuple[Conn, Conn]) -> None:
    """The dense leg counts the caller's vectors to choose the exact scan or the
    graph walk; when a word matched, recall() hands it the lexical leg's count of
    the owner's memories instead, and the vectors are read once, not twice.
    Counted with the backend's own table statistics, not timed. (An owner of more
    than 128 rows: for a smaller one the lexical leg ranks both legs, counting nothing.)"""
    su, app = conns
    for n in range(130):
        _insert(su, n, f"harbor note {n}", vector=f"[{n % 3 + 1},{n % 5 + 1},1]")

    def scans() -> int:
        row = app.execute(
            "select coalesce(seq_scan, 0) + coalesce(idx_scan, 0) as n"
            " from pg_stat_xact_user_tables where relid = 'harbor.memory_embeddings'::regclass"
        ).fetchone()
        assert row is not None
        return int(row["n"])

    def vector_scans(query: str) -> tuple[int, int]:
        before = scans()
        got = recall(app, query, query_embedding="[1,2,1]", model_id="m", scopes="{user}", top_k=25)
        return len(got), scans() - before

    for _ in range(3):  # the same before and after the plans are cached
        matched = vector_scans("harbor note")
        unmatched = vector_scans("zzqx")
        assert matched[0] == unmatched[0] == 25
        # the same dense leg, plus the count's scan when no word matched
        assert unmatched[1] == matched[1] + 1, (matched, unmatched)


def test_few_context_vectors_near_the_query_still_give_top_k_distinct_memories(
    fresh_db: PgDatabase,
) -> None:
    """The exact scan reads the nearest top_k + C vectors (C: the caller's context
    vectors, at most top_k). When the few two-vector memories hold the very nearest
    vectors, both of theirs, the distinct memories must still be the exact top_k."""
    rng = random.Random(21)

    def unit(v: list[float]) -> list[float]:
        norm = math.sqrt(sum(x * x for x in v))
        return [x / norm for x in v]

    q = unit([rng.gauss(0, 1) for _ in range(384)])

    def near(scale: float) -> list[float]:
        return unit([a + rng.gauss(0, scale) for a in q])

    # three memories with a context, both of their vectors nearest of all
    views = _store_views(
        fresh_db, 200, lambda i: [near(0.01), near(0.01)] if i < 3 else [near(0.2 + i / 100)]
    )
    nearest = {
        mid: max(sum(a * b for a, b in zip(q, v, strict=True)) for v in vs)
        for mid, vs in views.items()
    }
    expected = sorted(nearest, key=lambda m: -nearest[m])[:10]
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        got = app.execute(
            "select memory_id from harbor._dense_candidates(%s::vector, 'm384', '{user}',"
            " now(), 10) order by dense_rank, memory_id",
            (_literal(q),),
        ).fetchall()
    assert [r[0] for r in got] == expected


def test_a_candidate_inherits_its_neighbours_relevance_and_a_named_month_lifts_it(
    conns: tuple[Conn, Conn],
) -> None:
    from harbor_pg.records import content_hash

    su, app = conns
    first = "Caroline said we adopted a puppy"
    reply = "Melanie said what a lovely surprise"

    def add(n: int, content: str, context: str | None, valid: str) -> None:
        su.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash,"
            " context, valid) values ('t1', 'user', 'u1', %s, %s, %s, %s::tstzrange)",
            (content, content_hash("user", content), context, valid),
        )

    add(1, first, "Melanie said hello there", "[2023-05-08,)")
    add(2, reply, first, "[2023-05-08,)")  # follows the first: its context is that text
    add(3, "Caroline said the puppy sleeps a lot", None, "[2023-06-20,)")
    rows = {r["content"]: r for r in recall(app, "puppy surprise", top_k=10)}
    assert set(rows) == {first, reply, "Caroline said the puppy sleeps a lot"}

    def fused(r: Row) -> float:
        return 1.0 / (5 + r["lexical_rank"])

    # each of the pair inherits 0.75 x the other's fused relevance; the third has no neighbour
    assert rows[first]["neighbour"] == pytest.approx(fused(rows[reply]))
    assert rows[reply]["neighbour"] == pytest.approx(fused(rows[first]))
    lone = rows["Caroline said the puppy sleeps a lot"]
    assert lone["neighbour"] == 0 and lone["relevance"] == pytest.approx(fused(lone))
    for text in (first, reply):
        r = rows[text]
        assert r["relevance"] == pytest.approx(fused(r) + 0.75 * r["neighbour"])
    off = {r["content"]: r for r in recall(app, "puppy surprise", top_k=10, neighbour_weight=0.0)}
    assert all(r["neighbour"] == 0 for r in off.values())
    assert off[first]["relevance"] == pytest.approx(fused(off[first]))

    # a named month (and year) marks the memories valid then: relevance x (1 + 2)
    dated = {r["content"]: r for r in recall(app, "the puppy in June 2023", top_k=10)}
    assert dated[lone["content"]]["date_match"] == 1
    assert dated[first]["date_match"] == 0
    assert dated[lone["content"]]["relevance"] == pytest.approx(3 * fused(dated[lone["content"]]))
    assert all(r["date_match"] == 0 for r in recall(app, "the puppy in June 2022", top_k=10))
    assert all(r["date_match"] == 0 for r in recall(app, "the puppy in june", top_k=10))
    with pytest.raises(errors.InvalidParameterValue, match="date_weight"):
        recall(app, "puppy", date_weight=-1.0)


def test_a_context_links_to_its_turn_in_the_dedup_normal_form_whatever_its_whitespace(
    conns: tuple[Conn, Conn],
) -> None:
    """A context is hashed as content (whitespace runs collapsed, trimmed, lower case)
    before it is compared with the candidates' content hashes: printable ASCII with no
    run of spaces skips the regular expression, every other text (a control character
    too) goes through it, both link."""
    from harbor_pg.records import content_hash

    su, app = conns
    pairs = [
        # (earlier turn, the later turn's context as written)
        ("Caroline said the kayak is red", "Caroline said the kayak is red"),
        ("Melanie said the kayak leaks", "  MELANIE said\tthe kayak   leaks\n"),
        ("Zoë said the kayak café", "zoë said  the KAYAK café"),
        ("Zoë said the kayak is mine", "Zoë said the kayak is mine "),
        ("Jon said the kayak floats", "Jon said the kayak\x0bfloats"),
        ("Ann said the kayak\x07bell rings", "ann said the kayak\x07bell rings"),
    ]
    for n, (turn, context) in enumerate(pairs):
        for content, ctx in ((turn, None), (f"reply {n} about the kayak", context)):
            su.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash,"
                " context) values ('t1', 'user', 'u1', %s, %s, %s)",
                (content, content_hash("user", content), ctx),
            )
    rows = {r["content"]: r for r in recall(app, "kayak", top_k=20)}
    assert len(rows) == 2 * len(pairs)
    for n, (turn, _context) in enumerate(pairs):
        reply = rows[f"reply {n} about the kayak"]
        fused = 1.0 / (5 + rows[turn]["lexical_rank"])
        assert reply["neighbour"] == pytest.approx(fused), turn
        assert rows[turn]["neighbour"] == pytest.approx(1.0 / (5 + reply["lexical_rank"])), turn
