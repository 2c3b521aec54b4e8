"""A small owner's recall: both legs from one read of its rows.

Handed the query's vector and model, harbor._lexical_candidates() ranks an owner of at
most p_merge_limit (128) rows for both legs in one statement, and says so with a row
whose memory_id is null; harbor.recall() then does not run the dense leg
(harbor._dense_candidates). These tests hold the two ways to the same answers, rank
for rank and score for score, over owners with every kind of row a leg must leave out
(other owners, superseded, expired, summaries, excluded types, rows above the
sensitivity ceiling), of up to 32 rows (which the lexical leg apart reads whole) and
above (which it looks up by term, or for a question holding a word of nearly every
row, reads by its rarer terms), and show where the single read stops.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from psycopg import conninfo
from psycopg.rows import dict_row

from tests.conftest import PgDatabase

Conn = psycopg.Connection[Any]

WORDS = [
    "harbor",
    "crane",
    "deploy",
    "pipeline",
    "friday",
    "caroline",
    "melanie",
    "painting",
    "camping",
    "lake",
    "support",
    "group",
    "adoption",
    "career",
    "counselling",
    "music",
    "concert",
    "sunrise",
    "beach",
    "pottery",
    "workshop",
    "kids",
    "school",
    "running",
    "marathon",
    "book",
    "club",
]

QUERIES = [
    "harbor crane",
    "When did Caroline go to the support group?",
    "What did Melanie paint after the camping trip to the lake?",
    "pottery workshop kids",
    "marathon",
    "zzqx nothing matches",
    "the and of",  # only stop words: no lexeme
    "",
]

LEG_COLUMNS = (
    "scope",
    "memory_type",
    "importance",
    "valid_from",
    "content_hash",
    "entity_ids",
    "context_hash",
)


def _by_memory(
    rows: list[dict[str, Any]], rank: str, score: str, *, ranked_only: bool = False
) -> dict[str, tuple[Any, Any, list[Any]]]:
    """Each row's rank, score and ranking columns by memory id (``ranked_only``: the rows
    that leg ranked, of the single read's rows, which carry both legs' columns)."""
    return {
        r["memory_id"]: (r[rank], r[score], [r[c] for c in LEG_COLUMNS])
        for r in rows
        if not ranked_only or r[rank] is not None
    }


def _vector(rng: random.Random) -> str:
    return "[" + ",".join(f"{rng.uniform(-1, 1):.4f}" for _ in range(3)) + "]"


def _owner(
    su: Conn, rng: random.Random, rows: int, *, user: str = "u1", common: str | None = None
) -> None:
    """``rows`` memories under the caller's user and session keys, with every kind
    of row the legs leave out, plus rows of another user and another session;
    ``common``: a word in about 95% of them (a speaker's name in a conversation)."""
    hashes: set[tuple[str, str]] = set()  # (scope, text hashed): one current copy a key
    for n in range(rows):
        # (one rolling summary a key: the session's, as the last row)
        summary = n == rows - 1
        scope, session = (
            ("session", "s1")
            if summary
            else rng.choice([("user", ""), ("user", ""), ("session", "s1")])
        )
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        if common is not None and rng.random() < 0.95:
            text = f"{common} {text}"
        kind = rng.random()
        valid = (
            "[2026-01-01,2026-02-01)"
            if kind < 0.1  # superseded long ago
            else "[2025-06-01,)"
            if kind < 0.2  # valid from before the as-of below
            else None
        )
        memory_type = (
            "summary" if summary else rng.choice(["fact", "fact", "episode", "preference"])
        )
        sensitivity = rng.choice(["none", "none", "none", "low", "pii", "sensitive"])
        expires = "2026-03-01" if rng.random() < 0.08 else None
        context = rng.choice([None, None, "earlier " + rng.choice(WORDS)])
        # a few copies of one text under the user and the session key (dedup's case)
        content_hash = f"copy{rng.randint(0, 2)}" if rng.random() < 0.15 else None
        if content_hash is None or (scope, content_hash) in hashes:
            content_hash = None
        hashes.add((scope, content_hash or ""))
        row = su.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, session_id, content,"
            " content_hash, importance, memory_type, sensitivity, valid, expires_at,"
            " context, entity_ids) values ('t1', %s, %s, %s, %s,"
            " encode(sha256(convert_to(coalesce(%s, %s || %s), 'UTF8')), 'hex'), %s, %s, %s,"
            " coalesce(%s::tstzrange, tstzrange(now() - make_interval(hours => %s), null)),"
            " %s, %s, %s) returning id",
            (
                scope,
                user,
                session,
                text,
                content_hash,
                text,
                str(n),
                round(rng.random(), 2),
                memory_type,
                sensitivity,
                valid,
                rng.randint(1, 500),
                expires,
                context,
                [rng.choice(WORDS)],
            ),
        ).fetchone()
        assert row is not None
        vectors = [False] if rng.random() < 0.85 else []  # a few have none
        if vectors and context is not None:
            vectors.append(True)  # the context's vector beside the content's
        for with_context in vectors:
            su.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id, session_id, with_context) select tenant_id, id,"
                " 'm', 3, %s::vector, scope, user_id, session_id, %s from harbor.memories"
                " where id = %s",
                (_vector(rng), with_context, row[0]),
            )


