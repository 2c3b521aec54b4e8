-- A session's background-summary lease on a distributed database (PostgresShortTermStore:
-- acquire_summary_lease, finish_summary_lease, release_summary_lease), each a call that
-- Citus delegates whole to the tenant's worker (harbor-pg distribute registers them with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.session_state; harbor_pg.db.citus). Sent in autocommit, each is the one command
-- the coordinator sends for it, and its own transaction on the worker. Before, taking or
-- finishing a lease was two transactions (the Citus forms of sql/queries/citus.sql: the
-- time and the turn count read first, then bound into the statement, since Citus refuses
-- a clock or a STABLE function in an ON CONFLICT ... WHERE or an UPDATE); on the tenant's
-- shard tables the single-server statements (sql/queries/context.sql) run as they are, the
-- lease still taken by one atomic INSERT ... ON CONFLICT DO UPDATE ... WHERE (of
-- concurrent callers exactly one gets a row back), the session's turns counted in the
-- statement, under the shard's policies.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statements then run as the caller (security invoker), over the tenant's shard tables
-- (prepared once a connection, harbor._prepare_on_shard), under the policies they carry.
-- On the coordinator (a call in a transaction block, which Citus does not delegate) the
-- same steps run over the distributed tables in the form Citus accepts there.
create or replace function harbor._lease_statements(p_tenant_id text) returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key      text := 'tables';
    v_state    text;
    v_messages text;
    v_names    text[];
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.session_state'::regclass,
                                                      p_tenant_id)::text;
    end if;
    -- (prepared already: their names are all this needs)
    if harbor._prepared_on_shard('harbor_lease_acquire_' || v_key) then
        return v_key;
    end if;
    v_state := harbor._tenant_table('harbor.session_state', p_tenant_id);
    v_messages := harbor._tenant_table('harbor.messages', p_tenant_id);
    v_names := array['harbor_lease_acquire_' || v_key, 'harbor_lease_finish_' || v_key,
                     'harbor_lease_release_' || v_key];
    perform harbor._prepare_on_shard(v_names, array[
        format($q$prepare %1$s(text, text, text, double precision, bigint, double precision) as
            with turns as (
                select pg_catalog.count(*) as n
                  from %2$s m
                 where m.tenant_id = $1 and m.user_id = $2 and m.session_id = $3
            )
            insert into %3$s as s (tenant_id, user_id, session_id, summary_lease_until,
                                   turns_at_summary)
            select $1, $2, $3, pg_catalog.clock_timestamp() + make_interval(secs => $4), 0
              from turns
             where turns.n >= $5
            on conflict (tenant_id, user_id, session_id) do update
               set summary_lease_until = excluded.summary_lease_until
             where (s.summary_lease_until is null
                    or s.summary_lease_until <= pg_catalog.clock_timestamp())
               and (s.summarised_at is null
                    or s.summarised_at <= pg_catalog.clock_timestamp()
                                          - make_interval(secs => $6))
               and (select t.n from turns t) >= $5
               and ((select t.n from turns t) < s.turns_at_summary
                    or (select t.n from turns t) - s.turns_at_summary >= $5)
            returning s.summary_lease_until, s.turns_at_summary,
                      (select t.n from turns t) as turns $q$,
               v_names[1], v_messages, v_state),
        format($q$prepare %1$s(text, text, text, timestamptz, bigint) as
            update %2$s s
               set summarised_at = pg_catalog.clock_timestamp(), turns_at_summary = $5,
                   summary_lease_until = null
             where s.tenant_id = $1 and s.user_id = $2 and s.session_id = $3
               and s.summary_lease_until = $4
            returning s.session_id $q$, v_names[2], v_state),
        format($q$prepare %1$s(text, text, text, timestamptz) as
            update %2$s s
               set summary_lease_until = null
             where s.tenant_id = $1 and s.user_id = $2 and s.session_id = $3
               and s.summary_lease_until = $4
            returning s.session_id $q$, v_names[3], v_state)]);
    return v_key;
end
$$;
alter function harbor._lease_statements(text) owner to harbor_owner;
revoke all on function harbor._lease_statements(text) from public;
grant execute on function harbor._lease_statements(text) to harbor_app;

