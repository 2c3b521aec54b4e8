"""The lexical leg's lookup in the owner-term index (migration 0008).

harbor._lexical_candidates() first looks the query's lexemes up under the
caller's owner keys and, when that finds at most p_term_limit rows, ranks
those instead of reading every row of the owner. These tests hold the two ways
to the same answers, check which index each way reads (the backend's own
statistics, not timings), and show that an owner hash shared by two owners
costs a read, never a row.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.conftest import PgDatabase

Conn = psycopg.Connection[Any]

# texts that stress the parser: apostrophes, hyphens, backslashes, quotes,
# non-ASCII words, URLs, e-mail addresses, versions, numbers, query syntax
TEXTS = [
    "O'Brien's state-of-the-art harbor crane",
    "The path is C:\\tools\\harbor\\bin and a back\\slash",
    "Café naïve Zürich 東京 harbor",
    "See https://example.com/docs/harbor?x=1 for the crane manual",
    "Mail dana@example.com about the v1.2.3 release",
    "Pi is 3.14159 and the budget is 42,000 euros",
    "Quotes 'single' and \"double\" around the crane",
    "Syntax like foo:* & bar | !baz <-> qux",
    "Tabs\tand\nnewlines   in a harbor note",
    "A well-known co-owner of the re-entry plan",
    "Nothing in common here at all",
    "harbor crane harbor crane harbor crane",
]

QUERIES = [
    "harbor",
    "crane manual",
    "O'Brien state-of-the-art",
    "C:\\tools\\harbor",
    "back\\slash",
    "café zürich 東京",
    "https://example.com/docs/harbor?x=1",
    "dana@example.com v1.2.3",
    "3.14159 42,000",
    "'single' \"double\"",
    "foo:* & bar | !baz <-> qux",
    "well-known co-owner re-entry",
    "what about the harbor crane and the release",
    "zzqx nothing matches",
    "the and of",  # only stop words: no lexeme
]


def _insert(
    su: Conn,
    content: str,
    *,
    tenant: str = "t1",
    scope: str = "user",
    user: str = "u1",
    session: str = "",
    memory_type: str = "fact",
    valid: str | None = None,
) -> str:
    row = su.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, session_id, content,"
        " content_hash, memory_type, valid) values (%s, %s, %s, %s, %s,"
        " encode(sha256(convert_to(%s || %s || %s, 'UTF8')), 'hex'), %s,"
        " coalesce(%s::tstzrange, tstzrange(now(), null))) returning id",
        (tenant, scope, user, session, content, content, user, session, memory_type, valid),
    ).fetchone()
    assert row is not None
    return str(row[0])


def _filler(su: Conn, n: int = 40, **owner: str) -> None:
    """``n`` rows of the owner that match none of the tests' queries: an owner of
    at most p_term_limit rows is read whole, without the lookup."""
    for i in range(n):
        _insert(su, f"quiet filler {'z' * (i + 5)}", **owner)


def _crowd(su: Conn) -> None:
    """Other tenants' rows, so that the plans are those of a table of many owners."""
    su.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
        " select 'crowd' || (i % 100), 'user', 'u', 'harbor crane secret note ' || i,"
        " encode(sha256(convert_to('crowd' || i, 'UTF8')), 'hex')"
        " from generate_series(1, 3000) i"
    )


@pytest.fixture
def conns(conns: tuple[Conn, Conn]) -> tuple[Conn, Conn]:
    """The shared connections (tests/integration/conftest.py), with other
    tenants' rows in the table."""
    _crowd(conns[0])
    return conns


_INDEXES = ("memories_owner_terms_idx", "memories_lexical_idx", "memories_owner_idx")


def _scans(app: Conn) -> dict[str, int]:
    """Index scans this backend has counted and not yet reported, by index."""
    return {
        name: app.execute(
            "select pg_stat_get_xact_numscans(%s::regclass) as n", (f"harbor.{name}",)
        ).fetchone()["n"]  # type: ignore[index]
        for name in _INDEXES
    }


