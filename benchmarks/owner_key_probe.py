"""What one owner-key column saves recall's two owner scans, against six or seven.

Until migration 0007 both covering indexes that recall's owner scans read
(``memory_embeddings`` for the dense leg, ``memories`` for the lexical leg) were
keyed on the owner fields (tenant, model, scope, user, project, session, run):
six or seven text columns that every entry checks. This copies ``--owners``
owners' rows of a kept set built by ``recall.py`` into side tables in the
``public`` schema, with covering indexes keyed

- on the owner fields (as before 0007);
- on ``harbor.vector_owner_key()`` of them, carrying the fields (as 0007 built
  it for the vectors; the lexical one was not built);
- on a single ``bigint`` owner id (a ``dense_rank()`` over the owner fields,
  which would need a new column and an owners table), and for the vectors on
  that id with ``halfvec(384)`` as well.

It then times each owner's core statements at the client, with generic plans,
the variants in random order per question:

- dense: the owner's vectors, cosine distance, the nearest 164 (the window
  ``harbor._dense_candidates`` sorts for 50 candidates);
- lexical: the owner's rows, the text match, the matches aggregated (as
  ``harbor._lexical_candidates``' one pass does).

It checks that each variant returns what the owner-field key does, prints
medians and paired differences, and drops the side tables. Nothing in the
``harbor`` schema changes. Takes about a minute for 300 owners and 3 passes.

    python benchmarks/owner_key_probe.py --data-dir /tmp/bench1m
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import kept_server, machine, with_params
from recall import kept_dir, set_label

from harbor_pg.db import migrate

TABLES = ("t_cur", "t_oid", "t_oidh", "l_cur", "l_oid")
# the owner fields and ids of the side tables' rows (SQL over the source row, e or m)
_UUID = "md5({0})::uuid::text"
ID_FORMS = {
    "as-built": {
        "tenant": "tenant_id",
        "model": "model_id",
        "scope": "scope",
        "user": "user_id",
        "session": "session_id",
        "memory": "memory_id",
        "memory_row": "id",
    },
    "uuid": {
        "tenant": _UUID.format("tenant_id"),
        "model": "'BAAI/bge-small-en-v1.5'::text",
        "scope": "scope",
        "user": f"case when user_id = '' then '' else {_UUID.format('user_id')} end",
        "session": "session_id",
        "memory": _UUID.format("memory_id"),
        "memory_row": _UUID.format("id"),
    },
    "uuid-session": {
        "tenant": _UUID.format("tenant_id"),
        "model": "'BAAI/bge-small-en-v1.5'::text",
        "scope": "'session'::harbor.memory_scope",
        "user": _UUID.format("user_id"),
        "session": _UUID.format("tenant_id || 'session'"),
        "memory": _UUID.format("memory_id"),
        "memory_row": _UUID.format("id"),
    },
}
# the variants, in the order they are reported; the first is the baseline
FIELDS, EXPRESSION, OWNER_ID, HALFVEC = (
    "owner fields",
    "owner-key expression",
    "bigint owner id",
    "bigint owner id, halfvec",
)

BUILD = """
create table public.t_cur as
  select {tenant} as tenant_id, {model} as model_id, {scope} as scope, {user} as user_id,
         e.project_id, {session} as session_id, e.run_id, {memory} as memory_id,
         e.with_context, e.embedding
    from harbor.memory_embeddings e
   where e.dims = 384
     and e.tenant_id in (select distinct tenant_id from harbor.memory_embeddings
                          order by 1 limit %(owners)s);
create table public.t_oid as
  select dense_rank() over (order by tenant_id, model_id, scope, user_id, project_id,
                                     session_id, run_id)::bigint as owner_id, t.*
    from public.t_cur t;
create table public.t_oidh as
  select owner_id, memory_id, with_context, embedding::halfvec(384) as eh from public.t_oid;
create table public.l_cur as
  select {tenant} as tenant_id, {scope} as scope, {user} as user_id, m.project_id,
         {session} as session_id, m.run_id, {memory_row} as id, m.fts, m.memory_type,
         m.importance, m.valid, m.content_hash, m.entity_ids
    from harbor.memories m
   where m.tenant_id in (select distinct tenant_id from harbor.memory_embeddings
                          order by 1 limit %(owners)s);
create table public.l_oid as
  select dense_rank() over (order by tenant_id, scope, user_id, project_id, session_id,
                                     run_id)::bigint as owner_id, l.*
    from public.l_cur l;
create index on public.t_cur (tenant_id, model_id, scope, user_id, project_id, session_id, run_id)
  include (memory_id, with_context, embedding);
create index on public.t_cur
  ((harbor.vector_owner_key(tenant_id, model_id, scope, user_id, project_id, session_id, run_id))
   collate "C")
  include (tenant_id, model_id, scope, user_id, project_id, session_id, run_id, memory_id,
           with_context, embedding);
create index on public.t_oid (owner_id) include (memory_id, with_context, embedding);
create index on public.t_oidh (owner_id) include (memory_id, with_context, eh);
create index on public.l_cur (tenant_id, scope, user_id, project_id, session_id, run_id)
  include (id, fts, memory_type, importance, valid, content_hash, entity_ids);
