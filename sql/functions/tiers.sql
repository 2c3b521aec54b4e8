-- Hot-path reads as single statements: the identity is set for the statement's
-- own (implicit) transaction and the read runs under the policies, so an
-- autocommit client needs one round trip. SECURITY INVOKER: row-level
-- security applies exactly as for a plain SELECT, and a role binding still
-- wins over the identity passed here.
create or replace function harbor.recent_turns(
    p_tenant text, p_project text, p_principal text, p_user text, p_session text,
    p_run text, p_limit integer
) returns table (id bigint, role text, content text, name text, tool_calls jsonb,
                 tool_call_id text, metadata jsonb, created_at timestamptz)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    -- a plain variable, not coalesce() in the query: the cached generic plan
    -- then uses it as an index condition instead of filtering the session's rows
    v_user text := coalesce(p_user, p_principal, '');
begin
    perform set_config('harbor.tenant_id', p_tenant, true),
            set_config('harbor.project_id', coalesce(p_project, ''), true),
            set_config('harbor.principal_id', coalesce(p_principal, ''), true),
            set_config('harbor.user_id', v_user, true),
            set_config('harbor.session_id', coalesce(p_session, ''), true),
            set_config('harbor.run_id', coalesce(p_run, ''), true);
    return query
        select n.id, n.role::text, n.content, n.name, n.tool_calls, n.tool_call_id, n.metadata,
               n.created_at
          from (select m.* from harbor.messages m
                 where m.tenant_id = p_tenant and m.user_id = v_user
                   and m.session_id = p_session
                 order by m.id desc
                 limit p_limit) n
         order by n.id;
end
$$;

-- How many turns the caller's own session holds, counting at most p_limit (null: all):
-- the count harbor.summary_due_rows reads on every append. A session's turns are
-- visible to the caller all together or not at all (the messages policy reads only a
-- turn's tenant, user and session), so this tests the session once, with the policy's
-- own predicate and the caller's identity, and counts its turns without the per-turn
-- test, which cost a summarised session's append about 0.5 us a turn (0.4 ms at 1,000
-- turns, 9.9 ms at 21,000). Another session's count is 0. SECURITY DEFINER, owned by
-- harbor_search (BYPASSRLS, NOLOGIN), which may read harbor.messages for this alone.
-- (On Citus harbor.summary_due_rows counts in its own statement: harbor_pg.db.citus_rewrites.)
create or replace function harbor._session_turns(
    p_tenant text, p_user text, p_session text, p_limit bigint
) returns bigint
    language plpgsql stable security definer
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- (PL/pgSQL: its plan is kept for the session; an SQL function with a SET clause is
    -- planned again on every call, which cost more than the count saved below about
    -- 2,000 turns)
    return (select pg_catalog.count(*)
              from (select 1 from harbor.messages m
                     where m.tenant_id = p_tenant and m.user_id = p_user
                       and m.session_id = p_session
                       and harbor._visible_keys('session', p_tenant, '', p_user, p_session,
                                                '', harbor.caller_tenant(),
                                                harbor._caller_keys())
                     limit p_limit) x);
end
$$;
grant select on harbor.messages to harbor_search;
grant create on schema harbor to harbor_search;
alter function harbor._session_turns(text, text, text, bigint) owner to harbor_search;
revoke create on schema harbor from harbor_search;