def _others(su: Conn, rng: random.Random) -> None:
    """Rows no caller of t1 / u1 / s1 may see: another user's, another session's."""
    for user, session in (("u2", ""), ("u1", "s2")):
        for _ in range(6):
            text = " ".join(rng.choice(WORDS) for _ in range(6))
            scope = "session" if session else "user"
            row = su.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, session_id, content,"
                " content_hash) values ('t1', %s, %s, %s, %s,"
                " encode(sha256(convert_to(%s, 'UTF8')), 'hex')) returning id",
                (scope, user, session, text, text + user + session),
            ).fetchone()
            assert row is not None
            su.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id, session_id) select tenant_id, id, 'm', 3,"
                " %s::vector, scope, user_id, session_id from harbor.memories where id = %s",
                (_vector(rng), row[0]),
            )


def _call(app: Conn, sql: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return list(app.execute(sql, args).fetchall())


CASES: list[dict[str, Any]] = [
    {"scopes": "{user,session}", "as_of": None, "sens": "sensitive", "excl": "{}", "lim": 50},
    {"scopes": "{user}", "as_of": None, "sens": "none", "excl": "{}", "lim": 50},
    {"scopes": "{session}", "as_of": None, "sens": "pii", "excl": "{episode}", "lim": 50},
    {"scopes": "{user,session}", "as_of": "2026-01-15", "sens": "low", "excl": "{}", "lim": 3},
    {
        "scopes": "{user,session,project,tenant}",
        "as_of": None,
        "sens": "sensitive",
        "excl": "{preference,fact}",
        "lim": 7,
    },
]


def _compare_legs(app: Conn, rng: random.Random, rows: int) -> int:
    """Every query and case: the small owner's candidates are the legs' own. Returns
    how many candidates were compared."""
    compared = 0
    for query in QUERIES:
        for case in CASES:
            args = {
                "q": query,
                "e": _vector(rng),
                "scopes": case["scopes"],
                "as_of": case["as_of"] or "now",
                "lim": case["lim"],
                "sens": case["sens"],
                "excl": case["excl"],
            }
            small = _call(
                app,
                "select * from harbor._lexical_candidates(%(q)s, %(scopes)s,"
                " %(as_of)s::timestamptz, %(lim)s, p_max_sensitivity => %(sens)s,"
                " p_excluded_types => %(excl)s, p_embedding => %(e)s::vector,"
                " p_model_id => 'm')",
                args,
            )
            # the dense leg's candidates are among these: one row says so
            (marker,) = [r for r in small if r["memory_id"] is None]
            assert 0 < marker["owner_rows"] <= rows and marker["dense_rank"] == 0
            small = [r for r in small if r["memory_id"] is not None]
            lexical = _call(
                app,
                "select * from harbor._lexical_candidates(%(q)s, %(scopes)s,"
                " %(as_of)s::timestamptz, %(lim)s, p_max_sensitivity => %(sens)s,"
                " p_excluded_types => %(excl)s)",
                args,
            )
            dense = _call(
                app,
                "select * from harbor._dense_candidates(%(e)s::vector, 'm', %(scopes)s,"
                " %(as_of)s::timestamptz, %(lim)s, p_max_sensitivity => %(sens)s,"
                " p_excluded_types => %(excl)s)",
                args,
            )
            # lexical: the same memories, ranks and scores, with the same columns
            got_lex = _by_memory(small, "lexical_rank", "lexical_score", ranked_only=True)
            want_lex = _by_memory(lexical, "lexical_rank", "lexical_score")
            assert set(got_lex) == set(want_lex), (query, case)
            for memory_id, (rank, score, columns) in want_lex.items():
                assert got_lex[memory_id][0] == rank, (query, case, memory_id)
                assert got_lex[memory_id][1] == pytest.approx(score, rel=1e-12)
                assert got_lex[memory_id][2] == columns
            got_dense = _by_memory(small, "dense_rank", "similarity", ranked_only=True)
            want_dense = _by_memory(dense, "dense_rank", "similarity")
            assert got_dense == want_dense, (query, case)
            compared += len(got_lex) + len(got_dense)
    return compared


@pytest.mark.parametrize(
    ("seed", "rows", "common"),
    [
        (1, 32, None),
        (2, 32, None),
        (3, 32, None),
        (4, 128, None),
        (5, 128, "caroline"),
        (6, 90, "melanie"),
    ],
)
def test_a_small_owners_candidates_are_the_legs_own(
    conns: tuple[Conn, Conn], seed: int, rows: int, common: str | None
) -> None:
    su, app = conns
    rng = random.Random(seed)
    _others(su, rng)
    # the caller's user and session keys hold `rows` between them: 32, the most the
    # lexical leg apart reads whole, and 128, the most read once for both legs; with
    # a word in nearly every row, which the leg apart leaves out of its reads
    _owner(su, rng, rows, common=common)
    assert _compare_legs(app, rng, rows) > 100


def test_the_owner_of_one_row_more_is_left_to_the_dense_leg(conns: tuple[Conn, Conn]) -> None:
    su, app = conns
    rng = random.Random(7)
    _others(su, rng)  # (not counted: another owner's rows)
    _owner(su, rng, 32)
    sql = (
        "select * from harbor._lexical_candidates('harbor crane', '{user,session}', now(), 50,"
        " p_merge_limit => %s, p_embedding => '[1,0,0]'::vector, p_model_id => 'm')"
    )

    def ranked(limit: int) -> tuple[bool, bool]:
        """(whether it said the dense leg's candidates are among its rows, whether any
        row carries them)"""
        rows = _call(app, sql % limit, {})
        return (
            any(r["memory_id"] is None for r in rows),
            any(r["dense_rank"] is not None for r in rows),
        )

    assert ranked(32) == ranked(33) == (True, True)
    assert ranked(31) == (False, False)
    # one row more under the caller's keys (of any type or validity: the collection)
    su.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash,"
        " memory_type, valid) values ('t1', 'user', 'u1', 'harbor', repeat('e', 64), 'summary',"
        " '[2020-01-01,2020-01-02)')"
    )
    assert ranked(32) == (False, False)
    assert ranked(33) == (True, True)
    # a question with no word to match, of an owner too large to read at once: the
    # dense leg's turn, handed the owner's row count
    blank = (
        "select * from harbor._lexical_candidates('the and of', '{user,session}', now(), 50,"
        " p_merge_limit => %s, p_embedding => '[1,0,0]'::vector, p_model_id => 'm')"
    )
    (counted,) = _call(app, blank % 32, {})
    assert counted == {**dict.fromkeys(counted), "owner_rows": 33}
    assert [r["memory_id"] for r in _call(app, blank % 33, {}) if r["dense_rank"] == 0] == [None]
    # without a vector, or without a model: the lexical leg alone
    for args in ("p_embedding => null, p_model_id => 'm'", "p_embedding => '[1,0,0]'"):
        rows = _call(
            app,
            "select * from harbor._lexical_candidates('harbor crane', '{user,session}', now(),"
            f" 50, {args})",
            {},
        )
        assert rows
        assert all(r["memory_id"] is not None and r["dense_rank"] is None for r in rows)