create or replace function harbor.summary_lease_acquire_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_min_turns bigint, p_cooldown_seconds double precision, p_lease_seconds double precision
) returns table (summary_lease_until timestamptz, turns_at_summary bigint, turns bigint)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user   text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_now    timestamptz;
    v_until  timestamptz;
    v_cooled timestamptz;
    v_turns  bigint;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.summary_lease_acquire_delegated', 'harbor.session_state', p_tenant_id,
        p_project_id, p_principal_id, v_user, p_session_id, p_run_id);
    if (select g.groupid from pg_dist_local_group g) = 0 then
        -- on the coordinator (a call in a transaction block, not delegated), over the
        -- distributed tables, where Citus refuses a clock or a STABLE function in the ON
        -- CONFLICT ... WHERE (timestamptz arithmetic included): the times and the turn
        -- count taken first, the statement's values bound (the lease still taken by the
        -- one atomic statement)
        v_now := pg_catalog.clock_timestamp();
        v_until := v_now + make_interval(secs => p_lease_seconds);
        v_cooled := v_now - make_interval(secs => p_cooldown_seconds);
        select pg_catalog.count(*) into v_turns
          from harbor.messages m
         where m.tenant_id = p_tenant_id and m.user_id = v_user
           and m.session_id = p_session_id;
        if v_turns < p_min_turns then
            return;
        end if;
        return query
        insert into harbor.session_state as s (tenant_id, user_id, session_id,
                                               summary_lease_until, turns_at_summary)
        values (p_tenant_id, v_user, p_session_id, v_until, 0)
        on conflict (tenant_id, user_id, session_id) do update
           set summary_lease_until = excluded.summary_lease_until
         where (s.summary_lease_until is null or s.summary_lease_until <= v_now)
           and (s.summarised_at is null or s.summarised_at <= v_cooled)
           and (v_turns < s.turns_at_summary or v_turns - s.turns_at_summary >= p_min_turns)
        returning s.summary_lease_until, s.turns_at_summary, v_turns;
        return;
    end if;
    return query execute format('execute harbor_lease_acquire_%s(%L, %L, %L, %L, %L, %L)',
                                harbor._lease_statements(p_tenant_id), p_tenant_id, v_user,
                                p_session_id, p_lease_seconds, p_min_turns,
                                p_cooldown_seconds);
end
$$;
alter function harbor.summary_lease_acquire_delegated(text, text, text, text, text, text,
                                                      bigint, double precision,
                                                      double precision)
    owner to harbor_owner;
revoke all on function harbor.summary_lease_acquire_delegated(text, text, text, text, text,
                                                              text, bigint, double precision,
                                                              double precision)
    from public, harbor_admin;
grant execute on function harbor.summary_lease_acquire_delegated(text, text, text, text, text,
                                                                 text, bigint,
                                                                 double precision,
                                                                 double precision)
    to harbor_app;

-- p_turns_at_summary null: the lease released, nothing recorded (release_summary_lease);
-- else the summary recorded and the lease dropped (finish_summary_lease). Either only if
-- p_lease_until still holds the lease. Returns the session's id when it did.
create or replace function harbor.summary_lease_end_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_lease_until timestamptz, p_turns_at_summary bigint
) returns table (session_id text)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_key  text;
    v_now  timestamptz;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.summary_lease_end_delegated', 'harbor.session_state', p_tenant_id,
        p_project_id, p_principal_id, v_user, p_session_id, p_run_id);
    if (select g.groupid from pg_dist_local_group g) = 0 then
        -- on the coordinator (a call in a transaction block, not delegated), over the
        -- distributed table, where Citus refuses a clock in an UPDATE: the time taken first
        if p_turns_at_summary is null then
            return query
            update harbor.session_state s set summary_lease_until = null
             where s.tenant_id = p_tenant_id and s.user_id = v_user
               and s.session_id = p_session_id and s.summary_lease_until = p_lease_until
            returning s.session_id;
        else
            v_now := pg_catalog.clock_timestamp();
            return query
            update harbor.session_state s
               set summarised_at = v_now, turns_at_summary = p_turns_at_summary,
                   summary_lease_until = null
             where s.tenant_id = p_tenant_id and s.user_id = v_user
               and s.session_id = p_session_id and s.summary_lease_until = p_lease_until
            returning s.session_id;
        end if;
        return;
    end if;
    v_key := harbor._lease_statements(p_tenant_id);
    if p_turns_at_summary is null then
        return query execute format('execute harbor_lease_release_%s(%L, %L, %L, %L)', v_key,
                                    p_tenant_id, v_user, p_session_id, p_lease_until);
    else
        return query execute format('execute harbor_lease_finish_%s(%L, %L, %L, %L, %L)',
                                    v_key, p_tenant_id, v_user, p_session_id, p_lease_until,
                                    p_turns_at_summary);
    end if;