def _lexical(
    app: Conn, query: str, scopes: str, term_limit: int, scan_limit: int = 2000
) -> tuple[list[Any], dict[str, int]]:
    """The leg's rows for ``query`` and how many index scans it made of the
    owner-term index and of the two owner-keyed ones (counted before and after,
    in one transaction: the backend reports its counts only between them)."""
    with app.transaction():
        before = _scans(app)
        rows = app.execute(
            "select tenant_id, memory_id, lexical_rank, lexical_score, scope::text,"
            " memory_type::text, importance, valid_from, content_hash, entity_ids, owner_rows"
            " from harbor._lexical_candidates(%s, %s, now(), 50, %s, %s)"
            " order by tenant_id, memory_id",
            (query, scopes, scan_limit, term_limit),
        ).fetchall()
        after = _scans(app)
    return [tuple(r.values()) for r in rows], {k: after[k] - before[k] for k in _INDEXES}


def _seed(su: Conn) -> None:
    for text in TEXTS:
        _insert(su, text)
        _insert(su, f"session copy: {text}", scope="session", session="s1")
        _insert(su, f"other user: {text}", user="u2")
        _insert(su, f"other tenant: {text}", tenant="t2")
    _insert(su, "superseded harbor crane", valid="[2020-01-01,2021-01-01)")
    _insert(su, "summary of the harbor crane", memory_type="summary")
    _insert(su, "another session's harbor crane", scope="session", session="s2")
    _filler(su)
    _filler(su, scope="session", session="s1")
    su.execute("vacuum analyze harbor.memories")


def test_the_lookup_finds_what_the_owner_scan_finds(conns: tuple[Conn, Conn]) -> None:
    """For every query, both ways give the same rows, ranks, scores, ranking
    columns and owner counts; the lookup reads the owner-term index and not the
    covering one, the owner scan the other way round."""
    su, app = conns
    _seed(su)
    matched = 0
    for scopes in ("{user}", "{user,session}", "{session}"):
        for query in QUERIES:
            scan, scan_stats = _lexical(app, query, scopes, 0)
            # (each scope's owner holds more rows than 32, and the query's matches fewer)
            lookup, lookup_stats = _lexical(app, query, scopes, 32)
            assert lookup == scan, (query, scopes)
            matched += bool(scan)
            assert scan_stats["memories_owner_terms_idx"] == 0
            assert scan_stats["memories_lexical_idx"] >= 1 or not scan
            if lookup:
                assert lookup_stats["memories_owner_terms_idx"] >= 1
                assert lookup_stats["memories_lexical_idx"] == 0, (query, lookup_stats)
            # an owner above the scan limit: the tenant-wide text index, or the
            # lookup's matches, ranked over the same collection size
            large, _ = _lexical(app, query, scopes, 0, scan_limit=3)
            large_lookup, _ = _lexical(app, query, scopes, 1000, scan_limit=3)
            assert large_lookup == large, (query, scopes)
    # the queries are not vacuous: most of them match something in every scope set
    assert matched >= 30


def test_more_matches_than_the_limit_fall_back_to_the_owner_scan(
    conns: tuple[Conn, Conn],
) -> None:
    """With more matching rows than p_term_limit, the leg reads the owner's rows
    as before, with the same answers as a lookup given room for them all."""
    su, app = conns
    for n in range(12):
        _insert(su, f"harbor crane number {n}")
    _insert(su, "unrelated text")
    _filler(su)
    su.execute("vacuum analyze harbor.memories")
    few, few_stats = _lexical(app, "harbor crane", "{user}", 5)
    room, room_stats = _lexical(app, "harbor crane", "{user}", 32)
    assert few == room
    assert len(few) == 12
    assert {r[-1] for r in few} == {53}  # owner_rows: every row of the owner
    assert few_stats["memories_owner_terms_idx"] >= 1 and few_stats["memories_lexical_idx"] >= 1
    assert room_stats["memories_lexical_idx"] == 0


