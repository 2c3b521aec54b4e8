-- A turn's append on a distributed database, in one call that Citus delegates whole to
-- the tenant's worker (harbor-pg distribute registers it with create_distributed_function,
-- distribution argument p_tenant_id, co-located with harbor.messages; harbor_pg.db.citus).
-- The coordinator sends the one call, in autocommit: no transaction block, no SET LOCAL,
-- no commit round trip; the worker runs the append's steps on its own shards (Citus's
-- local execution) and commits. The statements it replaces (one per step, each routed
-- from the coordinator) paid the coordinator's and the worker's planning and a hop
-- each, and the transaction's BEGIN and COMMIT on the worker two more. An append that
-- queues jobs sends the same call inside a transaction block (force_delegation: Citus
-- still sends it whole to the worker), its jobs queued on the coordinator after it and
-- committed with it (queue_turn_jobs_citus, sql/queries/citus.sql): the worker sees BEGIN,
-- the call and COMMIT.
--
-- The identity travels as the call's arguments, so the function sets it (SET LOCAL,
-- for the worker's transaction) and then checks it against what the policies
-- read: harbor.caller_tenant(), caller_user() and caller_session() give a bound role's
-- binding (the reference table, read from the worker's own placement) whatever was set,
-- and an unbound login the values just set. A caller that names another tenant (the
-- distribution argument: the call is sent to that tenant's worker), user or session than
-- its own is refused before any row is read or locked. The statements then run as the
-- caller (security invoker), under the same policies as every other write (a summarised
-- session's turns are counted without them, below).
--
-- Its steps are append_message's (sql/queries/short_term.sql), in the same order:
-- - the user's lock, then the session's: their rows of harbor.owner_locks locked FOR
--   UPDATE, the user's first (the lock ON CONFLICT DO UPDATE takes, so an erasure of the user, which takes the
--   user's row first, waits for the appends in flight and later ones wait for it). A
--   row not there yet (the user's or session's first turn) is inserted as append_message
--   inserts it, the user's first;
-- - the turn's id, drawn after both locks are held, so within a session ids are in commit
--   order. A worker draws ids from its own range of the sequence (Citus gives each node
--   one); a tenant whose shards moved to a node with a lower range would draw ids below
--   its earlier turns', so the id is also kept above the session's last one (read under
--   the session's lock), the next free one above it when the range is lower;
-- - with p_min_turns, whether the session is now due a background summary, the new turn
--   seen: harbor.summary_due_rows's rule (sql/functions/tiers.sql) written out again, as
--   statements on one table each (Citus plans that function's one statement, its
--   sub-selects and join, through its router planner, about 1 ms a call on the worker;
--   tests/citus/test_cluster_append.py holds the two to the same answers). A summarised
--   session's turns are all counted, as one server counts them: by
--   harbor._delegated_session_turns (below), the session tested once against the
--   caller's identity, the turns counted without the shard's policies. On the
--   coordinator (a call Citus did not delegate) they are counted under the policies.

-- The turns of the caller's own session, on the node that holds its tenant's shard:
-- harbor._session_turns's statement (sql/functions/tiers.sql), for the delegated append.
-- A session's turns are visible to the caller all together or not at all, so the session
-- is tested once, with the policy's own predicate and the caller's identity, and its
-- turns are counted without the per-turn test (under the policies the count of a
-- summarised session cost about 7 us a turn on the test cluster, 38 ms at 5,400 turns;
-- this way 1.2 ms). Another session's count is 0. SECURITY DEFINER, owned by
-- harbor_search (BYPASSRLS, NOLOGIN), as harbor._session_turns is on one server; on Citus
-- that one is made invoker (harbor_pg.db.citus: its statement, run on the coordinator,
-- goes to the worker on a connection opened as the current user, which harbor_search
-- cannot be). This one's statement runs on the node's own shard (the delegated call holds
-- it, Citus's local execution), which needs no connection; so append_turn calls it on a
-- worker only (elsewhere it fails on that connection, reading nothing). A PL/pgSQL
-- statement of a function called by the delegated call is not a query inside a shard's
-- statement, which Citus refuses (why summary_due_rows counts in its own statement on
-- Citus, harbor_pg.db.citus_rewrites).
create or replace function harbor._delegated_session_turns(
    p_tenant text, p_user text, p_session text
) returns bigint
    language plpgsql stable security definer
    set search_path to pg_catalog, pg_temp
    -- (a statement on the distributed table, which Citus plans on this node: not with the
    -- generic plans of its caller's statements on shard tables, which Citus cannot make
    -- for it, "could not create distributed plan")
    set plan_cache_mode to auto
as $$
begin
    return (select pg_catalog.count(*) from harbor.messages m
             where m.tenant_id = p_tenant and m.user_id = p_user
               and m.session_id = p_session
               and harbor._visible_keys('session', p_tenant, '', p_user, p_session, '',
                                        harbor.caller_tenant(), harbor._caller_keys()));
end
$$;
grant create on schema harbor to harbor_search;
alter function harbor._delegated_session_turns(text, text, text) owner to harbor_search;
revoke create on schema harbor from harbor_search;
revoke all on function harbor._delegated_session_turns(text, text, text) from public;
grant execute on function harbor._delegated_session_turns(text, text, text) to harbor_app;

-- The append's statements. On the worker (a delegated call) they address the tenant's
-- own shard tables (harbor.messages_NNN, harbor.owner_locks_NNN,
-- harbor.session_state_NNN), prepared once a connection and shard and run by name. The
-- same statement on the distributed table costs Citus's per-statement work on the worker
-- every time it runs (finding the shard, building and planning the local query):
-- measured on the test cluster, the append on the worker 2.6-4.1 ms that way, 0.8-1.2
-- ms this way, the same statements and answers. The shard tables carry the distributed
-- table's policies (forced), triggers and grants, so these statements run under the
-- same rules as the caller's (security invoker); the call holds the tenant's shard
-- (harbor._hold_tenant_shard), so it stays on this node while they run. On the
-- coordinator (a call Citus did not delegate) the same statements name the distributed
-- tables.
--
-- harbor._append_statements: the six statements for p_tenant_id (seven on a worker),
-- prepared in this connection unless they already are (harbor._prepare_on_shard,
-- sql/citus/delegated.sql); returns the suffix of their names (the messages shard's id;
-- 'tables' on the coordinator).
drop function if exists harbor._shard_statements(text);
create or replace function harbor._append_statements(p_tenant_id text) returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key text := 'tables';
    v_messages text;
    v_locks text;
    v_state text;
    v_names text[];
    v_texts text[];
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.messages'::regclass,
                                                      p_tenant_id)::text;
    end if;
    -- (prepared already: their names are all this needs)
    if harbor._prepared_on_shard('harbor_append_lock_' || v_key) then
        return v_key;
    end if;
    v_messages := harbor._tenant_table('harbor.messages', p_tenant_id);
    v_locks := harbor._tenant_table('harbor.owner_locks', p_tenant_id);
    v_state := harbor._tenant_table('harbor.session_state', p_tenant_id);
    v_names := array['harbor_append_lock_', 'harbor_append_last_', 'harbor_append_insert_',
                     'harbor_append_state_', 'harbor_append_count_', 'harbor_append_locks_'];
    v_names := array(select n || v_key from unnest(v_names) n);
    v_texts := array[
        -- a lock row of the owner (the user's or the session's), locked: 1 when it is there
        format('prepare %s(text, text, text, harbor.memory_scope) as'
               ' select count(*) from (select 1 from %s l'
               ' where l.tenant_id = $1 and l.user_id = $2 and l.session_id = $3'
               ' and l.scope = $4 and l.project_id = '''' and l.run_id = '''''
               ' for update) x', v_names[1], v_locks),
        -- the session's last turn
        format('prepare %s(text, text, text) as select m.id from %s m'
               ' where m.tenant_id = $1 and m.user_id = $2 and m.session_id = $3'
               ' order by m.id desc limit 1', v_names[2], v_messages),
        -- the turn
        format('prepare %s(text, bigint, text, text, text, text, harbor.message_role, text,'
               ' text, jsonb, text, jsonb, integer) as insert into %s as m (tenant_id, id,'
               ' user_id, session_id, project_id, principal_id, role, content, name,'
               ' tool_calls, tool_call_id, metadata, token_estimate) overriding system value'
               ' values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)'
               ' on conflict do nothing returning m.id, m.created_at',
               v_names[3], v_messages),
        -- the session's summary state (true in the first column when there is one)
        format('prepare %s(text, text, text) as select true, s.summary_lease_until,'
               ' s.summarised_at, s.turns_at_summary from %s s where s.tenant_id = $1'
               ' and s.user_id = $2 and s.session_id = $3', v_names[4], v_state),
        -- the session's turns, up to a limit
        format('prepare %s(text, text, text, bigint) as select count(*) from (select 1'
               ' from %s m where m.tenant_id = $1 and m.user_id = $2 and m.session_id = $3'
               ' limit $4) x', v_names[5], v_messages),
        -- the user's and the session's lock rows, for their first turn (one statement:
        -- its rows are taken in the order written, the user's first; a row already there
        -- is locked, as ON CONFLICT DO UPDATE locks it)
        format('prepare %s(text, text, text) as insert into %s as l (tenant_id, user_id,'
               ' session_id, scope) values ($1, $2, '''', ''user''), ($1, $2, $3, ''session'')'
               ' on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)'
               ' do update set scope = excluded.scope where false', v_names[6], v_locks)];
    if v_key <> 'tables' then
        -- on the tenant's worker, the usual append as one statement (one server's
        -- append_message on the shard tables): the user's and the session's locks (their
        -- rows made or locked, the user's first), then, the aggregate having read them,
        -- the id drawn and the turn inserted. The id is also kept above the session's
        -- last turn this statement sees (a tenant moved from a worker with a higher range
        -- of the sequence); a concurrent append committed while this one waited for the
        -- locks is not seen, and its id is either below the one drawn here or equal to
        -- it: then nothing is inserted (ON CONFLICT DO NOTHING), and harbor._append_steps
        -- takes the steps apart, each with a snapshot of its own.
        v_names := v_names || ('harbor_append_one_' || v_key);
        v_texts := v_texts || format(
            'prepare %s(text, text, text, text, text, harbor.message_role, text, text,'
            ' jsonb, text, jsonb, integer) as with locks as (insert into %s as l'
            ' (tenant_id, user_id, session_id, scope) values ($1, $2, '''', ''user''),'
            ' ($1, $2, $3, ''session'') on conflict (tenant_id, user_id, session_id, scope,'
            ' project_id, run_id) do update set scope = excluded.scope where false'
            ' returning 1) insert into %s as m (tenant_id, id, user_id, session_id,'
            ' project_id, principal_id, role, content, name, tool_calls, tool_call_id,'
            ' metadata, token_estimate) overriding system value select $1,'
            ' greatest(pg_catalog.nextval(''harbor.messages_id_seq''::pg_catalog.regclass),'
            ' coalesce((select p.id from %s p where p.tenant_id = $1 and p.user_id = $2'
            ' and p.session_id = $3 order by p.id desc limit 1), 0) + 1), $2, $3, $4, $5,'
            ' $6, $7, $8, $9, $10, $11, $12 from (select count(*) as n from locks) locked'
            ' where locked.n >= 0 on conflict do nothing returning m.id, m.created_at',
            v_names[7], v_locks, v_messages, v_messages);
    end if;
    perform harbor._prepare_on_shard(v_names, v_texts);
    return v_key;
end
$$;
alter function harbor._append_statements(text) owner to harbor_owner;
revoke all on function harbor._append_statements(text) from public;
grant execute on function harbor._append_statements(text) to harbor_app;

-- harbor.append_turn's steps (called by it after the identity is checked and the shard
-- held), through the statements above.
drop function if exists harbor._append_on_shard(text, text, text, text, text,
                                                harbor.message_role, text, text, jsonb, text,
                                                jsonb, integer, bigint, double precision);
create or replace function harbor._append_steps(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_role harbor.message_role, p_content text, p_name text,
    p_tool_calls jsonb, p_tool_call_id text, p_metadata jsonb, p_token_estimate integer,
    p_min_turns bigint, p_cooldown_seconds double precision,
    out id bigint, out created_at timestamptz, out summary_due boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_key text := harbor._append_statements(p_tenant_id);
    v_locked bigint;
    v_session_locked bigint;
    v_last bigint;
    v_id bigint;
    v_state boolean;
    v_lease_until timestamptz;
    v_summarised_at timestamptz;
    v_turns_at_summary bigint;
    v_turns bigint;
begin
    if v_key = 'tables' then
        -- (on the coordinator: the generic plans of the function's SET clause are for
        -- statements on shard tables, sql/citus/delegated.sql)
        perform pg_catalog.set_config('plan_cache_mode', 'auto', true);
    else
        -- (harbor._append_statements: the append in one statement, the steps below when
        -- it inserted nothing)
        execute format('execute harbor_append_one_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L,'
                       ' %L, %L, %L)', v_key, p_tenant_id, p_user_id, p_session_id,
                       p_project_id, p_principal_id, p_role, p_content, p_name, p_tool_calls,
                       p_tool_call_id, p_metadata, p_token_estimate)
            into id, created_at;
    end if;
    if id is null then
        execute format('execute harbor_append_lock_%s(%L, %L, %L, %L)', v_key, p_tenant_id,
                       p_user_id, '', 'user') into v_locked;
        execute format('execute harbor_append_lock_%s(%L, %L, %L, %L)', v_key, p_tenant_id,
                       p_user_id, p_session_id, 'session') into v_session_locked;
        if v_locked + v_session_locked < 2 then
            -- (the first turn of the user or the session: its lock rows written, on the
            -- shard too; as a statement on the distributed table it cost the worker Citus's
            -- planning of it, about 0.7 ms of a 1.4 ms append on the test cluster)
            execute format('execute harbor_append_locks_%s(%L, %L, %L)', v_key, p_tenant_id,
                           p_user_id, p_session_id);
        end if;
        execute format('execute harbor_append_last_%s(%L, %L, %L)', v_key, p_tenant_id,
                       p_user_id, p_session_id) into v_last;
        v_id := pg_catalog.nextval('harbor.messages_id_seq'::pg_catalog.regclass);
        loop
            if v_id <= v_last then
                v_id := v_last + 1;
            end if;
            execute format('execute harbor_append_insert_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L,'
                           ' %L, %L, %L, %L)', v_key, p_tenant_id, v_id, p_user_id, p_session_id,
                           p_project_id, p_principal_id, p_role, p_content, p_name, p_tool_calls,
                           p_tool_call_id, p_metadata, p_token_estimate)
                into id, created_at;
            exit when id is not null;
            -- (the id is another session's of the tenant: the next one)
            v_last := v_id;
        end loop;
    end if;
    if p_min_turns is null then
        return;
    end if;
    execute format('execute harbor_append_state_%s(%L, %L, %L)', v_key, p_tenant_id,
                   p_user_id, p_session_id)
        into v_state, v_lease_until, v_summarised_at, v_turns_at_summary;
    if v_state is null then
        execute format('execute harbor_append_count_%s(%L, %L, %L, %L)', v_key, p_tenant_id,
                       p_user_id, p_session_id, p_min_turns) into v_turns;
        summary_due := v_turns >= p_min_turns;
    elsif v_lease_until > pg_catalog.clock_timestamp()
          or v_summarised_at > pg_catalog.clock_timestamp()
                               - pg_catalog.make_interval(secs => p_cooldown_seconds) then
        summary_due := false;
    else
        if v_key = 'tables' then
            -- (on the coordinator: a call Citus did not delegate; above)
            select pg_catalog.count(*) into v_turns from harbor.messages m
             where m.tenant_id = p_tenant_id and m.user_id = p_user_id
               and m.session_id = p_session_id;
        else
            v_turns := harbor._delegated_session_turns(p_tenant_id, p_user_id, p_session_id);
        end if;
        summary_due := v_turns >= p_min_turns
                       and (v_turns < v_turns_at_summary
                            or v_turns - v_turns_at_summary >= p_min_turns);
    end if;
end
$$;
alter function harbor._append_steps(text, text, text, text, text, harbor.message_role,
                                       text, text, jsonb, text, jsonb, integer, bigint,
                                       double precision)
    owner to harbor_owner;
revoke all on function harbor._append_steps(text, text, text, text, text,
                                               harbor.message_role, text, text, jsonb, text,
                                               jsonb, integer, bigint, double precision)
    from public;
grant execute on function harbor._append_steps(text, text, text, text, text,
                                                  harbor.message_role, text, text, jsonb,
                                                  text, jsonb, integer, bigint,
                                                  double precision)
    to harbor_app;

create or replace function harbor.append_turn(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_role harbor.message_role, p_content text,
    p_name text, p_tool_calls jsonb, p_tool_call_id text, p_metadata jsonb,
    p_token_estimate integer, p_min_turns bigint default null,
    p_cooldown_seconds double precision default null,
    out id bigint, out created_at timestamptz, out summary_due boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.append_turn', 'harbor.messages', p_tenant_id, p_project_id, p_principal_id,
        p_user_id, p_session_id, p_run_id);
    select a.id, a.created_at, a.summary_due into id, created_at, summary_due
      from harbor._append_steps(p_tenant_id, p_project_id, p_principal_id, p_user_id,
                                p_session_id, p_role, p_content, p_name, p_tool_calls,
                                p_tool_call_id, p_metadata, p_token_estimate, p_min_turns,
                                p_cooldown_seconds) a;
end
$$;
alter function harbor.append_turn(text, text, text, text, text, text, harbor.message_role, text,
                                  text, jsonb, text, jsonb, integer, bigint, double precision)
    owner to harbor_owner;
revoke all on function harbor.append_turn(text, text, text, text, text, text,
                                          harbor.message_role, text, text, jsonb, text, jsonb,
                                          integer, bigint, double precision)
    from public, harbor_admin, harbor_search;
grant execute on function harbor.append_turn(text, text, text, text, text, text,
                                             harbor.message_role, text, text, jsonb, text,
                                             jsonb, integer, bigint, double precision)
    to harbor_app;
