"""Turn a migrated harbor database on a Citus coordinator into a distributed one.

``harbor-pg distribute`` (:func:`distribute`) runs, as a superuser of the
coordinator, after ``harbor-pg migrate`` and after the workers were added
(``citus_add_node``). It changes nothing in the single-server schema files:
what Citus needs is derived from them here, so the two cannot drift.

- ``harbor.role_bindings`` becomes a reference table (a copy on every node):
  every policy reads it, so each worker must hold it.
- ``memories``, ``memory_embeddings``, ``messages``, ``working_state``,
  ``session_state`` and ``owner_locks`` are distributed by ``tenant_id``, co-located with
  ``memories`` (a tenant's rows of every table sit in one shard group, on one
  worker; no statement of one tenant joins across shards).
- GLOBAL memories (tenant ``''``) stay in ``memories`` and hash to one shard
  like any tenant (see docs/citus.md, "GLOBAL rows", for why and what it costs);
  whether any may exist is one flag in a reference table, which a search reads on
  the tenant's worker before it reads them (``sql/citus/global.sql``).
- The policies are re-created from ``sql/policies/policies.sql`` with each
  ``(select harbor.f(...))`` written as ``harbor.f(...)``: Citus refuses
  sub-selects in the policies of a distributed table. On the shards the
  identity functions are inlined and their lookups still run once a statement.
- The ``superseded_by`` foreign key keeps its columns and loses ``on delete set
  null``, which Citus refuses when the key holds the distribution column; an
  AFTER DELETE trigger of ``sql/citus/successor.sql`` does what the action did,
  on the deleted row's shard (it clears the links to the deleted row, as the
  table's owner, so the add-only guard treats it as the referential action).
- ``citus.propagate_set_commands = 'local'`` is made the database's default on
  every node, so the identity the wrapper sets with ``SET LOCAL`` reaches every
  worker that runs a piece of a statement (``set_config`` is not propagated).
- ``citus.enable_unsafe_triggers`` is turned on for the database, so the
  add-only trigger of ``memories`` and the one-tenant trigger of
  ``role_bindings`` fire on the shards.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from harbor_pg.db import sqlfiles
from harbor_pg.db.citus_rewrites import rewrite, rewritten_functions
from harbor_pg.db.sqlfiles import query, read_sql
from harbor_pg.errors import MemoryConfigurationError

__all__ = [
    "CITUS_FILES",
    "CO_LOCATED",
    "REFERENCE",
    "REFERENCE_TABLES",
    "DistributeReport",
    "apply_idempotent",
    "citus_functions",
    "citus_policies",
    "distribute",
    "is_distributed",
]

#: the reference table (copied to every node)
REFERENCE = "harbor.role_bindings"
#: every reference table: the bindings, and the access tokens (migration 0014), which
#: are looked up by their hash before any tenant is known (a distributed table would
#: send each lookup to every shard), and which the coordinator reads locally, where
#: the token hash set with set_config() is seen
REFERENCE_TABLES: tuple[str, ...] = (REFERENCE, "harbor.access_tokens")
#: the policy files, with the tables whose policies they hold
_POLICY_FILES: tuple[str, ...] = (
    "policies/policies.sql",
    "policies/tokens.sql",
    "policies/locks.sql",
)
#: distributed by tenant_id, in this order, all co-located with the first
CO_LOCATED: tuple[str, ...] = (
    "harbor.memories",
    "harbor.memory_embeddings",
    "harbor.messages",
    "harbor.working_state",
    "harbor.session_state",
    "harbor.owner_locks",
    "harbor.memory_hits",
)

# `(select harbor.f(args))` where args hold no parentheses: the identity look-ups
_SUBSELECT = re.compile(r"\(\s*select\s+(harbor\.[a-z_]+\([^()]*\))\s*\)", re.IGNORECASE)
_POLICY_TABLE = re.compile(r"\bon\s+(harbor\.[a-z_]+)", re.IGNORECASE)

_SUPERSEDED_FK = "memories_superseded_by_fkey"
#: SQL files of Citus forms, applied by citus_functions() (after the single-server files;
#: listed in harbor_pg.db.sqlfiles, whose sha256 of the re-runnable files covers them)
CITUS_FILES: tuple[str, ...] = sqlfiles.CITUS_FILES
#: the placeholder of the Citus forms (sql/citus/delegated.sql) for the version of those
#: files, which marks the statements a delegated call prepares on a worker connection
STATEMENTS_VERSION = "@statements_version@"


def citus_policies(text: str | None = None) -> str:
    """``sql/policies/policies.sql`` (or ``text``) in the form Citus accepts on a
    distributed table: every ``(select harbor.f(...))`` becomes ``harbor.f(...)``.

    Raises :class:`MemoryConfigurationError` if any other sub-select remains
    (the derivation would then need to learn it)."""
    source = read_sql("policies/policies.sql") if text is None else text
    derived = _SUBSELECT.sub(r"\1", source)
    code = "\n".join(line.split("--", 1)[0] for line in derived.splitlines())
    if re.search(r"\(\s*select\b", code, re.IGNORECASE):
        raise MemoryConfigurationError(
            "policies.sql holds a sub-select that harbor_pg.db.citus cannot rewrite for Citus"
        )
    return derived


_DOLLAR = re.compile(r"\$[A-Za-z_]*\$")
_ATOMIC = re.compile(r"\bbegin\s+atomic\b", re.IGNORECASE)
_ATOMIC_END = re.compile(r"^\s*end\s*;\s*$", re.IGNORECASE)


def _statements(text: str) -> list[str]:
    """The statements of a harbor SQL file (each ends with ``;`` at a line end,
    outside a dollar-quoted body and a ``begin atomic ... end;`` body)."""
    out: list[str] = []
    current: list[str] = []
    tag: str | None = None  # the open dollar quote, where ';' ends nothing
    atomic = False
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current.append(line)
        code = line if tag else line.split("--", 1)[0]
        for found in _DOLLAR.finditer(code):
            if tag is None:
                tag = found.group(0)
            elif found.group(0) == tag:
                tag = None
        if tag is None and not atomic and _ATOMIC.search(code):
            atomic = True
            continue
        if atomic:
            if _ATOMIC_END.match(code):
                atomic = False
                out.append("\n".join(current))
                current = []
            continue
        if tag is None and code.rstrip().endswith(";"):
            out.append("\n".join(current))
            current = []
    if "".join(current).strip():
        out.append("\n".join(current))
    return out


def _policies_of(text: str, table: str) -> list[str]:
    return [s for s in _statements(text) if (m := _POLICY_TABLE.search(s)) and m.group(1) == table]


@dataclass
class DistributeReport:
    """What :func:`distribute` did: tables distributed now, and those already so."""

    distributed: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    workers: int = 0
    twins: list[str] = field(default_factory=list)
    shards: dict[str, int] = field(default_factory=dict)


def is_distributed(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``harbor.memories`` is a Citus distributed table in this database."""
    row = conn.execute(
        "select exists (select 1 from pg_extension where extname = 'citus')"
    ).fetchone()
    if not row or not row[0]:
        return False
    found = conn.execute(
        "select 1 from pg_dist_partition where logicalrelid = 'harbor.memories'::regclass"
    ).fetchone()
    return found is not None