def test_a_term_in_nearly_every_row_makes_no_row_a_match(conns: tuple[Conn, Conn]) -> None:
    """A query term held by at least 90% of the owner's rows (a speaker's name in
    every turn) makes no row a candidate by itself: with another term in the
    query, only the rows holding that one are read (from the owner-term index,
    never the covering one) and scored, by BM25 over every query term with
    document frequencies counted over the owner's rows; the order of those rows
    is the owner scan's."""
    su, app = conns
    crane = set()
    for n in range(40):
        if n % 13 == 0:
            crane.add(_insert(su, f"harbor crane number {n}" + " crane" * (n % 2)))
        else:
            _insert(su, f"harbor note number {n}")
    hidden = _insert(su, "harbor crane kept above the ceiling")
    su.execute("update harbor.memories set sensitivity = 'pii' where id = %s", (hidden,))
    _insert(su, "harbor crane of another user", user="u2")
    su.execute("vacuum analyze harbor.memories")
    with app.transaction():
        before = _scans(app)
        rows = app.execute(
            "select memory_id, lexical_rank, lexical_score, owner_rows"
            " from harbor._lexical_candidates('harbor crane', '{user}', now(), 50, 2000, 2,"
            " 'low') order by lexical_rank, memory_id"
        ).fetchall()
        after = _scans(app)
    assert {r["memory_id"] for r in rows} == crane
    assert {r["owner_rows"] for r in rows} == {41}
    assert after["memories_lexical_idx"] == before["memories_lexical_idx"]
    assert after["memories_owner_terms_idx"] > before["memories_owner_terms_idx"]
    # BM25 as harbor._bm25, over the owner's 41 rows, the frequencies counted
    docs = {
        mid: dict(
            su.execute(
                "select lexeme, cardinality(positions) from unnest("
                "(select fts from harbor.memories where id = %s))",
                (mid,),
            ).fetchall()
        )
        for mid in crane
    }
    avgdl = sum(len(d) for d in docs.values()) / len(docs)
    df = {"harbor": 41, "crane": 5}  # the hidden row counts, as in the collection size
    expected = {
        mid: sum(
            math.log(1 + (41 - df[t] + 0.5) / (df[t] + 0.5))
            * d[t]
            * 2.2
            / (d[t] + 1.2 * (0.25 + 0.75 * len(d) / avgdl))
            for t in df
            if t in d
        )
        for mid, d in docs.items()
    }
    assert {r["memory_id"]: r["lexical_score"] for r in rows} == pytest.approx(expected)
    # the same order as the owner scan's, which also returns the rows of harbor only
    scan = app.execute(
        "select memory_id from harbor._lexical_candidates('harbor crane', '{user}', now(), 50,"
        " 2000, 0, 'low') order by lexical_rank, memory_id"
    ).fetchall()
    assert len(scan) == 40
    assert [r["memory_id"] for r in scan[: len(rows)]] == [r["memory_id"] for r in rows]


def test_no_match_reads_no_owner_rows(conns: tuple[Conn, Conn]) -> None:
    """A question none of whose words the owner used costs the owner's count (one
    descent of the narrow owner index, bounded by the scan limit) and one lookup:
    the owner's rows are not read."""
    su, app = conns
    for n in range(40):
        _insert(su, f"harbor crane number {n}")
    su.execute("vacuum analyze harbor.memories")
    rows, stats = _lexical(app, "zzqx unknown", "{user}", 32)
    assert rows == []
    assert stats["memories_owner_terms_idx"] >= 1
    assert stats["memories_lexical_idx"] == 0
    assert stats["memories_owner_idx"] == 1