grant create on schema harbor to harbor_search;
-- How many of the caller's own session's turns came after the last summary's last turn
-- (session_state.summarised_through), counting at most p_limit; null when that turn is
-- not known (no summary yet, or turns deleted since: the summary rule then counts every
-- turn, harbor._session_turns above). A range of the session's index from that turn on,
-- so its cost follows the new turns, not the session. The session is tested once against
-- the caller's identity, as by harbor._session_turns; another session's: null. SECURITY
-- DEFINER, owned by harbor_search (BYPASSRLS, NOLOGIN), as harbor._session_turns.
-- A deletion of a session's turns forgets where its last summary ended: the turns up to
-- it no longer number turns_at_summary. A trigger on harbor.messages, once a statement,
-- whoever deletes (an erasure, retention, a clear, a DELETE of the application's own),
-- SECURITY DEFINER as well (the administrator who erases may not update session_state),
-- and refuses to run as any other table's trigger.
-- Not on a distributed database (a shard's trigger cannot write another distributed
-- table; harbor_pg.db.citus drops it), where the rule does not read the column.
-- Both need the column (migration 0032): on an earlier revision the function is a stub
-- that knows no turn, and there is no trigger.
do $frontier$
declare
    distributed boolean := false;
begin
    if not exists (select 1 from pg_catalog.pg_attribute
                    where attrelid = 'harbor.session_state'::pg_catalog.regclass
                      and attname = 'summarised_through' and not attisdropped) then
        create or replace function harbor._session_turns_since_summary(
            p_tenant text, p_user text, p_session text, p_limit bigint
        ) returns bigint
            language plpgsql stable security definer
            set search_path to pg_catalog, pg_temp
        as $f$
        begin
            return null;
        end
        $f$;
        drop trigger if exists messages_forget_summary_frontier on harbor.messages;
    else
        create or replace function harbor._session_turns_since_summary(
            p_tenant text, p_user text, p_session text, p_limit bigint
        ) returns bigint
            language plpgsql stable security definer
            set search_path to pg_catalog, pg_temp
        as $f$
        declare
            v_after bigint;
        begin
            if not coalesce(harbor._visible_keys('session', p_tenant, '', p_user, p_session, '',
                                                 harbor.caller_tenant(),
                                                 harbor._caller_keys()), false) then
                return null;
            end if;
            select s.summarised_through into v_after
              from harbor.session_state s
             where s.tenant_id = p_tenant and s.user_id = p_user and s.session_id = p_session;
            if v_after is null then
                return null;
            end if;
            return (select pg_catalog.count(*)
                      from (select 1 from harbor.messages m
                             where m.tenant_id = p_tenant and m.user_id = p_user
                               and m.session_id = p_session and m.id > v_after
                             limit p_limit) x);
        end
        $f$;
        create or replace function harbor._forget_summary_frontier() returns trigger
            language plpgsql volatile security definer
            set search_path to pg_catalog, pg_temp
        as $f$
        begin
            -- (a definer: attached to any other table, e.g. a caller's own temporary one
            -- whose rows name other sessions, it refuses)
            if tg_op <> 'DELETE' or tg_level <> 'STATEMENT'
               or tg_relid <> 'harbor.messages'::pg_catalog.regclass then
                raise exception 'harbor._forget_summary_frontier() is the trigger of '
                                'deletions from harbor.messages' using errcode = '42501';
            end if;
            update harbor.session_state s
               set summarised_through = null
              from (select distinct o.tenant_id, o.user_id, o.session_id from gone o) g
             where s.tenant_id = g.tenant_id and s.user_id = g.user_id
               and s.session_id = g.session_id and s.summarised_through is not null;
            return null;
        end
        $f$;
        grant select, update (summarised_through) on harbor.session_state to harbor_search;
        alter function harbor._forget_summary_frontier() owner to harbor_search;
        revoke all on function harbor._forget_summary_frontier() from public;
        if exists (select 1 from pg_catalog.pg_extension where extname = 'citus') then
            execute 'select exists (select 1 from pg_catalog.pg_dist_partition'
                    ' where logicalrelid = ''harbor.messages''::pg_catalog.regclass)'
               into distributed;
        end if;
        if not distributed then
            create or replace trigger messages_forget_summary_frontier
                after delete on harbor.messages
                referencing old table as gone
                for each statement execute function harbor._forget_summary_frontier();
        end if;
    end if;
    alter function harbor._session_turns_since_summary(text, text, text, bigint)
        owner to harbor_search;
end
$frontier$;

revoke create on schema harbor from harbor_search;

-- Whether the caller's session is due a background summary, by the rules of
-- context_acquire_summary_lease (enough turns, no live lease, cooldown passed,
-- enough new turns since the last summary). A read: finding nothing due writes
-- nothing, and the lease statement stays the one that decides. The session's
-- turns are counted only when lease and cooldown allow a summary, and at most
-- min_turns of them before the first, or after the last summary's last turn while
-- session_state knows it (summarised_through). p_unseen: turns the caller's statement
-- has written that its snapshot does not show yet (1 inside an append).
--
-- The rule is written once, as a one-row set-returning function with an
-- SQL-standard body and no SET clause, so the planner inlines it into the
-- statement that calls it from FROM (the append statement does): a function
-- called through the executor cost the append about 0.6 ms. The read-only due
-- check (short_term.sql, summary_due) calls it the same way. On Citus it counts the turns
-- in its own statement, under the shard's policies, and every turn: nothing there clears
-- summarised_through when turns are deleted (harbor_pg.db.citus_rewrites).
create or replace function harbor.summary_due_rows(
    p_tenant text, p_user text, p_session text, p_min_turns bigint,
    p_cooldown_seconds double precision, p_unseen integer default 0
) returns table (due boolean)
    language sql stable security invoker
begin atomic
    select case
             when s.session_id is null then
               harbor._session_turns(p_tenant, p_user, p_session, p_min_turns)
                 operator(pg_catalog.+) p_unseen operator(pg_catalog.>=) p_min_turns
             when s.summary_lease_until operator(pg_catalog.>) pg_catalog.clock_timestamp()
                  or s.summarised_at operator(pg_catalog.>)
                     (pg_catalog.clock_timestamp()
                      operator(pg_catalog.-) pg_catalog.make_interval(secs => p_cooldown_seconds))
             then false
             else
               -- the last summary's last turn known: the session holds turns_at_summary
               -- turns up to it and n = turns_at_summary + the turns after it, so the
               -- rule below holds exactly when at least p_min_turns came after it;
               -- otherwise every turn counted
               (select case
                         when a.n is not null then
                           a.n operator(pg_catalog.+) p_unseen operator(pg_catalog.>=)
                             p_min_turns
                         else
                           (select c.n operator(pg_catalog.>=) p_min_turns
                                   and (c.n operator(pg_catalog.<) s.turns_at_summary
                                        or (c.n operator(pg_catalog.-) s.turns_at_summary)
                                           operator(pg_catalog.>=) p_min_turns)
                              -- (OFFSET 0: one count, not one for each use of n)
                              from (select harbor._session_turns(p_tenant, p_user, p_session,
                                                                 null)
                                           operator(pg_catalog.+) p_unseen as n offset 0) c)
                       end
                  from (select harbor._session_turns_since_summary(p_tenant, p_user, p_session,
                                                                   p_min_turns) as n
                        offset 0) a)
           end
      from (select) one
      left join harbor.session_state s
        on s.tenant_id operator(pg_catalog.=) p_tenant
       and s.user_id operator(pg_catalog.=) p_user
       and s.session_id operator(pg_catalog.=) p_session;
end;

-- (the scalar wrapper of earlier versions: both statements call the rule from FROM)
drop function if exists harbor.summary_due(text, text, text, bigint, double precision, integer);

-- The owner's most similar currently valid memory in one scope (fact extraction's
-- similarity gate): exact cosine similarity over the vectors of one model and
-- dimension, through the owner indexes (not HNSW). The owner's current memory ids
-- are collected first and matched with = any(array): a join made the planner
-- filter the whole tenant's rows under the policies. An SQL-standard body without
-- SET, so the planner inlines it into the statement that calls it from FROM (the
-- gate rides in the same statement as the write it guards).
-- The owner key is tested on the memories and again on their embeddings, on purpose:
-- each test lets its own owner index serve the lookup.
create or replace function harbor.nearest_current_memory(
    p_tenant text, p_scope harbor.memory_scope, p_project text, p_user text,
    p_session text, p_run text, p_model_id text, p_dims integer,
    p_embedding public.vector, p_exclude_ids text[]
) returns table (memory_id text, similarity double precision)
    language sql stable security invoker