def _citus_tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("select logicalrelid::regclass::text from pg_dist_partition").fetchall()
    return {str(r[0]) for r in rows}


def _set_everywhere(conn: psycopg.Connection[Any], dbname: str, name: str, value: str) -> None:
    """``alter database ... set`` on the coordinator (Citus propagates it), checked
    on every worker."""
    conn.execute(f'alter database "{dbname}" set {name} = {value}')
    wrong = conn.execute(
        "select nodename, nodeport, result from run_command_on_workers(%s)"
        " where not success or result <> %s",
        (f"select current_setting('{name}')", value.strip("'")),
    ).fetchall()
    if wrong:
        raise MemoryConfigurationError(f"{name} is not {value} on every worker: {wrong}")


def distribute(superuser_url: str, *, shard_count: int | None = None) -> DistributeReport:
    """Distribute a migrated harbor database on a Citus coordinator (idempotent).

    ``superuser_url`` logs in to the coordinator's harbor database as a
    superuser. The workers must be registered already. ``shard_count``
    overrides ``citus.shard_count`` for the co-location group created here.
    Raises :class:`MemoryConfigurationError` when the database has no Citus,
    no workers or no harbor schema.
    """
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        _check(conn)
        report = DistributeReport()
        report.workers = int(
            conn.execute("select count(*) from citus_get_active_worker_nodes()").fetchone()[0]  # type: ignore[index]
        )
        _refuse_unsafe_bindings(conn)
        dbname = conn.info.dbname
        _set_everywhere(conn, dbname, "citus.propagate_set_commands", "'local'")
        _set_everywhere(conn, dbname, "citus.enable_unsafe_triggers", "on")
        conn.execute("set citus.enable_unsafe_triggers = on")
        if shard_count is not None:
            conn.execute(f"set citus.shard_count = {int(shard_count)}")
        done = _citus_tables(conn)
        # changes are not announced on a distributed table: a shard's trigger would notify
        # on its worker, and a transaction that touched several shards (two-phase commit)
        # cannot notify at all (sql/functions/changes.sql, docs/citus.md)
        conn.execute(query("drop_change_triggers"))
        # Step by step, each committed: a table whose policies were dropped and not yet
        # re-created denies every row (row security is forced), so a run that stops
        # half-way fails closed, and running it again picks up where it stopped.
        for table in (*REFERENCE_TABLES, *CO_LOCATED):
            if (conn.execute("select to_regclass(%s)", (table,)).fetchone() or (None,))[0] is None:
                continue  # (a table of a later migration than this database's)
            if table in done:
                report.already.append(table)
                continue
            # Citus refuses the single-server form of a policy (a sub-select)
            for (name,) in conn.execute(
                "select policyname from pg_policies where schemaname || '.' || tablename = %s",
                (table,),
            ).fetchall():
                conn.execute(f'drop policy "{name}" on {table}')
            if table == "harbor.memories":
                _relax_superseded_fk(conn)
            if table in REFERENCE_TABLES:
                conn.execute("select create_reference_table(%s)", (table,))
            else:
                conn.execute(
                    "select create_distributed_table(%s, 'tenant_id', colocate_with => %s)",
                    (table, "default" if table == CO_LOCATED[0] else CO_LOCATED[0]),
                )
            report.distributed.append(table)
        # the policies call the identity functions: every node needs them
        _propagate_functions(conn)
        report.twins = citus_functions(conn)
        # every vector in the HNSW graph, as citus_functions() makes the writes put them
        if conn.execute(
            "select 1 from pg_attribute where attrelid = 'harbor.memory_embeddings'::regclass"
            " and attname = 'in_graph' and not attisdropped"
        ).fetchone():
            conn.execute("update harbor.memory_embeddings set in_graph = true where not in_graph")
        # a worker draws a distributed table's identity values from the sequence
        # as the caller (one server needs no privilege on an identity sequence)
        grant = "grant usage on all sequences in schema harbor to harbor_app, harbor_admin"
        conn.execute(grant)
        conn.execute("select run_command_on_workers(%s)", (grant,))
        # harbor_app inserts messages and working_state on every column but the identity id
        # (migration 0017: no planted ids ahead of the sequence); Citus draws the id on the
        # coordinator and sends it to the shard, whose INSERT then names id: the table-level
        # grant comes back (on Citus a caller can choose an id again, docs/citus.md)
        conn.execute("grant insert on harbor.messages, harbor.working_state to harbor_app")
        _apply_policies(conn)
        # harbor.erase takes the erased sessions' locks as harbor_admin (policies/locks.sql
        # grants it on the coordinator, after the shards were made): on every shard too
        conn.execute("select run_command_on_shards('harbor.owner_locks', %s)", (_ADMIN_LOCK_GRANT,))
        report.shards = {
            str(r[0]): int(r[1])
            for r in conn.execute(
                "select nodename || ':' || nodeport, count(*) from citus_shards"
                " where table_name = 'harbor.memories'::regclass group by 1 order by 1"
            ).fetchall()
        }
        return report


#: what harbor_admin may do on a shard of harbor.owner_locks besides reading and deleting
_ADMIN_LOCK_GRANT = "grant insert, update (scope) on %s to harbor_admin"


def _propagate_functions(conn: psycopg.Connection[Any]) -> None:
    """Make every function of schema harbor a Citus object (copied to each worker;
    a function Citus already tracks is created again where it is missing)."""
    rows = conn.execute(
        "select p.oid::regprocedure::text from pg_proc p"
        " where p.pronamespace = 'harbor'::regnamespace order by p.oid"
    ).fetchall()
    for (signature,) in rows:
        conn.execute("select create_distributed_function(%s)", (signature,))