def test_an_owner_of_at_most_the_limit_is_read_whole(conns: tuple[Conn, Conn]) -> None:
    """An owner holding no more rows than p_term_limit is read in one pass over its
    rows (the lookup could not read fewer), with the answers of the owner scan; one
    row more and the lookup is back."""
    su, app = conns
    for n in range(32):
        _insert(su, f"harbor crane number {n}" if n % 4 == 0 else f"harbor note {n}")
    _insert(su, "a crane of another user", user="u2")
    su.execute("vacuum analyze harbor.memories")
    for rows_held, looked_up in ((32, False), (33, True)):
        if rows_held == 33:
            _insert(su, "one more note")
            su.execute("vacuum analyze harbor.memories")
        rows, stats = _lexical(app, "crane", "{user}", 32)
        scan, _ = _lexical(app, "crane", "{user}", 0)
        assert rows == scan and len(rows) == 8
        assert {r[-1] for r in rows} == {rows_held}
        assert (stats["memories_owner_terms_idx"] >= 1) is looked_up, (rows_held, stats)
        assert (stats["memories_lexical_idx"] >= 1) is not looked_up, (rows_held, stats)


def _owner_key(tenant: str, user: str) -> str:
    """The owner key the owner-term index files a USER-scope owner's memories
    under (harbor.vector_owner_key() with no model), computed here."""
    t, u = tenant.encode(), user.encode()
    return f"{len(t)}:{tenant}0:u{len(u)}:{user}0:0:0:"


def _colliding_users(tenant: str) -> tuple[str, str]:
    """Two user ids whose owner keys share harbor.owner_term_prefix() (8 hex
    digits of md5: a birthday search, about 80,000 tries)."""
    seen: dict[str, str] = {}
    i = 0
    while True:
        user = f"c{i}"
        prefix = hashlib.md5(_owner_key(tenant, user).encode()).hexdigest()[:8]
        if prefix in seen:
            return seen[prefix], user
        seen[prefix] = user
        i += 1


_RETURNED = (
    "select pg_stat_get_xact_tuples_returned('harbor.memories_owner_terms_idx'::regclass) as n"
)


def test_owners_sharing_a_hash_never_see_each_others_rows(fresh_db: PgDatabase) -> None:
    """Two users whose owner keys hash to the same prefix share the index's keys:
    the lookup reads the other's row and drops it."""
    a, b = _colliding_users("t1")
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        key_a, prefix_a, prefix_b = su.execute(
            "select harbor.vector_owner_key('t1', '', 'user', %s, '', '', ''),"
            " harbor.owner_term_prefix(harbor.vector_owner_key('t1', '', 'user', %s, '', '', '')),"
            " harbor.owner_term_prefix(harbor.vector_owner_key('t1', '', 'user', %s, '', '', ''))",
            (a, a, b),
        ).fetchone() or ("", "", "")
        assert key_a == _owner_key("t1", a)  # the Python copy encodes as the SQL does
        assert prefix_a == prefix_b
        _crowd(su)
        mine = _insert(su, "the shared harbor secret", user=a)
        theirs = _insert(su, "the shared harbor secret of another", user=b)
        _filler(su, user=a)
        _filler(su, user=b)
        su.execute("vacuum analyze harbor.memories")
    with psycopg.connect(fresh_db.app_url, autocommit=True, row_factory=dict_row) as app:
        for me, own, other in ((a, mine, theirs), (b, theirs, mine)):
            app.execute("select harbor.set_identity('t1', principal_id => %s)", (me,))
            with app.transaction():
                before = app.execute(_RETURNED).fetchone()
                rows = app.execute(
                    "select memory_id from harbor._lexical_candidates('harbor secret',"
                    " '{user}', now(), 50)"
                ).fetchall()
                after = app.execute(_RETURNED).fetchone()
            assert before is not None and after is not None
            assert [r["memory_id"] for r in rows] == [own]
            assert other != own
            # both rows came out of the index: the collision was exercised
            assert after["n"] - before["n"] >= 2, (before, after)