begin atomic
    select e.memory_id,
           1 operator(pg_catalog.-) (e.embedding operator(public.<=>) p_embedding)
      from harbor.memory_embeddings e
     where e.tenant_id operator(pg_catalog.=) p_tenant
       and e.model_id operator(pg_catalog.=) p_model_id
       and e.memory_id operator(pg_catalog.=) any (array(
           select m.id from harbor.memories m
            where m.tenant_id operator(pg_catalog.=) p_tenant
              and m.scope operator(pg_catalog.=) p_scope
              and m.user_id operator(pg_catalog.=) p_user
              and m.project_id operator(pg_catalog.=) p_project
              and m.session_id operator(pg_catalog.=) p_session
              and m.run_id operator(pg_catalog.=) p_run
              and m.memory_type operator(pg_catalog.<>) 'summary'
              and pg_catalog.upper_inf(m.valid)
              and pg_catalog.lower(m.valid) operator(pg_catalog.<=) pg_catalog.now()
              and m.id operator(pg_catalog.<>) all (p_exclude_ids)))
       and e.scope operator(pg_catalog.=) p_scope
       and e.user_id operator(pg_catalog.=) p_user
       and e.project_id operator(pg_catalog.=) p_project
       and e.session_id operator(pg_catalog.=) p_session
       and e.run_id operator(pg_catalog.=) p_run
       and e.dims operator(pg_catalog.=) p_dims
     order by e.embedding operator(public.<=>) p_embedding, e.memory_id
     limit 1;