# SQL functions whose statements read or write a Citus table: Citus cannot plan
# such a statement with the function's parameters, so they get a PL/pgSQL twin
# (same signature, body and privileges); those read by the policies stay SQL, to
# be inlined into the policies on the shards. Also the SQL functions that call
# harbor._binding() (it reads the reference table) outside the policies: their
# twins read the bindings themselves (_binding's statement written in place:
# Citus refuses a query that only inlining shows to read a Citus table).
_SQL_FUNCTIONS_ON_TABLES = """
select p.oid::regprocedure::text as signature,
       pg_catalog.pg_get_function_arguments(p.oid) as arguments,
       pg_catalog.pg_get_function_result(p.oid) as result,
       p.proretset as returns_set,
       p.prorettype = 'pg_catalog.record'::regtype as returns_record,
       p.provolatile as volatility, p.prosecdef as definer,
       coalesce(pg_catalog.pg_get_function_sqlbody(p.oid), p.prosrc) as body,
       p.prosqlbody is not null as standard_body,
       case when p.proargmodes is null then '{}'::text[]
            else array(select a.name
                         from unnest(p.proargnames, p.proargmodes) a(name, mode)
                        where a.mode in ('o', 'b', 't')) end as out_names,
       p.proname::text as name,
       p.proparallel as parallel
  from pg_catalog.pg_proc p
 where p.pronamespace = 'harbor'::regnamespace
   and p.prolang = (select oid from pg_catalog.pg_language where lanname = 'sql')
   and p.prokind = 'f'
   and (((p.provolatile = 'v' or exists (
        select 1 from pg_dist_partition d
         where d.partmethod = 'h'
           and (pg_catalog.strpos(coalesce(pg_catalog.pg_get_function_sqlbody(p.oid), p.prosrc),
                                  d.logicalrelid::regclass::text) > 0)))
   and exists (select 1 from pg_dist_partition d
                where pg_catalog.strpos(coalesce(pg_catalog.pg_get_function_sqlbody(p.oid),
                                                 p.prosrc),
                                        d.logicalrelid::regclass::text) > 0))
        or (p.proname <> '_binding'
            and pg_catalog.strpos(coalesce(pg_catalog.pg_get_function_sqlbody(p.oid), p.prosrc),
                                  'harbor._binding(') > 0))
 order by p.oid
"""

_BINDING_CALL = re.compile(r"harbor\._binding\(\s*\)")


def _plpgsql_body(body: str, standard: bool) -> str:
    text = body.strip()
    if standard:
        text = re.sub(r"^BEGIN ATOMIC\s*", "", text, flags=re.IGNORECASE)
        text = re.sub(r"\s*END$", "", text, flags=re.IGNORECASE)
        text = re.sub(r"^RETURN\s+", "SELECT ", text, flags=re.IGNORECASE)
    text = text.strip().rstrip(";").strip()
    if ";" in _without_strings(text):
        raise MemoryConfigurationError(
            "an SQL function of more than one statement cannot be given a PL/pgSQL twin"
        )
    return text