end
$$;
alter function harbor.summary_lease_end_delegated(text, text, text, text, text, text,
                                                  timestamptz, bigint)
    owner to harbor_owner;
revoke all on function harbor.summary_lease_end_delegated(text, text, text, text, text, text,
                                                          timestamptz, bigint)
    from public, harbor_admin;
grant execute on function harbor.summary_lease_end_delegated(text, text, text, text, text,
                                                             text, timestamptz, bigint)
    to harbor_app;

-- Whether the session is due a background summary (PostgresShortTermStore.summary_due:
-- whether taking the lease would succeed now), on a distributed database one call Citus
-- delegates whole to the tenant's worker, registered and checked as the lease's calls
-- above. It reads only. On the worker harbor.summary_due_rows's rule (sql/functions/
-- tiers.sql) runs over the tenant's shard tables, the session's turns counted in the
-- statement under the shard's policies (at most p_min_turns of them before the first
-- summary), prepared once a connection; on the coordinator (a call in a transaction block,
-- not delegated) the rule itself runs, in the form Citus accepts there
-- (harbor_pg.db.citus_rewrites).
create or replace function harbor.summary_due_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_min_turns bigint, p_cooldown_seconds double precision
) returns boolean
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user  text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_shard bigint;  -- the tenant's shard of harbor.session_state
    v_name  text;    -- the prepared statement's name
    v_due   boolean;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.summary_due_delegated', 'harbor.session_state', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    if (select g.groupid from pg_dist_local_group g) = 0 then
        select d.due into v_due
          from harbor.summary_due_rows(p_tenant_id, v_user, p_session_id, p_min_turns,
                                       p_cooldown_seconds) d;
        return v_due;
    end if;
    v_shard := get_shard_id_for_distribution_column('harbor.session_state'::regclass,
                                                    p_tenant_id);
    v_name := 'harbor_summary_due_' || v_shard;
    if not harbor._prepared_on_shard(v_name) then
        perform harbor._prepare_on_shard(array[v_name], array[pg_catalog.format($q$
            prepare %1$s(text, text, text, bigint, double precision) as
            select case
                     when s.session_id is null then
                       (select pg_catalog.count(*)
                          from (select 1 from %2$s m
                                 where m.tenant_id = $1 and m.user_id = $2
                                   and m.session_id = $3
                                 limit $4) x) >= $4
                     when s.summary_lease_until > pg_catalog.clock_timestamp()
                          or s.summarised_at > pg_catalog.clock_timestamp()
                                               - make_interval(secs => $5)
                     then false
                     else
                       (select c.n >= $4
                               and (c.n < s.turns_at_summary
                                    or c.n - s.turns_at_summary >= $4)
                          from (select pg_catalog.count(*) as n
                                  from %2$s m
                                 where m.tenant_id = $1 and m.user_id = $2
                                   and m.session_id = $3
                                offset 0) c)
                   end
              from (select) one
              left join %3$s s
                on s.tenant_id = $1 and s.user_id = $2 and s.session_id = $3 $q$,
            v_name, harbor._tenant_table('harbor.messages', p_tenant_id),
            harbor._tenant_table('harbor.session_state', p_tenant_id))]);
    end if;
    execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L)', v_name, p_tenant_id, v_user,
                              p_session_id, p_min_turns, p_cooldown_seconds)
        into v_due;
    return v_due;
end
$$;
alter function harbor.summary_due_delegated(text, text, text, text, text, text, bigint,
                                            double precision)
    owner to harbor_owner;
revoke all on function harbor.summary_due_delegated(text, text, text, text, text, text,
                                                    bigint, double precision)
    from public, harbor_admin;
grant execute on function harbor.summary_due_delegated(text, text, text, text, text, text,
                                                       bigint, double precision)
    to harbor_app;