end;

-- The HNSW graph holds the vectors of the owner keys with at least this many
-- vectors of a model (memory_embeddings.in_graph). harbor._dense_candidates scans
-- a caller's vectors exactly up to at least 5,000 of them and walks the graph only
-- above that, so a smaller owner key never needs its rows in the graph; when a
-- caller above the limit also sees an owner key outside the graph (a small user
-- of a large tenant, say), the dense leg scans that key's rows exactly beside the
-- walk. Below the limit, so that a single owner key above the limit is in the
-- graph from its first recall that walks it.
create or replace function harbor.graph_min_vectors() returns integer
    language sql immutable security invoker parallel safe
return 4096;

-- Where the vectors a write adds to an owner key go, and whether the key's older rows
-- are to be promoted (save_memories, once a key, before it inserts): in_graph when
-- the key is in the graph (some of its vectors are) or this write brings it to
-- harbor.graph_min_vectors() (p_new: the vectors the write adds; the count of the
-- rows already there stops at what the key lacks); promote when it brings it there,
-- or the key is in the graph and still has rows outside it. Read as harbor_search,
-- whose policy puts no condition on the rows, so each lookup is an index-only scan
-- of memory_embeddings_owner_idx on the whole key (under the caller's policy the
-- scope comparison, not leakproof, cannot be an index condition: the planner took the
-- primary key and read every vector of the tenant from the heap, three times a
-- write). Only for a key the caller sees (harbor._visible with the caller's identity,
-- as promote_vector_owner): for any other, (false, false), which leaves nothing in
-- the graph and tells nothing about the key. SECURITY DEFINER, owned by
-- harbor_search, reads in_graph flags and a bounded count, writes nothing.
-- The count reads up to graph_min_vectors() entries of the key: a write of a key of
-- 1,500 memories read 3,000 of them, a millisecond of a save's server CPU, every save.
-- So with p_count false a key outside the graph is not counted (its new vectors stay
-- outside it, in_graph and promote false): the writes of one or two vectors count one
-- time in sixteen (save_memory, save_memories: by the memory id's hash, so a key that
-- reaches the size is promoted by one of its next writes, about sixteen later, long
-- before the dense leg walks the graph for it at 5,000; until then it scans the key
-- exactly, the same answer); a batch of at least sixteen of the key's vectors always
-- counts. A key in the graph is asked in one descent of the index, whatever p_count.
-- (the signature without p_count: an overload left in place would make calls ambiguous)
drop function if exists harbor.vector_owner_graph(text, text, harbor.memory_scope, text, text,
                                                  text, text, integer);
create or replace function harbor.vector_owner_graph(
    p_tenant text, p_model_id text, p_scope harbor.memory_scope, p_user text, p_project text,
    p_session text, p_run text, p_new integer, p_count boolean default true,
    out in_graph boolean, out promote boolean
) returns record
    language plpgsql stable security definer
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to auto
as $$
declare
    v_id record := harbor._caller_identity();
    v_min integer := harbor.graph_min_vectors();