def _without_strings(text: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", text)


def _called_by_policies() -> set[str]:
    """The harbor functions the policy files call (kept SQL, to be inlined)."""
    text = "\n".join(read_sql(name) for name in _POLICY_FILES)
    return set(re.findall(r"harbor\.([a-z_]+)\(", text))


def _binding_statement(conn: psycopg.Connection[Any]) -> str | None:
    """harbor._binding()'s statement as a PL/pgSQL body takes it (None before it exists)."""
    row = conn.execute(
        "select coalesce(pg_catalog.pg_get_function_sqlbody(p.oid), p.prosrc),"
        " p.prosqlbody is not null from pg_catalog.pg_proc p"
        " where p.oid = 'harbor._binding'::regproc"
    ).fetchone()
    return _plpgsql_body(str(row[0]), bool(row[1])) if row else None


def plpgsql_twins(conn: psycopg.Connection[Any]) -> list[str]:
    """Re-create each SQL function that reads or writes a distributed table (or any
    volatile SQL function on a Citus table, or one that reads the bindings outside
    the policies) as PL/pgSQL with the same signature, body, volatility and
    security; returns their signatures."""
    conn.execute("set search_path to pg_catalog")
    binding = _binding_statement(conn)
    binding_select = "(" + binding + ")" if binding is not None else None
    keep = _called_by_policies()
    rows = conn.execute(_SQL_FUNCTIONS_ON_TABLES).fetchall()
    done = []
    for (
        signature,
        arguments,
        result,
        returns_set,
        returns_record,
        volatility,
        definer,
        body,
        standard,
        out_names,
        name,
        parallel,
    ) in rows:
        statement = _plpgsql_body(str(body), bool(standard))
        if _BINDING_CALL.search(statement):
            if name in keep or binding_select is None:
                continue
            statement = _BINDING_CALL.sub(lambda _m: binding_select, statement)
        if returns_set:
            code = f"begin\n    return query\n{statement};\nend"
            declare = ""
        elif returns_record and out_names:
            code = f"begin\n{statement}\n    into {', '.join(out_names)};\nend"
            declare = ""
        else:
            code = f"begin\n{statement}\n    into v_result;\n    return v_result;\nend"
            declare = f"declare v_result {result};\n"
        qualified = signature.split("(", 1)[0]
        conn.execute(
            f"create or replace function {qualified}({arguments}) returns {result}\n"
            f"    language plpgsql {_VOLATILITY[str(volatility)]}"
            f" security {'definer' if definer else 'invoker'}"
            f"{' parallel safe' if parallel == 's' else ''}\n"
            "    set search_path to pg_catalog, pg_temp\n"
            f"as $citus$\n#variable_conflict use_column\n{declare}{code}\n$citus$"
        )
        done.append(str(signature))
    conn.execute("reset search_path")
    return done


_REWRITTEN_MARK = "-- (harbor-pg distribute: Citus form)"


def citus_functions(conn: psycopg.Connection[Any]) -> list[str]:
    """Give the harbor functions the form Citus can run (idempotent); returns the
    signatures of the PL/pgSQL twins made.

    - the PL/pgSQL twins (:func:`plpgsql_twins`);
    - ``plan_cache_mode = force_custom_plan`` where a function asks for generic
      plans: Citus cannot plan a multi-shard statement with unbound parameters
      ("could not create distributed plan");
    - SECURITY DEFINER functions owned by a role that cannot log in (the recall
      candidate legs, owned by harbor_search) become SECURITY INVOKER: Citus
      opens its worker connections as the current user, which such a role cannot
      be. The policies on the shards then hold their rows to the caller's (the
      legs apply the same visibility test again), so the guarantee stands. Not
      those of ``_WORKER_DEFINERS`` (``sql/citus/``), called on a worker alone;
    - the statement rewrites of :mod:`harbor_pg.db.citus_rewrites`;
    - the files of ``CITUS_FILES`` (``sql/citus/``), and the append's function
      (``sql/citus/append.sql``) registered to run on the worker of the tenant it names;
    - ``harbor.graph_min_vectors()`` returns 0: every vector goes in the HNSW graph,
      as before migration 0018 (a distributed database saves each memory by the
      per-row statements, which do not promote an owner key that grows; the rows
      already stored are put in the graph by :func:`distribute`).
    """
    _binding_on_placement(conn)
    # (recall's functions as one server runs them, for their twins on a shard: read
    # before anything below changes them)
    one_server = _one_server_forms(conn)
    twins = plpgsql_twins(conn)
    generic = conn.execute(
        "select p.oid::regprocedure::text from pg_proc p"
        " where p.pronamespace = 'harbor'::regnamespace"
        "   and 'plan_cache_mode=force_generic_plan' = any (p.proconfig)"
    ).fetchall()
    for (signature,) in generic:
        conn.execute(f"alter function {signature} set plan_cache_mode = force_custom_plan")
    definers = conn.execute(
        "select p.oid::regprocedure::text from pg_proc p join pg_roles r on r.oid = p.proowner"
        " where p.pronamespace = 'harbor'::regnamespace and p.prosecdef"
        "   and not r.rolcanlogin and p.proname <> all (%s)",
        (list(_WORKER_DEFINERS),),
    ).fetchall()
    for (signature,) in definers:
        conn.execute(f"alter function {signature} security invoker")
    binding = _binding_statement(conn)
    # (its table alias renamed: set_identity has a record variable named b)
    binding_select = (
        "("
        + re.sub(
            r"\bb\.|\b(role_bindings\w*) b\b",
            lambda m: "binding_row." if m.group(0) == "b." else f"{m.group(1)} binding_row",
            binding,
        )
        + ")"
        if binding is not None
        else None
    )
    # the PL/pgSQL functions that read the bindings through harbor._binding() (a
    # bound role's checks in set_identity and the bindings' trigger): Citus refuses
    # that SQL function's statement inside them as it does in an SQL function, so
    # they get its statement in place, as the twins do
    readers = conn.execute(
        "select p.oid from pg_proc p where p.pronamespace = 'harbor'::regnamespace"
        " and p.prolang = (select oid from pg_language where lanname = 'plpgsql')"
        " and strpos(p.prosrc, 'harbor._binding(') > 0"
    ).fetchall()
    oids = [
        oid
        for name in rewritten_functions()
        for (oid,) in conn.execute(
            "select p.oid from pg_proc p where p.pronamespace = 'harbor'::regnamespace"
            " and p.proname = %s",
            (name,),
        ).fetchall()
    ]
    for oid in dict.fromkeys([*oids, *(r[0] for r in readers)]):
        found = conn.execute(
            "select pg_get_functiondef(oid), proname::text from pg_proc where oid = %s", (oid,)
        ).fetchone()
        assert found is not None
        definition, name = str(found[0]), str(found[1])
        if _REWRITTEN_MARK in definition:
            continue  # (distribute run again: already in the Citus form)
        rewritten = rewrite(name, definition)
        if binding_select is not None and "LANGUAGE plpgsql" in rewritten:
            rewritten = _BINDING_CALL.sub(lambda _m: binding_select, rewritten)
        if rewritten != definition:
            conn.execute(rewritten.replace("AS $function$", "AS $function$\n" + _REWRITTEN_MARK, 1))
    _shard_twin_templates(conn, one_server)
    # the Citus forms kept as SQL files of their own (sql/citus/): the view
    # harbor.memory_history, whose recursive CTE Citus refuses, and the trigger that
    # stands for the superseded_by key's ON DELETE SET NULL
    # (the statements the delegated calls prepare on a worker connection are marked with
    # this version of the files: harbor._prepared_on_shard, sql/citus/delegated.sql)
    version = sqlfiles.idempotent_sha256()[:16]
    for file in CITUS_FILES:
        for statement in _statements(read_sql(file)):
            conn.execute(statement.replace(STATEMENTS_VERSION, version))
    conn.execute("select create_distributed_function('harbor._memory_history_citus()')")
    # whether global memories may exist, read on every node (sql/citus/global.sql)
    conn.execute("select create_distributed_function('harbor._global_memories_may_exist()')")
    conn.execute("select create_distributed_function('harbor._global_memory_written()')")
    # what the delegated calls do first, on every node (sql/citus/delegated.sql)
    conn.execute("select create_distributed_function('harbor._hold_tenant_shard(regclass, text)')")
    conn.execute(
        "select create_distributed_function("
        "'harbor._delegated_caller(text, regclass, text, text, text, text, text, text)')"
    )
    # the append's call goes whole to the tenant's worker (sql/citus/append.sql), inside a
    # transaction block too (force_delegation)
    conn.execute(
        "select create_distributed_function(%s, %s, colocate_with => %s, force_delegation => true)",
        (APPEND_FUNCTION, "p_tenant_id", "harbor.messages"),
    )
    # and the erasure's, in the transaction that deletes the subject's jobs (sql/citus/erase.sql)
    conn.execute(
        "select create_distributed_function(%s, %s, colocate_with => %s, force_delegation => true)",
        (ERASE_FUNCTION, "p_tenant_id", "harbor.memories"),
    )
    # the other delegated calls, sent in autocommit (in a transaction block they run on the
    # coordinator, as the statements they stand for do)
    for signature, table in DELEGATED_CALLS:
        conn.execute(
            "select create_distributed_function(%s, %s, colocate_with => %s)",
            (signature, "p_tenant_id", table),
        )
    if conn.execute("select to_regprocedure('harbor.graph_min_vectors()')").fetchone()[0]:  # type: ignore[index]
        conn.execute(
            "create or replace function harbor.graph_min_vectors() returns integer"
            " language sql immutable security invoker parallel safe return 0"
        )
    return twins


_VOLATILITY = {"v": "volatile", "s": "stable", "i": "immutable"}

#: recall's functions as a delegated recall runs them on the worker holding its tenant's shard
#: (sql/citus/recall.sql, harbor._recall_twin): their one-server forms again, as temporary
#: functions of the connection whose statements name the tenant's shard tables, each
#: ``<name>_on_shard_<shard>_<version>`` and calling the others by those names. A shard table is a
#: table of its own to PostgreSQL: what one server runs runs on it, and none of the Citus forms'
#: detours is needed there (recall's steps passed on as JSON between statements, the substring
#: fallback's read of the tenant's rows with the policy as the filter, where one server reads the
#: caller's owner keys: 0.9 ms a call on a shard of 12,500 rows). The candidate legs among them are
#: SECURITY DEFINER as on one server, owned by harbor_search (BYPASSRLS): made invoker, a leg read
#: under the shard's policies, and a policy's predicate comes before any of the query's that is not
#: leakproof, so the owner-terms index could not serve the lexical leg's term lookup, which
#: computed every tenant row's owner terms instead (measured on a worker: 19 ms against 0.6 ms for
#: a lookup of two terms). Every function recall calls that reads a co-located table has a twin:
#: the twins plan generically, as on one server, which Citus cannot do for a statement on a
#: distributed table ("could not create distributed plan").
_ON_SHARD = (
    "_lexical_candidates",
    "_dense_candidates",
    "_substring_matches",
    "_decayed_importance",
    "recall",
    # a delegated profile's (sql/citus/profile.sql), made with recall's: the owner keys'
    # memories and their recall counts read on the shard tables, not through Citus's
    # planning of each statement on the worker
    "_owner_memories",
    "_memory_hits_of",
    "profile",
)
#: (the candidate legs: definers on one server)
_ON_SHARD_DEFINERS = ("_lexical_candidates", "_dense_candidates")

#: the placeholders of the shard twins' templates: the twins' name suffix (the shard and
#: the templates' version) and each co-located table (its shard's name)
_TWIN_SUFFIX = "@@suffix@@"
_TWIN_TABLE = re.compile(
    r"(?<![':.\w])(" + "|".join(re.escape(t) for t in CO_LOCATED) + r")(?![\w])"
)


def shard_twin_templates(definitions: dict[str, str]) -> list[str]:
    """The CREATE FUNCTION statements of recall's twins on one shard (temporary
    functions of the connection that runs them), from the one-server forms of
    :data:`_ON_SHARD` (``name -> pg_get_functiondef``, every name qualified; the Citus
    forms serve as well, where a database has no other): each named
    ``pg_temp.<name>_on_shard_@@suffix@@`` and calling the others by those names, each
    co-located table as ``@@harbor.<table>@@`` (its shard's name, filled in at the
    call), the legs SECURITY DEFINER, with the generic plans of one server (a Citus
    form asks for custom plans, which Citus needs to prune a statement to its shards: a
    shard table needs no pruning). Table names in string literals or casts (a regclass,
    a row type) stay."""
    calls = re.compile(r"\bharbor\.(" + "|".join(map(re.escape, _ON_SHARD)) + r")\(")
    out = []
    for name in _ON_SHARD:
        text = definitions[name]
        header = f"CREATE OR REPLACE FUNCTION harbor.{name}("
        if not text.startswith(header) or "\nAS $function$" not in text:
            raise MemoryConfigurationError(f"harbor.{name}: unexpected definition")
        twin = f"{name}_on_shard_{_TWIN_SUFFIX}"
        text = f"CREATE FUNCTION pg_temp.{twin}(" + text[len(header) :]
        text = calls.sub(lambda m: f"pg_temp.{m.group(1)}_on_shard_{_TWIN_SUFFIX}(", text)
        # its parameters and variables qualified by the function's name (recall.top_k)
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\.(?=[a-z_])", f"{twin}.", text)
        text = _TWIN_TABLE.sub(lambda m: f"@@{m.group(1)}@@", text)
        text = text.replace(
            "SET plan_cache_mode TO 'force_custom_plan'",
            "SET plan_cache_mode TO 'force_generic_plan'",
        )
        if name in _ON_SHARD_DEFINERS and " SECURITY DEFINER" not in text.split("AS $function$")[0]:
            text = text.replace("\nAS $function$", "\n SECURITY DEFINER\nAS $function$", 1)
        out.append(text)
    return out


def _on_shard_definitions(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """``pg_get_functiondef`` of each of :data:`_ON_SHARD`, every name in it qualified."""
    # (every name in the definitions qualified: they are run with pg_catalog alone)
    conn.execute("set search_path to pg_catalog")
    definitions = {
        str(name): str(text)
        for name, text in conn.execute(
            "select p.proname::text, pg_get_functiondef(p.oid) from pg_proc p"
            " where p.pronamespace = 'harbor'::regnamespace and p.proname = any (%s)",
            (list(_ON_SHARD),),
        ).fetchall()
    }
    conn.execute("reset search_path")
    return definitions


def _one_server_forms(conn: psycopg.Connection[Any]) -> dict[str, str] | None:
    """The definitions of :data:`_ON_SHARD` when each is still its one-server form (the
    single-server files just applied them: no Citus form's mark, no custom plans, the
    legs definers), else None (distribute run again, the Citus forms in place)."""
    definitions = _on_shard_definitions(conn)
    if sorted(definitions) != sorted(_ON_SHARD):
        return None
    for name, text in definitions.items():
        header = text.split("AS $function$")[0]
        if (
            _REWRITTEN_MARK in text
            or "force_custom_plan" in header
            or (name in _ON_SHARD_DEFINERS and " SECURITY DEFINER" not in header)
        ):
            return None
    return definitions


def _shard_twin_templates(
    conn: psycopg.Connection[Any], one_server: dict[str, str] | None = None
) -> None:
    """``harbor._recall_twin_templates()``: the templates of :func:`shard_twin_templates`
    for the one-server forms read before the Citus forms replaced them (``one_server``),
    their version (a hash of them) first, then each twin's name (without its suffix) and
    template; what ``harbor._recall_twin()`` (sql/citus/recall.sql) fills in on a
    worker. Without them (distribute run again over the Citus forms) the templates made
    then stay; made from the Citus forms only when there are none."""
    if one_server is None:
        made = conn.execute("select to_regprocedure('harbor._recall_twin_templates()')").fetchone()
        if made is not None and made[0] is not None:
            return
    definitions = one_server if one_server is not None else _on_shard_definitions(conn)
    if sorted(definitions) != sorted(_ON_SHARD):
        raise MemoryConfigurationError(f"recall's twins: found {sorted(definitions)}")
    templates = shard_twin_templates(definitions)
    version = hashlib.sha256("\0".join(templates).encode()).hexdigest()[:8]
    quote = "$harbor_twin$"
    if any(quote in t for t in templates):
        raise MemoryConfigurationError("recall's twins: a template holds the quote $harbor_twin$")
    named = [
        x
        for name, text in zip(_ON_SHARD, templates, strict=True)
        for x in (f"{name}_on_shard", text)
    ]
    items = ",\n".join(f"{quote}{t}{quote}" for t in [version, *named])
    conn.execute(
        "create or replace function harbor._recall_twin_templates() returns text[]"
        " language sql immutable security invoker parallel safe"
        f" return array[{items}]"
    )
    conn.execute("alter function harbor._recall_twin_templates() owner to harbor_owner")
    conn.execute("select create_distributed_function('harbor._recall_twin_templates()')")
    conn.execute("revoke all on function harbor._recall_twin_templates() from public")
    conn.execute("grant execute on function harbor._recall_twin_templates() to harbor_search")


#: definers owned by a NOLOGIN role that stay definers: called by a delegated call on
#: the worker holding its tenant's shard, their statements run on that shard (Citus's
#: local execution, or the shard table itself), with no connection opened as their
#: owner (sql/citus/append.sql, recall.sql)
_WORKER_DEFINERS = ("_delegated_session_turns", "_recall_twin")


#: the append in one call Citus delegates to the tenant's worker (sql/citus/append.sql)
APPEND_FUNCTION = (
    "harbor.append_turn(text, text, text, text, text, text, harbor.message_role, text, text,"
    " jsonb, text, jsonb, integer, bigint, double precision)"
)
#: an erasure in one call Citus delegates to the tenant's worker, inside the transaction
#: that deletes the subject's jobs from the coordinator's queue (sql/citus/erase.sql)
ERASE_FUNCTION = "harbor.erase_delegated(text, text, text, text, text, text, text, text, text)"

#: recall in one call Citus delegates to the tenant's worker (sql/citus/recall.sql)
RECALL_FUNCTION = (
    "harbor.recall_delegated(text, text, text, text, text, text, text, public.vector, text,"
    " harbor.memory_scope[], integer, text[], harbor.memory_type[], timestamptz,"
    " double precision, double precision, double precision, integer, double precision,"
    " integer, integer, double precision, double precision, text, harbor.sensitivity,"
    " double precision, double precision, double precision, harbor.memory_type[])"
)

#: a lexical search in one call Citus delegates to the tenant's worker (sql/citus/search.sql)
SEARCH_FUNCTION = (
    "harbor.search_delegated(text, text, text, text, text, text, text, timestamptz, integer)"
)

#: a session's newest turns in one call Citus delegates to the tenant's worker
#: (sql/citus/recent.sql)
RECENT_FUNCTION = (
    "harbor.recent_turns_delegated(text, text, text, text, text, text, integer, double precision)"
)

#: a batch's save in one call Citus delegates to the tenant's worker (sql/citus/save.sql)
SAVE_MANY_FUNCTION = (
    "harbor.save_memories_delegated(text, text, text, text, text, text, text[],"
    " harbor.memory_scope[], text[], text[], text[], text[], text[], harbor.memory_type[],"
    " real[], text[], text[], text[], jsonb[], text[], harbor.sensitivity[], text[], jsonb[],"
    " jsonb[], timestamptz[], timestamptz[], text, public.vector[], public.vector[])"
)

#: the elevated role's save of TENANT memories (one, or a batch) in one call Citus
#: delegates to the tenant's worker (sql/citus/save.sql)
SAVE_TENANT_FUNCTION = (
    "harbor.save_tenant_memories_delegated(text, text, text, text, text, text, text[],"
    " harbor.memory_scope[], text[], text[], text[], text[], text[], harbor.memory_type[],"
    " real[], text[], text[], text[], jsonb[], text[], harbor.sensitivity[], text[], jsonb[],"
    " jsonb[], timestamptz[], timestamptz[], text, public.vector[], public.vector[])"
)

#: a session's rolling summary read in one call Citus delegates to the tenant's worker
#: (sql/citus/summary.sql)
SUMMARY_FUNCTION = "harbor.session_summary_delegated(text, text, text, text, text, text)"

#: a run's working state read in one call Citus delegates to the tenant's worker
#: (sql/citus/working.sql)
WORKING_FUNCTION = "harbor.working_state_delegated(text, text, text, text, text, text)"
#: a run's working state written in one call Citus delegates to the tenant's worker
#: (sql/citus/working.sql)
WORKING_UPDATE_FUNCTION = (
    "harbor.working_update_delegated(text, text, text, text, text, text, jsonb, double precision)"
)

#: memories read by id, the caller's tenant's, in one call Citus delegates to the tenant's
#: worker (sql/citus/get.sql)
GET_FUNCTION = "harbor.get_memories_delegated(text, text, text, text, text, text, text[])"

#: the caller's current memories in one call Citus delegates to the tenant's worker
#: (sql/citus/current.sql)
CURRENT_FUNCTION = (
    "harbor.current_memories_delegated(text, text, text, text, text, text, text, text, text,"
    " text, integer)"
)

#: a user's profile in one call Citus delegates to the tenant's worker (sql/citus/profile.sql)
PROFILE_FUNCTION = (
    "harbor.profile_delegated(text, text, text, text, text, text, harbor.memory_scope[],"
    " integer, interval, timestamptz, harbor.sensitivity)"
)

#: one of the caller's memories deleted in one call Citus delegates to the tenant's worker
#: (sql/citus/delete.sql)
DELETE_FUNCTION = "harbor.delete_memory_delegated(text, text, text, text, text, text, text)"

#: a session's turns deleted in one call Citus delegates to the tenant's worker
#: (sql/citus/clear.sql)
CLEAR_SESSION_FUNCTION = "harbor.clear_session_delegated(text, text, text, text, text, text)"
#: a run's working state deleted in one call Citus delegates to the tenant's worker
#: (sql/citus/clear.sql)
CLEAR_WORKING_FUNCTION = "harbor.clear_working_delegated(text, text, text, text, text, text)"

#: a session's rolling summary written in one call Citus delegates to the tenant's worker
#: (sql/citus/summary_write.sql)
SUMMARY_WRITE_FUNCTION = (
    "harbor.save_summary_delegated(text, text, text, text, text, text, text, real, text, text,"
    " text[], jsonb, text, boolean, bigint)"
)

#: a consolidation in one call Citus delegates to the tenant's worker
#: (sql/citus/consolidate.sql)
CONSOLIDATE_FUNCTION = (
    "harbor.consolidate_delegated(text, text, text, text, text, text, harbor.memory_scope[],"
    " double precision, text, integer, boolean, timestamptz, jsonb)"
)

#: a memory's history, the caller's tenant's chain, in one call Citus delegates to the
#: tenant's worker (sql/citus/history.sql)
HISTORY_FUNCTION = "harbor.memory_history_delegated(text, text, text, text, text, text, text)"

#: a session's summary lease taken, and finished or released, each in one call Citus
#: delegates to the tenant's worker (sql/citus/lease.sql)
LEASE_ACQUIRE_FUNCTION = (
    "harbor.summary_lease_acquire_delegated(text, text, text, text, text, text, bigint,"
    " double precision, double precision)"
)
LEASE_END_FUNCTION = (
    "harbor.summary_lease_end_delegated(text, text, text, text, text, text, timestamptz, bigint)"
)
#: a current memory closed with no successor in one call Citus delegates to the tenant's
#: worker (sql/citus/close.sql)
CLOSE_FUNCTION = (
    "harbor.close_memory_delegated(text, text, text, text, text, text, harbor.memory_scope,"
    " text, text, text, text, text)"
)
#: a page of a session's turns after a cursor id, and the newest turns up to one, each
#: in one call Citus delegates to the tenant's worker (sql/citus/turns.sql)
MESSAGES_AFTER_FUNCTION = (
    "harbor.messages_after_delegated(text, text, text, text, text, text, bigint, bigint, integer)"
)
TURNS_THROUGH_FUNCTION = (
    "harbor.turns_through_delegated(text, text, text, text, text, text, bigint, integer)"
)
#: whether a session is due a background summary (read only), in one call Citus delegates
#: to the tenant's worker (sql/citus/lease.sql)
SUMMARY_DUE_FUNCTION = (
    "harbor.summary_due_delegated(text, text, text, text, text, text, bigint, double precision)"
)
#: the caller's memories past their expiry closed in one call Citus delegates to the
#: tenant's worker (sql/citus/expire.sql)
EXPIRE_FUNCTION = "harbor.expire_memories_delegated(text, text, text, text, text, text)"
#: an extracted fact's write (the gate, the supersede or the insert, and their guards) in
#: one call Citus delegates to the tenant's worker (sql/citus/fact.sql)
FACT_FUNCTION = (
    "harbor.add_fact_delegated(text, text, text, text, text, text, harbor.memory_scope, text,"
    " text, text, text, text, text, harbor.memory_type, real, text, text, text, text[], text,"
    " harbor.sensitivity, text, text[], jsonb, timestamptz, text, integer, public.vector,"
    " double precision, text[], text, boolean, bigint, text[])"
)

#: a recall's hits counted (importance decay) in one call Citus delegates to the tenant's
#: worker (sql/citus/hits.sql)
HITS_FUNCTION = "harbor.record_hits_delegated(text, text, text, text, text, text, text[])"

#: a memory's save in one call Citus delegates to the tenant's worker (sql/citus/save.sql)
SAVE_FUNCTION = (
    "harbor.save_memory_delegated(text, text, text, text, text, text, text,"
    " harbor.memory_scope, text, text, text, text, text, harbor.memory_type, real, text,"
    " text, text, text[], text, harbor.sensitivity, text, text[], jsonb, timestamptz,"
    " timestamptz, text, public.vector, public.vector)"
)


#: the calls Citus delegates to the tenant's worker when sent in autocommit (beside the
#: append, delegated inside a transaction block too): each signature and the table it is
#: co-located with (its distribution argument is p_tenant_id)
DELEGATED_CALLS: tuple[tuple[str, str], ...] = (
    (RECALL_FUNCTION, "harbor.memories"),  # sql/citus/recall.sql
    (SAVE_FUNCTION, "harbor.memories"),  # sql/citus/save.sql
    (SAVE_MANY_FUNCTION, "harbor.memories"),  # sql/citus/save.sql
    (SAVE_TENANT_FUNCTION, "harbor.memories"),  # sql/citus/save.sql
    (SEARCH_FUNCTION, "harbor.memories"),  # sql/citus/search.sql
    (RECENT_FUNCTION, "harbor.messages"),  # sql/citus/recent.sql
    (SUMMARY_FUNCTION, "harbor.memories"),  # sql/citus/summary.sql
    (WORKING_FUNCTION, "harbor.working_state"),  # sql/citus/working.sql
    (WORKING_UPDATE_FUNCTION, "harbor.working_state"),  # sql/citus/working.sql
    (GET_FUNCTION, "harbor.memories"),  # sql/citus/get.sql
    (CURRENT_FUNCTION, "harbor.memories"),  # sql/citus/current.sql
    (PROFILE_FUNCTION, "harbor.memories"),  # sql/citus/profile.sql
    (DELETE_FUNCTION, "harbor.memories"),  # sql/citus/delete.sql
    (CLEAR_SESSION_FUNCTION, "harbor.messages"),  # sql/citus/clear.sql
    (CLEAR_WORKING_FUNCTION, "harbor.working_state"),  # sql/citus/clear.sql
    (SUMMARY_WRITE_FUNCTION, "harbor.memories"),  # sql/citus/summary_write.sql
    (CONSOLIDATE_FUNCTION, "harbor.memories"),  # sql/citus/consolidate.sql
    (HISTORY_FUNCTION, "harbor.memories"),  # sql/citus/history.sql
    (LEASE_ACQUIRE_FUNCTION, "harbor.session_state"),  # sql/citus/lease.sql
    (LEASE_END_FUNCTION, "harbor.session_state"),  # sql/citus/lease.sql
    (SUMMARY_DUE_FUNCTION, "harbor.session_state"),  # sql/citus/lease.sql
    (CLOSE_FUNCTION, "harbor.memories"),  # sql/citus/close.sql
    (MESSAGES_AFTER_FUNCTION, "harbor.messages"),  # sql/citus/turns.sql
    (TURNS_THROUGH_FUNCTION, "harbor.messages"),  # sql/citus/turns.sql
    (EXPIRE_FUNCTION, "harbor.memories"),  # sql/citus/expire.sql
    (FACT_FUNCTION, "harbor.memories"),  # sql/citus/fact.sql
    (HITS_FUNCTION, "harbor.memories"),  # sql/citus/hits.sql
)

# harbor._binding() on Citus: the single-server statement (sql/functions/identity.sql)
# reading the node's own placement of the bindings, in a string body written fully
# qualified (parsed at call time: no caller's search_path can redirect a name in it).
# A string body records no dependency on the shard, so Citus forwards the function
# to the workers itself, in the same transaction (a function depending on a shard is
# not forwarded, and a separate connection to each worker would wait on this
# transaction's own locks when `harbor-pg migrate` re-applies it).
_BINDING_ON_PLACEMENT = """create or replace function harbor._binding(
    out tenant_id text, out project_id text, out user_id text)
    returns setof record
    language sql stable security invoker parallel safe
as $citus$
select b.tenant_id, b.project_id, b.user_id
  from {placement} b
 where b.role_name operator(pg_catalog.=) any (array[session_user, current_user,
           nullif(pg_catalog.current_setting('role'), 'none')::pg_catalog.name])
 order by (b.role_name operator(pg_catalog.=) session_user) desc
 limit 1
$citus$"""
# what the single-server body must still say for the form above to be its equal
_BINDING_SHAPE = re.compile(
    r"SELECT b\.tenant_id,\s+b\.project_id,\s+b\.user_id\s+FROM harbor\.role_bindings b\s+"
    r"WHERE \(b\.role_name = ANY \(ARRAY\[SESSION_USER, CURRENT_USER, \(NULLIF\("
    r"current_setting\('role'::text\), 'none'::text\)\)::name\]\)\)\s+"
    r"ORDER BY \(b\.role_name = SESSION_USER\) DESC\s+LIMIT 1",
)


def _binding_on_placement(conn: psycopg.Connection[Any]) -> None:
    """``harbor._binding()`` reads the node's own placement of the bindings.

    Called from the identity functions, so from the policies, on every node: there
    Citus reads ``harbor.role_bindings`` inside an SQL function as the coordinator's
    empty shell table (a bound role then had no binding at all: it fell back to the
    session's settings, so ``SET LOCAL harbor.tenant_id`` gave it any tenant), and in
    PL/pgSQL it refuses the read inside a query on a shard. A reference table has
    one shard, placed on every node under the same name: read as a plain local
    table, it is the binding on every node.
    """
    row = conn.execute(
        "select shard_name::text from citus_shards where table_name = %s::regclass limit 1",
        (REFERENCE,),
    ).fetchone()
    if row is None:
        return
    found = conn.execute("select pg_get_functiondef('harbor._binding'::regproc)").fetchone()
    definition = str(found[0]) if found else ""
    if f"from {row[0]} b" in definition:
        return  # (distribute run again: already in the Citus form)
    if not _BINDING_SHAPE.search(definition):
        raise MemoryConfigurationError(
            "harbor._binding() is no longer the statement harbor_pg.db.citus gives a Citus form"
        )
    conn.execute(_BINDING_ON_PLACEMENT.format(placement=row[0]))


def _check(conn: psycopg.Connection[Any]) -> None:
    has = conn.execute(
        "select exists (select 1 from pg_extension where extname = 'citus'),"
        " to_regclass('harbor.memories') is not null,"
        " (select rolsuper from pg_roles where rolname = current_user)"
    ).fetchone()
    assert has is not None
    citus, migrated, superuser = has
    where = conn.info.dbname
    if not citus:
        raise MemoryConfigurationError(
            f"database {where!r} has no citus extension: create it (create extension citus) on "
            "the coordinator and every worker, then add the workers (citus_add_node)"
        )
    if not migrated:
        raise MemoryConfigurationError(
            f"database {where!r} has no harbor schema: run `harbor-pg migrate` first"
        )
    if not superuser:
        raise MemoryConfigurationError("harbor-pg distribute needs a superuser login")
    workers = conn.execute("select count(*) from citus_get_active_worker_nodes()").fetchone()
    if not workers or not workers[0]:
        raise MemoryConfigurationError(
            f"database {where!r} on this coordinator has no workers: add them with "
            "select citus_add_node(host, port)"
        )


def unsafe_bindings(conn: psycopg.Connection[Any]) -> list[tuple[str, str, list[str]]]:
    """The bound roles that can ``SET ROLE`` to another role with harbor-pg rights (a
    harbor-pg role or a member of one): (tenant, role, the roles it can become). On
    Citus such a role leaves its binding that way."""
    return [(str(t), str(r), list(s)) for t, r, s in conn.execute(query("citus_unsafe_bindings"))]


def _refuse_unsafe_bindings(conn: psycopg.Connection[Any]) -> None:
    unsafe = unsafe_bindings(conn)
    if unsafe:
        roles = ", ".join(f"{r} (tenant {t!r}: can SET ROLE {'/'.join(s)})" for t, r, s in unsafe)
        raise MemoryConfigurationError(
            f"bound roles that can SET ROLE to a role with harbor-pg rights: {roles}. On Citus"
            " the worker connections are opened as the current user, so such a role would leave its"
            " binding; grant them without SET (GRANT harbor_app TO <role> WITH INHERIT TRUE,"
            " SET FALSE) and run distribute again (docs/citus.md)"
        )


def _relax_superseded_fk(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "select pg_get_constraintdef(oid) from pg_constraint"
        " where conname = %s and conrelid = 'harbor.memories'::regclass",
        (_SUPERSEDED_FK,),
    ).fetchone()
    if row is None:
        return
    definition = re.sub(r"\s+ON DELETE SET NULL(\s*\([^)]*\))?", "", str(row[0]))
    conn.execute(f"alter table harbor.memories drop constraint {_SUPERSEDED_FK}")
    conn.execute(f"alter table harbor.memories add constraint {_SUPERSEDED_FK} {definition}")


def _apply_policy_file(conn: psycopg.Connection[Any], name: str, text: str) -> None:
    derived = citus_policies(text)
    if name == "policies/policies.sql":
        # one statement at a time: Citus sends a policy's statement text to the workers
        for statement in _statements(derived):
            conn.execute(statement)
    else:
        conn.execute(derived)  # (a DO block: Citus propagates each statement in it)


def _apply_policies(conn: psycopg.Connection[Any]) -> None:
    for name in _POLICY_FILES:
        _apply_policy_file(conn, name, read_sql(name))


def apply_idempotent(conn: psycopg.Connection[Any], files: Iterable[tuple[str, str]]) -> None:
    """Apply the re-runnable SQL files on a distributed database (what ``harbor-pg
    migrate`` does there): the policies in the form :func:`citus_policies` gives,
    the others as they are, then the functions given the form Citus runs
    (:func:`citus_functions`, which the single-server files just replaced)."""
    for name, text in files:
        if name in _POLICY_FILES:
            _apply_policy_file(conn, name, text)
        else:
            # one statement at a time: Citus forwards some statements to the workers
            # as the text it was given, which must then be one statement
            for statement in _statements(text):
                conn.execute(statement)
    _propagate_functions(conn)
    citus_functions(conn)