def test_the_lookup_keys_are_the_lexemes_of_the_query_the_leg_matches(
    conns: tuple[Conn, Conn],
) -> None:
    """harbor.or_tsquery_lexemes() of a question's English lexemes gives exactly
    the lexemes in harbor.or_tsquery() of it, read here from the query's text
    form (each lexeme quoted, a quote inside doubled)."""
    _su, app = conns
    for query in [*QUERIES, *TEXTS, "Ünïcödé ß straße", "a\\b 'c''d' e-f-g", ""]:
        row = app.execute(
            "select harbor.or_tsquery(%s)::text as q, harbor.or_tsquery_lexemes("
            "tsvector_to_array(to_tsvector('english', %s))) as keys",
            (query, query),
        ).fetchone()
        assert row is not None
        quoted = {m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", row["q"])}
        assert "\\" not in row["q"]  # or_tsquery() drops backslashes: nothing to unescape
        assert sorted(row["keys"]) == sorted(quoted), query


def test_a_long_question_skips_the_lookup(conns: tuple[Conn, Conn]) -> None:
    """More than 16 lexemes: one key each, and most such questions match more
    rows than the limit, so the leg reads the owner's rows without a lookup;
    at 16 it still looks up. The answers are those of the owner scan."""
    su, app = conns
    words = [f"word{i}x" for i in range(17)]
    for n, word in enumerate(words):
        _insert(su, f"note {n} about {word}")
    _filler(su)
    su.execute("vacuum analyze harbor.memories")
    for count, looked_up in ((16, True), (17, False)):
        query = " ".join(words[:count])
        rows, stats = _lexical(app, query, "{user}", 32)
        scan, _ = _lexical(app, query, "{user}", 0)
        assert rows == scan and len(rows) == count
        assert (stats["memories_owner_terms_idx"] >= 1) is looked_up, (count, stats)
        assert (stats["memories_lexical_idx"] >= 1) is not looked_up, (count, stats)


def test_a_large_owner_matches_only_the_rarer_terms_by_the_tables_statistics(
    conns: tuple[Conn, Conn],
) -> None:
    """Above the scan limit, a term the table's statistics expect in more rows than the
    limit matches nothing by itself: the rows holding a rarer term are matched (when
    there are at least as many as the leg hands over), all terms score them, and the
    common term's frequency is its expected row count. Fewer such rows: every term
    matches, as without statistics."""
    su, app = conns
    zebra = {_insert(su, f"harbor zebra sighting {n}") for n in range(8)}
    for n in range(60):
        _insert(su, f"harbor note number {n}")
    query = (
        "select memory_id, lexical_rank, lexical_score from harbor._lexical_candidates("
        "%s, '{user}', now(), %s, 10, 0) order by lexical_rank, memory_id"
    )
    unanalysed = app.execute(query, ("harbor zebra", 5)).fetchall()
    su.execute("analyze harbor.memories")
    [(freq,)] = su.execute(
        "select e.freq from pg_stats st, unnest(st.most_common_elems::text::text[],"
        " st.most_common_elem_freqs) e(elem, freq) where st.schemaname = 'harbor'"
        " and st.tablename = 'memories' and st.attname = 'fts' and e.elem = 'harbor'"
    ).fetchall()
    assert freq > 0.5  # 'harbor' is common, 'zebra' is not among the common lexemes
    with app.transaction():
        before = _scans(app)
        analysed = app.execute(query, ("harbor zebra", 5)).fetchall()
        after = _scans(app)
    # only zebra rows, the same five as before (they outrank every harbor-only row)
    assert {r["memory_id"] for r in analysed} <= zebra
    assert [r["memory_id"] for r in analysed] == [r["memory_id"] for r in unanalysed]
    assert after["memories_lexical_idx"] == before["memories_lexical_idx"]
    # asked for more than the eight zebra rows: every term matches, harbor rows too
    wide = app.execute(query, ("harbor zebra", 20)).fetchall()
    assert len(wide) == 20 and zebra < {r["memory_id"] for r in wide}
    # and there harbor counts the owner's 68 rows that hold it; with the rarer term's
    # rows alone, the table's 3,000 expected: it weighs (almost) nothing
    full = {r["memory_id"]: r["lexical_score"] for r in wide}
    assert all(0 < r["lexical_score"] < full[r["memory_id"]] for r in analysed)