def _recall(conn: Conn, query: str, embedding: str, **kw: Any) -> list[dict[str, Any]]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    rows = conn.execute(
        f"select * from harbor.recall(%(q)s, %(e)s::vector, 'm'{args})",
        {"q": query, "e": embedding, **kw},
    ).fetchall()
    return [dict(r) for r in rows]


@pytest.mark.parametrize(("rows", "common"), [(12, None), (30, None), (120, "caroline")])
def test_recall_answers_the_same_through_either_way(
    conns: tuple[Conn, Conn], fresh_db: PgDatabase, rows: int, common: str | None
) -> None:
    """harbor.recall() for a small owner, and again with the lexical leg replaced (in a
    transaction rolled back) by one that drops the vector it is handed, so that the
    two legs run apart: every column of every answer the same."""
    su, app = conns
    rng = random.Random(11)
    _others(su, rng)
    _owner(su, rng, rows, common=common)
    app_role = conninfo.conninfo_to_dict(fresh_db.app_url)["user"]
    options: list[dict[str, Any]] = [
        {},
        {"scopes": "{user}", "top_k": 3},
        {"fusion": "weighted", "top_k": 25},
        {"min_similarity": 0.2, "top_k": 25, "max_sensitivity": "low"},
        {"token_budget": 40, "anchor_entity_ids": "{harbor}", "wanted_types": "{episode}"},
        {"excluded_types": "{fact}", "as_of": "2026-01-15", "top_k": 25},
    ]
    # (one instant for both ways: recency is measured from it)
    now = app.execute("select now() as t").fetchone()
    assert now is not None
    options = [{"as_of": now["t"], **option} for option in options]
    answers = []
    for query in QUERIES:
        for option in options:
            embedding = _vector(rng)
            answers.append((query, embedding, option, _recall(app, query, embedding, **option)))
    assert sum(1 for *_, got in answers if got) > 30
    with psycopg.connect(fresh_db.superuser_url, row_factory=dict_row) as legs:
        # the lexical leg as recall called it before it was handed the vector
        legs.execute(
            "alter function harbor._lexical_candidates(text, harbor.memory_scope[],"
            " timestamptz, integer, integer, integer, harbor.sensitivity,"
            " harbor.memory_type[], public.vector, text, integer) rename to _lexical_apart"
        )
        legs.execute(
            "create function harbor._lexical_candidates(p_query text,"
            " p_scopes harbor.memory_scope[], p_as_of timestamptz, p_limit integer,"
            " p_scan_limit integer default 2000, p_term_limit integer default 32,"
            " p_max_sensitivity harbor.sensitivity default 'sensitive',"
            " p_excluded_types harbor.memory_type[] default '{}',"
            " p_embedding public.vector default null, p_model_id text default null,"
            " p_merge_limit integer default 128)"
            " returns table (tenant_id text, memory_id text, lexical_rank integer,"
            " lexical_score double precision, scope harbor.memory_scope,"
            " memory_type harbor.memory_type, importance real, valid_from timestamptz,"
            " content_hash text, entity_ids text[], owner_rows integer, context_hash text,"
            " dense_rank integer, similarity double precision)"
            " language sql stable"
            " as $$ select * from harbor._lexical_apart(p_query, p_scopes, p_as_of, p_limit,"
            " p_scan_limit, p_term_limit, p_max_sensitivity, p_excluded_types) $$"
        )
        legs.execute(f'set role "{app_role}"')
        legs.execute("select harbor.set_identity('t1', principal_id => 'u1', session_id => 's1')")
        for query, embedding, option, got in answers:
            assert _recall(legs, query, embedding, **option) == got, (query, option)
        legs.rollback()
