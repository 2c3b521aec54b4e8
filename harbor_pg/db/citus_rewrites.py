"""The statement rewrites that give harbor's single-server functions the form Citus can
run, applied by :func:`harbor_pg.db.citus.citus_functions` to each function's catalog
definition (``pg_get_functiondef``), so the SQL files under ``sql/functions/`` stay
single-server and the two cannot drift.

Each entry of :data:`REWRITES` names the function it applies to (by name, whichever
file under ``sql/functions/`` defines it), a pattern and its replacement;
:func:`rewrite` applies a function's entries in order
(``tests/unit/test_citus_rewrites.py`` checks that each still matches).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from harbor_pg.errors import MemoryConfigurationError

__all__ = ["REWRITES", "rewrite", "rewritten_functions"]

# Statements of the single-server functions that Citus cannot plan or route, each
# with the form it can: (function, pattern, replacement). A pattern that no longer
# matches (the function was rewritten) leaves that statement as it is (recall then
# still answers, and the routing test in tests/citus says it is no longer routed).
#
# Routing: the candidate legs select the caller's rows by joining the owner keys
# of harbor._recall_keys() to the tables, which Citus cannot prune on; each such
# statement gets a literal predicate on the distribution column, the tenants the
# requested scopes can address: the caller's, and '' only with the global scope.
# Under custom plans the CASE folds to a constant array, so a call without the
# global scope reads one shard (the tenant's), with it two.
# The entries share one shape on purpose: a table of (function, pattern,
# replacement), one entry a statement.
_TENANTS = "(case when 'global' = any ({scopes}) then array['', {tenant}] else array[{tenant}] end)"
_LEG = _TENANTS.format(scopes="p_scopes", tenant="v_tenant")
REWRITES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    # harbor.set_identity: Citus forwards SET LOCAL (also one a function executes) to
    # the workers of the transaction, and never set_config(); each setting is also
    # made with SET LOCAL, so inside a transaction block the identity reaches every
    # worker for the rest of the transaction, whatever is_local says (a session-level
    # identity still holds on the coordinator only: the workers see none after the
    # transaction, and fail closed)
    (
        "set_identity",
        re.compile(r"perform set_config\('(harbor\.\w+)', (.+?), is_local\);"),
        r"perform set_config('\1', \2, is_local);"
        "\n    execute pg_catalog.format('set local \\1 = %L', \\2);",
    ),
    # harbor.erase lists the versions to reopen in harbor.erase_reopen, which the add-only
    # guard reads where the erased successor's row is deleted: on its shard's worker. As
    # for set_identity, each set_config of it is also made with SET LOCAL, so the workers
    # of the transaction see the list (and then its clearing)
    (
        "erase",
        re.compile(
            r"perform pg_catalog\.set_config\('harbor\.erase_reopen',.*?, true\);", re.DOTALL
        ),
        "\\g<0>\n    execute pg_catalog.format('set local harbor.erase_reopen = %L',"
        " pg_catalog.current_setting('harbor.erase_reopen'));",
    ),
    # the bindings' trigger fires on each placement of the reference table; there a
    # LOCK of the Citus table is sent to every node from inside a shard's statement
    # ("failure on connection marked as essential"): it locks its own placement
    # instead (bind_role locks the Citus table first, on every node, so binds still
    # take turns; a direct insert is serialised by Citus's lock on the shard)
    (
        "_role_binding_one_tenant",
        re.compile(r"lock table harbor\.role_bindings in share row exclusive mode;"),
        "execute pg_catalog.format('lock table %s in share row exclusive mode',"
        " tg_relid::regclass);",
    ),
    # ... and refuses to bind a role that can SET ROLE to another role holding harbor-pg
    # rights (a harbor-pg role, or any member of one: another bound role, an unbound
    # login granted harbor_app): Citus opens the worker connections as the current
    # user, so after SET ROLE the role would reach the workers as that role, out of its
    # binding (one server keeps the binding: it is looked up by the session's login).
    # The same test as query citus_unsafe_bindings (sql/queries/citus.sql)
    (
        "_role_binding_one_tenant",
        re.compile(r"(own roles never\.';\s*end if;)"),
        r"\1"
        "\n    if exists (select 1 from pg_catalog.pg_roles r, pg_catalog.pg_roles x"
        "\n                where r.rolname = new.role_name and x.oid <> r.oid"
        "\n                  and pg_catalog.pg_has_role(r.oid, x.oid, 'SET')"
        "\n                  and exists (select 1 from pg_catalog.pg_roles h"
        "\n                               where h.rolname in ('harbor_owner', 'harbor_app',"
        " 'harbor_admin', 'harbor_search')"
        "\n                                 and pg_catalog.pg_has_role(x.oid, h.oid, 'MEMBER')))"
        " then"
        "\n        raise exception 'harbor.bind_role: role % can SET ROLE to a role with harbor-pg"
        " rights, which on Citus takes it out of its binding', new.role_name"
        "\n            using errcode = '42501',"
        "\n                  hint = 'Grant it harbor_app without SET (GRANT harbor_app TO"
        " ... WITH INHERIT TRUE, SET FALSE), and no other role that has harbor-pg rights"
        " with SET, then bind it.';"
        "\n    end if;",
    ),
    # recall's hydration: a LATERAL probe with OFFSET 0 over a CTE ("Offset clause is
    # currently unsupported when a lateral subquery references ... CTEs") becomes a
    # join on the distribution column and the id (the same rows: the probe's tenant
    # test was the join's). The split below then replaces the join by the top_k's rows
    # read in a routed statement of their own
    (
        "recall",
        re.compile(
            r"cross join lateral \(\s*select (\w+)\.\* from harbor\.memories \1"
            r" where \1\.id = (\w+)\.memory_id offset 0\) (\w+)"
            r"\s+where \3\.tenant_id = \2\.tenant_id",
            re.IGNORECASE,
        ),
        r"join harbor.memories \3 on \3.tenant_id = \2.tenant_id and \3.id = \2.memory_id"
        "\n         where true",
    ),
    # recall's hydration routed to the tenant's shard: the statement is split in two.
    # The first runs the legs and fuses their candidates into a jsonb value; the second
    # reads them back (a function in FROM: no distributed table), ranks them and joins
    # them to harbor.memories with a literal tenant predicate, so Citus routes it whole
    # to the tenant's worker, one task (and the '' shard too with the global scope). In
    # one statement the tenant predicate made the whole statement, leg calls included,
    # one router query sent to the worker, where the legs' own statements are refused as nested
    # distributed queries ("cannot execute a distributed query from a query on a shard").
    # The second is split again: the ranking, up to the top_k with every signal, into
    # a jsonb value too, in a statement that reads no distributed table (PostgreSQL
    # alone plans it; Citus's planner passes it by), then the hydration and the token
    # budget, whose rows are read first by a short statement, the only one of the
    # three Citus plans (and routes). Ranking and hydration in one statement of about
    # 200 lines, Citus planned it on every call (custom plans): split so, a recall of
    # benchmarks/citus.py took 12.0-12.2 ms at p50 against 16.4-17.0 ms (ranked apart
    # with the hydration's join routed: 12.7-13.8 ms). What the ranking read of
    # harbor.memory_hits (the importance decay) is read before it, in a short routed
    # statement run only when needed (the substring fallback's rows carry their context
    # keys, as the legs' do)
    (
        "recall",
        re.compile(r"\n(\s*)v_years  integer\[\];[^\n]*"),
        "\\g<0>\n\\1v_candidates jsonb;  -- (Citus: the candidates, between the two statements)"
        "\n\\1v_hits jsonb;  -- (Citus: the candidates' last recall, for the importance decay)"
        "\n\\1v_ranked jsonb;  -- (Citus: the top_k ranked, between the ranking and the hydration)"
        "\n\\1v_ids text[];  -- (Citus: their ids)"
        "\n\\1v_rows jsonb;  -- (Citus: their rows, read by the hydration's routed statement)"
        "\n\\1v_tenant text := harbor.caller_tenant();",
    ),
    (
        "recall",
        re.compile(r"\n(\s*)return query\n(\s*)with lexical as materialized \("),
        "\n\\1select coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(c)), '[]'::jsonb)"
        " into v_candidates from (\n\\2with lexical as materialized (",
    ),
    (
        "recall",
        re.compile(r"\n(\s*)\), linked as \("),
        "\n\\1)\n\\1select * from candidates) c;"
        # the candidates' hits, a short statement routed by the tenant predicate, run
        # only when needed
        "\n\\1if recall.importance_half_life_hours is not null then"
        "\n\\1    select pg_catalog.jsonb_object_agg("
        "pg_catalog.jsonb_build_array(h.tenant_id, h.memory_id)::text, h.last_recalled_at)"
        " into v_hits"
        "\n\\1      from pg_catalog.jsonb_to_recordset(v_candidates)"
        " as c(tenant_id text, memory_id text)"
        "\n\\1      join harbor.memory_hits h on h.tenant_id = c.tenant_id"
        " and h.memory_id = c.memory_id and h.tenant_id = any "
        + _TENANTS.format(scopes="recall.scopes", tenant="v_tenant")
        + ";\n\\1end if;"
        "\n\\1select coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)), '[]'::jsonb),"
        " pg_catalog.array_agg(r.memory_id) into v_ranked, v_ids from ("
        "\n\\1with candidates as (\n\\1"
        "    select * from pg_catalog.jsonb_to_recordset(v_candidates) as x(tenant_id text,"
        " memory_id text, dense_rank integer, similarity double precision,"
        " lexical_rank integer, lexical_score double precision, substring_match boolean,"
        " relevance double precision, scope harbor.memory_scope,"
        " memory_type harbor.memory_type, importance real, valid_from timestamptz,"
        " content_hash text, entity_ids text[], context_key text)"
        "\n\\1), linked as (",
    ),
    # the ranking ends at `ranked`, the top_k kept in v_ranked; the hydration reads them
    # back
    (
        "recall",
        re.compile(r"\n(\s*)\), hydrated as \("),
        "\n\\1)\n\\1select r.tenant_id, r.memory_id, r.dense_rank, r.similarity, r.lexical_rank,"
        " r.lexical_score, r.substring_match, r.relevance, r.recency, r.entity, r.type_boost,"
        " r.score, r.pos, r.neighbour, r.date_match from ranked r) r;"
        # the rows of the top_k, as the invoker (the policies apply), in a statement on
        # harbor.memories alone with the tenant as its distribution column's value, which
        # Citus plans on its fast path; the hydration then joins them to v_ranked in a
        # statement of no distributed table (that join routed to the shard instead: a
        # benchmark recall 13.3-13.8 ms at p50, against 12.0-12.2)
        "\n\\1if 'global' = any (recall.scopes) then"
        "\n\\1    select pg_catalog.jsonb_agg(pg_catalog.to_jsonb(m) operator(pg_catalog.-) 'fts')"
        " into v_rows from harbor.memories m"
        "\n\\1     where m.tenant_id = any (array['', v_tenant]) and m.id = any (v_ids);"
        "\n\\1else"
        "\n\\1    select pg_catalog.jsonb_agg(pg_catalog.to_jsonb(m) operator(pg_catalog.-) 'fts')"
        " into v_rows from harbor.memories m"
        "\n\\1     where m.tenant_id = v_tenant and m.id = any (v_ids);"
        "\n\\1end if;"
        "\n\\1return query\n\\1with ranked as (\n\\1"
        "    select * from pg_catalog.jsonb_to_recordset(v_ranked) as x(tenant_id text,"
        " memory_id text, dense_rank integer, similarity double precision,"
        " lexical_rank integer, lexical_score double precision, substring_match boolean,"
        " relevance double precision, recency double precision, entity double precision,"
        " type_boost double precision, score double precision, pos bigint,"
        " neighbour double precision, date_match double precision)"
        "\n\\1), hydrated as (",
    ),
    # the hydration joins the rows read back (v_rows): its statement reads no
    # distributed table either
    (
        "recall",
        re.compile(
            r"join harbor\.memories m on m\.tenant_id = r\.tenant_id and m\.id = r\.memory_id"
        ),
        "join pg_catalog.jsonb_populate_recordset(null::harbor.memories, v_rows) m"
        " on m.tenant_id = r.tenant_id and m.id = r.memory_id",
    ),
    # recall's importance decay reads a candidate's hits (harbor.memory_hits) through
    # harbor._decayed_importance(), which on a worker would be a distributed query from a
    # query on a shard: its expression inline instead, the last recall looked up in
    # v_hits (the candidates' hits, read with the tenant predicate before the ranking;
    # none: null, as the subquery's)
    (
        "recall",
        re.compile(
            r"harbor\._decayed_importance\(c\.tenant_id, c\.memory_id, c\.importance,\s+"
            r"c\.valid_from, v_as_of,\s+recall\.importance_half_life_hours\)"
        ),
        "c.importance * pg_catalog.power(0.5::double precision, least(greatest("
        "pg_catalog.date_part('epoch', v_as_of - greatest(c.valid_from,"
        " (v_hits ->> pg_catalog.jsonb_build_array(c.tenant_id, c.memory_id)::text)::timestamptz"
        ")), 0) / 3600.0 / recall.importance_half_life_hours, 1000))",
    ),
    # the legs' owner-key joins
    (
        "_dense_candidates",
        re.compile(r"(\w+)\.tenant_id = k\.tenant_id"),
        r"\1.tenant_id = k.tenant_id and \1.tenant_id = any " + _LEG,
    ),
    (
        "_lexical_candidates",
        re.compile(r"(\w+)\.tenant_id = k\.tenant_id"),
        r"\1.tenant_id = k.tenant_id and \1.tenant_id = any " + _LEG,
    ),
    (
        "_dense_candidates",
        re.compile(r"from harbor\.memory_embeddings e\s+where harbor\.vector_owner_key\("),
        "from harbor.memory_embeddings e\n where e.tenant_id = any "
        + _LEG
        + " and harbor.vector_owner_key(",
    ),
    (
        "_dense_candidates",
        re.compile(r"where m\.tenant_id = n\.tenant_id"),
        "where m.tenant_id = n.tenant_id and m.tenant_id = any " + _LEG,
    ),
    (
        "_dense_candidates",
        re.compile(r"on m\.tenant_id = e\.tenant_id and m\.id = e\.memory_id"),
        "on m.tenant_id = e.tenant_id and m.id = e.memory_id and m.tenant_id = any "
        + _TENANTS.format(scopes="$3", tenant="$5")
        + " and e.tenant_id = any "
        + _TENANTS.format(scopes="$3", tenant="$5"),
    ),
    (
        "_lexical_candidates",
        re.compile(r"from harbor\.memories m\s+where harbor\.memory_owner_terms\("),
        "from harbor.memories m\n where m.tenant_id = any "
        + _LEG
        + " and harbor.memory_owner_terms(",
    ),
    (
        "_lexical_candidates",
        re.compile(r"and m\.tenant_id = any \(array\['', \$2\]\)"),
        "and m.tenant_id = any " + _TENANTS.format(scopes="$3", tenant="$2"),
    ),
    # the legs' per-owner-key LATERAL range scans and the dense leg's per-vector
    # lookups, kept whole by OFFSET 0 (or the per-key LIMIT of the dense window) on
    # one server (a generic plan's merge or hash join read every other owner's rows
    # first): Citus cannot push down a LATERAL subquery with OFFSET or LIMIT ("cannot
    # push down this subquery") once the global scope adds the '' shard, and custom
    # plans are used here anyway, so the subqueries become plain joins again (the
    # same rows: the window's own ORDER BY and LIMIT still keep the nearest)
    ("_lexical_candidates", re.compile(r"\boffset 0\) m\b"), ") m"),
    # an owner of at most p_term_limit rows is read by the owner pass on one server;
    # on the cluster that pass (a UNION ALL of two reads of the owner's rows) is sent
    # to every worker, where the lookup's statements go to the tenant's alone: the
    # lookup stays for every owner there
    (
        "_lexical_candidates",
        re.compile(r"\n(\s*)and \(v_seen > p_term_limit or v_seen > p_scan_limit\) then"),
        " then",
    ),
    # and a small owner's both legs at once (the same read of its rows): the legs run
    # apart there
    (
        "_lexical_candidates",
        re.compile(r"\bif v_dense and v_seen <= least\(p_merge_limit, p_scan_limit\) then"),
        "if false then",
    ),
    # the substring fallback reads the tenant's rows under the policies instead of its
    # per-key read: a LATERAL subquery per owner key that Citus cannot push down whole
    # (without its fence it was planned in steps, a recall on the cluster about 9 ms
    # slower), where one statement over the tenant's shard (and the '' one with the
    # global scope) goes to its worker. The tenant is recall's, passed as p_tenant: a
    # value Citus prunes by (with harbor.caller_tenant() in the predicate the statement
    # went to every shard, the other worker's too)
    (
        "_substring_matches",
        re.compile(r"from harbor\._caller_identity\(\) i\s.*?\boffset 0\) m\s+where ", re.DOTALL),
        "from harbor.memories m\n     where m.tenant_id = any "
        + _TENANTS.format(scopes="p_scopes", tenant="p_tenant")
        + "\n       and m.scope = any (p_scopes)\n       and ",
    ),
    (
        "recall",
        re.compile(
            r"(harbor\._substring_matches\(v_query, recall\.scopes, v_as_of, v_n,\s+"
            r"recall\.max_sensitivity)\)"
        ),
        "\\1, v_tenant)",
    ),
    # Pruning to the tenant's shard: a statement whose rows Citus finds two
    # restrictions on the distribution column for, each a `= any (array)`, is sent to
    # every shard of either, not to the one both allow: the legs' literal tenant
    # predicate (above) and harbor._visible()'s `tenant_id = any (array['', tenant])`,
    # inlined, made a recall's term-ranking statements of the lexical leg and the graph
    # walk of the dense leg multi-shard queries, planned on the worker with their CTEs as
    # intermediate results and run over connections to every shard of both workers.
    # The visibility test names the row's tenant through an expression the planner does
    # not take for the column (the same test: `||` of '' is the value itself), so the
    # literal predicate alone decides the shards
    (
        "_lexical_candidates",
        re.compile(r"(\n\s*and harbor\._visible\(m\.scope, m\.tenant_id)(,)"),
        "\\1 operator(pg_catalog.||) ''\\2",
    ),
    (
        "_dense_candidates",
        re.compile(r"(\n\s*and harbor\._visible\(e\.scope, e\.tenant_id)(,)"),
        "\\1 operator(pg_catalog.||) ''\\2",
    ),
    # and the graph walk's exact part (an owner key with vectors outside the graph), whose
    # test for such vectors reads the tenant's shard alone as well
    (
        "_dense_candidates",
        re.compile(r"(from harbor\.memory_embeddings l\n\s*where k\.tenant_id = l\.tenant_id)"),
        "\\1 and l.tenant_id = any " + _TENANTS.format(scopes="$3", tenant="$5"),
    ),
    ("_dense_candidates", re.compile(r"\boffset 0\) e\b"), ") e"),
    ("_dense_candidates", re.compile(r"\boffset 0\) m\b"), ") m"),
    (
        "_dense_candidates",
        re.compile(r"\s+order by dist, e\.memory_id\s+limit v_window\) e\b"),
        ") e",
    ),
    # the dense leg's probe of the window's memories stops at the p_limit it needs,
    # a LIMIT over a join of the window to the memories, which Citus refuses once
    # the global scope adds the '' shard ("subquery in LIMIT is not supported in
    # multi-shard queries", in the form it had): the probe reads every memory of
    # the window instead (at most 2 * p_limit + 64 primary-key lookups), the same
    # answer: the final selection still keeps the p_limit nearest, and the window
    # test `count(near) >= p_limit` holds exactly when it held with the limit
    (
        "_dense_candidates",
        re.compile(r"(order by n\.dist, n\.memory_id)\n(\s*)limit p_limit\n"),
        "\\1\n\\2-- (no limit: Citus)\n",
    ),
    # promote_vector_owner is a definer owned by harbor_search (NOLOGIN), made SECURITY
    # INVOKER here, so its UPDATE of in_graph, which no caller may make, is refused
    # ("permission denied"). On Citus it has nothing to do: graph_min_vectors() is 0, so
    # every vector a save writes is in the graph already (a vector written outside the
    # library, in_graph false, is scanned exactly by the dense leg): after the same
    # visibility check it promotes nothing
    (
        "promote_vector_owner",
        re.compile(r"\n(\s*)-- try, never wait: any login"),
        "\n\\1-- (Citus: every vector is in the graph, graph_min_vectors() is 0)"
        "\n\\1return 0;\\g<0>",
    ),
    # the guards look a memory up by primary key alone, the tenant tested outside the
    # fenced scan (on one server, a second tenant test misled the planner); on a shard
    # that lookup is a query over every shard, which Citus refuses inside a shard's
    # trigger ("cannot execute a distributed query from a query on a shard"): the
    # tenant goes back into the scan, so the lookup stays on the row's own shard
    (
        "_owner_is_memorys",
        re.compile(r"where y\.id = new\.memory_id"),
        "where y.tenant_id = new.tenant_id and y.id = new.memory_id",
    ),
    (
        "_memory_successor_visible",
        re.compile(r"where s\.id = new\.superseded_by offset 0"),
        "where s.tenant_id = new.tenant_id and s.id = new.superseded_by offset 0",
    ),
    # the summary rule's turn count: on one server harbor._session_turns, a definer that
    # tests the session once against the caller's identity; Citus sends the rule's
    # statement whole to the session's worker, where a function may not query a
    # distributed table ("cannot execute a distributed query from a query on a shard"),
    # so the count is the statement's own again, under the shard's policies (the same
    # turns). (The delegated append, sql/citus/append.sql, counts through a definer: its
    # PL/pgSQL statement is not a query on a shard)
    # and every turn: on one server a trigger forgets the last summary's last turn
    # (session_state.summarised_through) when turns are deleted, and the rule counts only
    # the turns after it; a shard's trigger cannot write another distributed table, so
    # there is no such trigger on Citus and the rule does not read the column
    (
        "summary_due_rows",
        re.compile(r"harbor\._session_turns_since_summary\([^()]+\)"),
        "NULL::bigint",
    ),
    (
        "summary_due_rows",
        re.compile(r"harbor\._session_turns\(([^,()]+), ([^,()]+), ([^,()]+), ([^()]+?)\)"),
        "(select pg_catalog.count(*) from (select 1 from harbor.messages m"
        " where m.tenant_id = \\1 and m.user_id = \\2 and m.session_id = \\3"
        " limit \\4) x)",
    ),
    # consolidation's content vectors: one server reads them in a LATERAL range scan an
    # owner key, kept whole by OFFSET 0, which Citus cannot push down over the owner keys'
    # VALUES ("Offset clause is currently unsupported when a lateral subquery references a
    # column from a VALUES clause"). On Citus they are read first, in a statement of their
    # own whose literal tenant predicate routes it to the tenant's shard (one task), into
    # two arrays (ids and vectors, aggregated in one pass: the same order); the grouping
    # statement reads them back and so reads no distributed table (PostgreSQL alone plans
    # it; a memory whose vector is stored between the two statements is compared with the
    # others at the next run). With the predicate in the grouping statement itself, Citus
    # routed all of it to the worker, where harbor._owner_memories() is a distributed query
    # from a query on a shard; as a plain join it was sent to every shard. The same rows
    # either way: every owner key is of the caller's tenant (the global and tenant scopes
    # are refused first)
    (
        "consolidate_memories",
        re.compile(r"\n(\s*)v_new    text;"),
        "\\g<0>"
        "\n\\1v_vector_ids text[];  -- (Citus: the owner keys' content vectors' memories)"
        "\n\\1v_vectors public.vector[];  -- (Citus: and the vectors, in the same order)",
    ),
    (
        "consolidate_memories",
        re.compile(r"\n(\s*)-- the groups, from one snapshot: "),
        "\n\\1if consolidate_memories.min_similarity is not null then"
        "\n\\1    select pg_catalog.array_agg(e.memory_id), pg_catalog.array_agg(e.embedding)"
        "\n\\1      into v_vector_ids, v_vectors"
        "\n\\1      from harbor._recall_keys(consolidate_memories.scopes, v_id.tenant_id,"
        "\n\\1                               v_id.project_id, v_id.user_id, v_id.session_id,"
        "\n\\1                               v_id.run_id) k"
        "\n\\1      join harbor.memory_embeddings e"
        "\n\\1        on e.tenant_id = k.tenant_id and e.scope = k.scope"
        "\n\\1       and e.user_id = k.user_id and e.project_id = k.project_id"
        "\n\\1       and e.session_id = k.session_id and e.run_id = k.run_id"
        "\n\\1     where e.tenant_id = v_id.tenant_id"
        "\n\\1       and e.model_id = consolidate_memories.model_id and not e.with_context;"
        "\n\\1end if;"
        "\\g<0>",
    ),
    (
        "consolidate_memories",
        re.compile(
            r"select e\.memory_id, e\.embedding\s+from harbor\._recall_keys\(.*?offset 0\) e",
            re.DOTALL,
        ),
        "select x.memory_id, x.embedding"
        "\n          from unnest(v_vector_ids, v_vectors) x(memory_id, embedding)",
    ),
    # a queued job's guards (harbor.require_turn, harbor.require_memories: the turn a write
    # folded, or the memories an observation read, still stored) read by id alone, under
    # the policies, which hold them to the caller's tenant (and the global memories): Citus
    # cannot prune on that, and sent each check to every shard (a session summary's write
    # 28 ms). Each gets the tenants it may find the rows in as a literal predicate, from a
    # variable of a block of its own (a stable function's call in the predicate is not
    # pruned on): the caller's for a turn, the caller's and '' for memories. The same rows:
    # a row of another tenant is not visible to the caller anyway
    (
        "require_turn",
        re.compile(
            r"(if not exists \(select 1 from harbor\.messages m where )(m\.id = turn_id\) then"
            r".*?end if;)",
            re.DOTALL,
        ),
        "declare v_tenant text := harbor.caller_tenant();\n    begin\n    "
        "\\1m.tenant_id = v_tenant and \\2\n    end;",
    ),
    (
        "require_memories",
        re.compile(
            r"(if \(select count\(distinct m\.id\) from harbor\.memories m where )"
            r"(m\.id = any \(memory_ids\)\).*?end if;)",
            re.DOTALL,
        ),
        "declare v_tenant text := harbor.caller_tenant();\n    begin\n    "
        "\\1m.tenant_id = any (array['', v_tenant]) and \\2\n    end;",
    ),
)


def rewritten_functions() -> list[str]:
    """The names of the functions :data:`REWRITES` rewrites, each once, in order."""
    return list(dict.fromkeys(name for name, _pattern, _replacement in REWRITES))


def _expander(replacement: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m.expand(replacement)


def rewrite(name: str, definition: str) -> str:
    """``definition`` (of function ``harbor.<name>``) with the entries of :data:`REWRITES`
    for ``name`` applied in order (unchanged when none matches).

    Raises :class:`MemoryConfigurationError` when only one half of recall's split into
    two statements matched (harbor.recall() in sql/functions/recall/ranking.sql changed
    its shape)."""
    rewritten = definition
    for function, pattern, replacement in REWRITES:
        if function == name:
            rewritten = pattern.sub(_expander(replacement), rewritten)
    if rewritten.count(" into v_candidates from (") != rewritten.count(
        "select * from candidates) c;"
    ):
        # (recall's split is two rewrites that must both match, or neither)
        raise MemoryConfigurationError(
            f"harbor.{name}: sql/functions/recall/ranking.sql no longer has the shape"
            " harbor_pg.db.citus splits for Citus (its statement's start or the linked"
            " CTE moved)"
        )
    if rewritten.count(" into v_ranked, v_ids from (") != rewritten.count(
        "r.neighbour, r.date_match from ranked r) r;"
    ):
        raise MemoryConfigurationError(
            f"harbor.{name}: sql/functions/recall/ranking.sql no longer has the shape"
            " harbor_pg.db.citus splits for Citus (its linked or hydrated CTE moved)"
        )
    return rewritten