begin
    in_graph := false;
    promote := false;
    -- A store whose statistics do not yet say how many vectors it holds (never
    -- analysed, or analysed near empty) plans the two lookups below for each call. A
    -- plan kept from the first calls into an empty table (as a pooled connection
    -- keeps it until the next ANALYZE) took the primary key by tenant and read every
    -- vector of the tenant: a fresh store's saves 3 ms of server CPU where 1.5 do,
    -- growing with the store until autovacuum's first analysis. Once the statistics
    -- count 1,000 vectors the plan is kept again (this function's SET clause ends the
    -- custom planning with the call)
    if (select c.reltuples < 1000 from pg_catalog.pg_class c
         where c.oid = 'harbor.memory_embeddings'::regclass) then
        perform pg_catalog.set_config('plan_cache_mode', 'force_custom_plan', true);
    end if;
    if not coalesce(harbor._visible(p_scope, p_tenant, p_project, p_user, p_session, p_run,
                                    v_id.tenant_id, v_id.project_id, v_id.user_id,
                                    v_id.session_id, v_id.run_id), false) then
        return;
    end if;
    if exists (select 1 from harbor.memory_embeddings e
                where e.tenant_id = p_tenant and e.model_id = p_model_id
                  and e.scope = p_scope and e.user_id = p_user
                  and e.project_id = p_project and e.session_id = p_session
                  and e.run_id = p_run and e.in_graph) then
        in_graph := true;
        promote := exists (select 1 from harbor.memory_embeddings e
                            where e.tenant_id = p_tenant and e.model_id = p_model_id
                              and e.scope = p_scope and e.user_id = p_user
                              and e.project_id = p_project and e.session_id = p_session
                              and e.run_id = p_run and not e.in_graph);
        return;
    end if;
    in_graph := greatest(p_new, 0) >= v_min
                or coalesce(p_count, true) and greatest(p_new, 0)
                   + (select count(*) from (select 1 from harbor.memory_embeddings e
                                             where e.tenant_id = p_tenant
                                               and e.model_id = p_model_id
                                               and e.scope = p_scope and e.user_id = p_user
                                               and e.project_id = p_project
                                               and e.session_id = p_session
                                               and e.run_id = p_run
                                             limit v_min - greatest(p_new, 0)) c) >= v_min;
    promote := in_graph;
end
$$;
grant create on schema harbor to harbor_search;
alter function harbor.vector_owner_graph(text, text, harbor.memory_scope, text, text, text,
                                         text, integer, boolean)
    owner to harbor_search;
revoke create on schema harbor from harbor_search;

-- Put an owner key's vectors of a model in the graph (in_graph): when the key
-- holds at least harbor.graph_min_vectors() of them (p_new: the vectors the calling
-- statement writes to it, which this function may not see), or some already are
-- (then the rest, written by a transaction that could not see the promotion, follow).
-- save_memories calls it when a write brings a key to that size, or writes to a
-- key in the graph that still has rows outside it. Under a transaction-scoped
-- advisory lock on the key, tried and never waited for (a second promotion of the
-- key, or a login holding the key, makes this call promote nothing), at most
-- p_chunk rows a call: a key with
-- more is promoted over its next writes (resumable; until then the dense leg
-- scans it exactly, so recall is complete all along). Idempotent. Only for a key
-- the caller sees (harbor._visible with the caller's identity, as recall's legs);
-- returns how many rows it put in the graph. Owned by harbor_search (it may
-- update in_graph and nothing else), security definer: the rows of a TENANT or
-- GLOBAL key are not all the writer's to read.
create or replace function harbor.promote_vector_owner(
    p_tenant text, p_model_id text, p_scope harbor.memory_scope, p_user text, p_project text,
    p_session text, p_run text, p_new integer default 0, p_chunk integer default 2048
) returns integer
    language plpgsql volatile security definer
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_id   record := harbor._caller_identity();
    v_rows integer;