create index on public.l_cur
  ((harbor.vector_owner_key(tenant_id, '', scope, user_id, project_id, session_id, run_id))
   collate "C")
  include (tenant_id, scope, user_id, project_id, session_id, run_id, id, fts, memory_type,
           importance, valid, content_hash, entity_ids);
create index on public.l_oid (owner_id)
  include (id, fts, memory_type, importance, valid, content_hash, entity_ids);
"""

DENSE_CUR = """
select memory_id, with_context, embedding <=> %s::vector as d from public.t_cur
 where tenant_id = %s and model_id = %s and scope = %s::harbor.memory_scope and user_id = %s
   and project_id = %s and session_id = %s and run_id = %s
 order by d, memory_id limit 164"""
DENSE_EXPR = """
select memory_id, with_context, embedding <=> %s::vector as d from public.t_cur
 where harbor.vector_owner_key(tenant_id, model_id, scope, user_id, project_id, session_id,
                               run_id) collate "C"
       = harbor.vector_owner_key(%s, %s, %s::harbor.memory_scope, %s, %s, %s, %s) collate "C"
 order by d, memory_id limit 164"""
DENSE_OID = """
select memory_id, with_context, embedding <=> %s::vector as d from public.t_oid
 where owner_id = %s order by d, memory_id limit 164"""
DENSE_HALF = """
select memory_id, with_context, eh <=> %s::halfvec(384) as d from public.t_oidh
 where owner_id = %s order by d, memory_id limit 164"""

# only columns the owner-id index carries, so that both variants are index-only
_HIT = (
    "coalesce(m.fts @@ (select to_tsquery('english', %s)), false)"
    " and coalesce(m.valid @> now(), false) and m.memory_type <> 'summary'"
)
_LEXICAL = """
select count(*), array_agg(m.id) filter (where hit), array_agg(m.fts) filter (where hit),
       array_agg(row(m.memory_type, m.importance, lower(m.valid), m.content_hash, m.entity_ids))
           filter (where hit)
  from (select m.id, m.fts, m.memory_type, m.importance, m.valid, m.content_hash,
               m.entity_ids, {hit} as hit
          from public.{table} m where {key} limit 2001) m"""
LEXICAL_CUR = _LEXICAL.format(
    hit=_HIT,
    table="l_cur",
    key="tenant_id = %s and scope = %s::harbor.memory_scope and user_id = %s"
    " and project_id = %s and session_id = %s and run_id = %s",
)
LEXICAL_EXPR = _LEXICAL.format(
    hit=_HIT,
    table="l_cur",
    key="harbor.vector_owner_key(tenant_id, '', scope, user_id, project_id, session_id, run_id)"
    " collate \"C\" = harbor.vector_owner_key(%s, '', %s::harbor.memory_scope, %s, %s, %s, %s)"
    ' collate "C"',
)
LEXICAL_OID = _LEXICAL.format(hit=_HIT, table="l_oid", key="owner_id = %s")


def drop(conn: psycopg.Connection) -> None:
    conn.execute("drop table if exists " + ", ".join(f"public.{t}" for t in TABLES))


def timed(
    variants: dict[str, Callable[[], object]], times: dict[str, list[float]], rng: random.Random
) -> None:
    names = list(variants)
    rng.shuffle(names)
    for name in names:
        t = time.perf_counter()
        variants[name]()
        times[name].append(time.perf_counter() - t)


def report(label: str, times: dict[str, list[float]], base: str) -> None:
    print(f"  {label}:")
    for name, xs in times.items():
        line = f"    {name:<26} median {1000 * statistics.median(xs):.3f} ms"
        if name != base:
            saving = statistics.median(a - b for a, b in zip(times[base], xs, strict=True))
            line += f"   paired saving against {base}: {1000 * saving:.3f} ms"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="as given to recall.py")
    ap.add_argument("--size", type=int, default=1_000_000, help="which kept uniform set")
    ap.add_argument("--order", default="interleaved", help="as given to recall.py")
    ap.add_argument("--owners", type=int, default=300)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--ids",
        choices=sorted(ID_FORMS),
        default="as-built",
        help="the set's own short ids (as-built), or ids as a service might name them:"
        " UUIDs for tenant, user and memory (uuid), and a session as well, in SESSION"
        " scope (uuid-session); entry sizes, and so entries a page, depend on them",
    )
    args = ap.parse_args()
    base = kept_dir(args.data_dir, set_label(f"uniform {args.size:,}", args.order))
    if not (base / "built.json").exists():
        raise SystemExit(f"no kept set at {base}: build it with recall.py --data-dir")
    print(f"machine: {machine()}")
    print(f"set: {base}, {args.owners} owners, {args.passes} passes", flush=True)
    rng = random.Random(args.seed)
    with kept_server(base) as (su, _):
        # harbor.vector_owner_key() comes with migration 0007
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        conn = psycopg.connect(with_params(su, dbname="harbor"), autocommit=True)
        try:
            drop(conn)
            t0 = time.perf_counter()
            for statement in BUILD.split(";"):
                if statement.strip():
                    statement = statement.replace("%(owners)s", str(int(args.owners)))
                    conn.execute(statement.format(**ID_FORMS[args.ids]))
            conn.execute("vacuum analyze " + ", ".join(f"public.{t}" for t in TABLES))
            print(f"  side tables built in {time.perf_counter() - t0:.1f} s", flush=True)
            for row in conn.execute(
                "select c.relname, pg_size_pretty(pg_relation_size(i.indexrelid))"
                " from pg_index i join pg_class c on c.oid = i.indrelid"
                " where c.relname = any(%s) order by 1",
                (list(TABLES),),
            ):
                print(f"  index on {row[0]}: {row[1]}")
            run(conn, args, rng)
        finally:
            drop(conn)
            conn.close()


def run(conn: psycopg.Connection, args: argparse.Namespace, rng: random.Random) -> None:
    conn.execute("set plan_cache_mode = force_generic_plan")
    conn.prepare_threshold = 0
    dense_owners = conn.execute(
        "select distinct on (owner_id) owner_id, tenant_id, model_id, scope::text, user_id,"
        " project_id, session_id, run_id from public.t_oid order by owner_id"
    ).fetchall()
    text_owners = conn.execute(
        "select distinct on (owner_id) owner_id, tenant_id, scope::text, user_id, project_id,"
        " session_id, run_id from public.l_oid order by owner_id"
    ).fetchall()
    # a question per owner: one of its own vectors, and words of two of its memories
    dense_qs = []
    for o in dense_owners:
        v = conn.execute(
            "select embedding::text from public.t_cur where tenant_id = %s"
            " order by md5(memory_id) limit 1",
            (o[1],),
        ).fetchone()
        dense_qs.append((o, v[0] if v else None))
    text_qs = []
    for o in text_owners:
        rows = conn.execute(
            "select (tsvector_to_array(fts))[1:2] from public.l_cur where tenant_id = %s"
            " order by md5(id) limit 2",
            (o[1],),
        ).fetchall()
        words = [w for r in rows for w in r[0]] + ["what", "about"]
        text_qs.append((o, " | ".join(w for w in words if w.isalnum())))

    # statements taking the owner fields (o[1:]), and those taking the owner id (o[0])
    by_fields = {FIELDS: (DENSE_CUR, LEXICAL_CUR), EXPRESSION: (DENSE_EXPR, LEXICAL_EXPR)}
    by_id = {OWNER_ID: (DENSE_OID, LEXICAL_OID), HALFVEC: (DENSE_HALF, None)}

    def statement(kind: str, leg: int, o: tuple, first: str) -> tuple[str, tuple]:
        if kind in by_fields:
            return by_fields[kind][leg], (first, *o[1:])
        sql = by_id[kind][leg]
        assert sql is not None
        return sql, (first, o[0])

    def dense(kind: str, o: tuple, v: str) -> list[str]:
        return [r[0] for r in conn.execute(*statement(kind, 0, o, v)).fetchall()]

    def lexical(kind: str, o: tuple, q: str) -> tuple[int, list[str]]:
        row = conn.execute(*statement(kind, 1, o, q)).fetchone()
        assert row is not None
        return row[0], sorted(row[1] or [])

    n = len(dense_qs)
    for kind in (EXPRESSION, OWNER_ID):
        same = sum(dense(kind, o, v)[:25] == dense(FIELDS, o, v)[:25] for o, v in dense_qs)
        print(f"  dense, {kind}: the same top 25 in {same} of {n} questions")
    overlap = sum(
        len(set(dense(HALFVEC, o, v)[:25]) & set(dense(FIELDS, o, v)[:25])) for o, v in dense_qs
    )
    print(f"  dense, {HALFVEC}: {100 * overlap / (25 * n):.2f}% of the top 25's places")
    for kind in (EXPRESSION, OWNER_ID):
        agree = sum(lexical(kind, o, q) == lexical(FIELDS, o, q) for o, q in text_qs)
        print(f"  lexical, {kind}: the same count and matches in {agree} of {len(text_qs)}")

    dense_times: dict[str, list[float]] = {k: [] for k in (FIELDS, EXPRESSION, OWNER_ID, HALFVEC)}
    text_times: dict[str, list[float]] = {k: [] for k in (FIELDS, EXPRESSION, OWNER_ID)}
    for p in range(args.passes):
        for o, v in dense_qs:
            timed(
                {k: (lambda k=k, o=o, v=v: dense(k, o, v)) for k in dense_times}, dense_times, rng
            )
        for o, q in text_qs:
            timed(
                {k: (lambda k=k, o=o, q=q: lexical(k, o, q)) for k in text_times}, text_times, rng
            )
        print(f"  pass {p + 1} of {args.passes} done", flush=True)
    report("dense: nearest 164 of the owner's vectors", dense_times, FIELDS)
    report("lexical: the owner's rows, text match, matches aggregated", text_times, FIELDS)


if __name__ == "__main__":
    main()