begin
    if not coalesce(harbor._visible(p_scope, p_tenant, p_project, p_user, p_session, p_run,
                                    v_id.tenant_id, v_id.project_id, v_id.user_id,
                                    v_id.session_id, v_id.run_id), false) then
        return 0;
    end if;
    -- try, never wait: any login can take an advisory key and hold it, and a write
    -- must not wait on that. A key whose lock is held is promoted by a later write;
    -- until then the dense leg scans its rows outside the graph exactly (complete).
    if not pg_catalog.pg_try_advisory_xact_lock(
            pg_catalog.hashtextextended(harbor.vector_owner_key(p_tenant, p_model_id, p_scope,
                                                                p_user, p_project, p_session,
                                                                p_run),
                                        7318)) then
        return 0;
    end if;
    if not exists (select 1 from harbor.memory_embeddings e
                    where e.tenant_id = p_tenant and e.model_id = p_model_id
                      and e.scope = p_scope and e.user_id = p_user
                      and e.project_id = p_project and e.session_id = p_session
                      and e.run_id = p_run and e.in_graph)
       and (select count(*) from (select 1 from harbor.memory_embeddings e
                                   where e.tenant_id = p_tenant and e.model_id = p_model_id
                                     and e.scope = p_scope and e.user_id = p_user
                                     and e.project_id = p_project
                                     and e.session_id = p_session and e.run_id = p_run
                                   limit harbor.graph_min_vectors()) c)
           + greatest(p_new, 0) < harbor.graph_min_vectors() then
        return 0;
    end if;
    update harbor.memory_embeddings u set in_graph = true
      from (select e.tenant_id, e.memory_id, e.model_id, e.with_context
              from harbor.memory_embeddings e
             where e.tenant_id = p_tenant and e.model_id = p_model_id
               and e.scope = p_scope and e.user_id = p_user and e.project_id = p_project
               and e.session_id = p_session and e.run_id = p_run and not e.in_graph
             limit p_chunk) r
     where u.tenant_id = r.tenant_id and u.memory_id = r.memory_id
       and u.model_id = r.model_id and u.with_context = r.with_context and not u.in_graph;
    get diagnostics v_rows = row_count;
    return v_rows;
end
$$;
grant create on schema harbor to harbor_search;
alter function harbor.promote_vector_owner(text, text, harbor.memory_scope, text, text, text,
                                           text, integer, integer)
    owner to harbor_search;
revoke create on schema harbor from harbor_search;

-- Whether the caller's turn turn_id is still there, for a queued job's write: raises
-- no_data_found (P0002) when it is not (erased, expired), which ends the write's
-- transaction with nothing written. The job runs it after taking its session's lock
-- (query job_write_lock), in a statement of its own: its snapshot is then taken after
-- any erasure that held the lock has committed (harbor.erase takes the lock first).
create or replace function harbor.require_turn(turn_id bigint) returns void
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from harbor.messages m where m.id = turn_id) then
        raise exception 'harbor.require_turn: turn % is gone (erased or expired)', turn_id
            using errcode = 'no_data_found';
    end if;
end
$$;

-- Whether every memory memory_ids names is still stored and visible to the caller, for
-- an observation's write (harbor_pg.tiers.long_term, observation_write_guards): raises
-- no_data_found (P0002) when one is not (erased, deleted), which ends the write's
-- transaction with nothing written. Sent after the user's lock (query job_user_lock),
-- in a statement of its own, as harbor.require_turn is.
create or replace function harbor.require_memories(memory_ids text[]) returns void
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- (counted, not a correlated NOT EXISTS: Citus plans no correlated subquery beside
    -- a set-returning function)
    if (select count(distinct m.id) from harbor.memories m where m.id = any (memory_ids))
       < cardinality(array(select distinct r from unnest(memory_ids) r)) then
        raise exception 'harbor.require_memories: a memory read is gone (erased or deleted)'
            using errcode = 'no_data_found';
    end if;
end
$$;

-- Count a recall's hits: each memory of memory_ids the caller can see gets one more hit
-- and last_recalled_at now() (harbor.memory_hits). Called after a recall returned them,
-- never inside harbor.recall()'s statement (recall stays a read); rows in key order, so
-- that two callers counting the same memories wait for each other instead of
-- deadlocking. Returns how many memories it counted.
create or replace function harbor.record_hits(memory_ids text[]) returns bigint
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    n bigint;
begin
    insert into harbor.memory_hits as h (tenant_id, memory_id, scope, project_id, user_id,
                                         session_id, run_id, hits, last_recalled_at)
    select m.tenant_id, m.id, m.scope, m.project_id, m.user_id, m.session_id, m.run_id, 1,
           pg_catalog.now()
      from harbor.memories m
     where m.tenant_id = any (array['', harbor.caller_tenant()])
       and m.id = any (memory_ids)
     order by m.tenant_id, m.id
    on conflict (tenant_id, memory_id) do update
       set hits = h.hits + 1,
           last_recalled_at = greatest(h.last_recalled_at, excluded.last_recalled_at);
    get diagnostics n = row_count;
    return n;
end
$$;
