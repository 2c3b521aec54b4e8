-- What the delegated calls (sql/citus/append.sql, recall.sql, save.sql) do first.
--
-- harbor._hold_tenant_shard: their hold on their tenant's shard. Citus sends a delegated call to the node that holds the tenant's shard when
-- the coordinator plans it; a shard move or a tenant's isolation committed while the call
-- waits on that node would make Citus send the call's statements on to the shard's new
-- node, without the identity the call set (a write then fails that node's policies, a
-- read finds nothing). So a call first takes the shard's metadata lock, shared (a move
-- takes it exclusively on every node before it switches the shard over, and waits for the
-- calls that hold it), and then checks that the shard is still this node's: false when a
-- move got there first, and the call fails as a statement planned against a replaced shard
-- does, for the caller to send it again (harbor_pg.db.errors.ShardMovedError).
--
-- On the coordinator (a call that was not delegated) there is nothing to hold: true.
-- SECURITY DEFINER, owned by harbor_owner (Citus's lock_shard_metadata wants the table's
-- owner), for the caller's own tenant only: a caller cannot hold another tenant's shard.
create or replace function harbor._hold_tenant_shard(p_table regclass, p_tenant_id text)
    returns boolean
    language plpgsql volatile security definer
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_shard bigint;
begin
    if p_tenant_id is distinct from harbor.caller_tenant() then
        raise exception 'harbor._hold_tenant_shard: not the caller''s tenant'
            using errcode = '42501';
    end if;
    if (select g.groupid from pg_dist_local_group g) = 0 then
        -- on the coordinator (a call in a transaction block, not delegated): its
        -- statements go out planned against the current shards, the identity with them
        return true;
    end if;
    v_shard := get_shard_id_for_distribution_column(p_table, p_tenant_id);
    perform lock_shard_metadata(5, array[v_shard]);  -- 5: ShareLock
    return exists (select 1 from pg_dist_placement pl
                    where pl.shardid = v_shard
                      and pl.groupid = (select g.groupid from pg_dist_local_group g));
end
$$;
alter function harbor._hold_tenant_shard(regclass, text) owner to harbor_owner;
revoke all on function harbor._hold_tenant_shard(regclass, text) from public;
grant execute on function harbor._hold_tenant_shard(regclass, text)
    to harbor_app, harbor_admin, harbor_search;

-- harbor._delegated_caller: a delegated call's identity, which travels as the call's
-- arguments, set and checked, and its tenant's shard held, before the call reads or
-- writes anything. The identity is set with SET LOCAL, not set_config(): Citus sends it
-- on to any other node the transaction reaches. It is then compared with what the
-- policies read, harbor.caller_tenant(), caller_user() and caller_session(), which give a
-- bound role's binding (the reference table, read from this node's placement) whatever
-- was set: a caller that names another tenant (the call's distribution argument: it was
-- sent to that tenant's node), user or session than its own is refused (p_call names the
-- call in the error). Then the shard is held (above); gone from this node, the call
-- fails as a statement planned against a replaced shard does.
create or replace function harbor._delegated_caller(
    p_call text, p_table regclass, p_tenant_id text, p_project_id text,
    p_principal_id text, p_user_id text, p_session_id text, p_run_id text)
    returns void
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    execute pg_catalog.format(
        'set local harbor.tenant_id = %L; set local harbor.project_id = %L;'
        ' set local harbor.principal_id = %L; set local harbor.user_id = %L;'
        ' set local harbor.session_id = %L; set local harbor.run_id = %L',
        coalesce(p_tenant_id, ''), coalesce(p_project_id, ''), coalesce(p_principal_id, ''),
        coalesce(p_user_id, ''), coalesce(p_session_id, ''), coalesce(p_run_id, ''));
    if nullif(p_tenant_id, '') is distinct from harbor.caller_tenant()
       or nullif(p_user_id, '') is distinct from harbor.caller_user()
       or nullif(p_session_id, '') is distinct from harbor.caller_session() then
        raise exception '%: the tenant, user or session named is not the caller''s', p_call
            using errcode = '42501';
    end if;
    if not harbor._hold_tenant_shard(p_table, p_tenant_id) then
        raise exception 'could not find valid entry for shard % on this node',
            get_shard_id_for_distribution_column(p_table, p_tenant_id)
            using errcode = 'XX000';
    end if;
end
$$;
alter function harbor._delegated_caller(text, regclass, text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor._delegated_caller(text, regclass, text, text, text, text, text,
                                                text) from public;
grant execute on function harbor._delegated_caller(text, regclass, text, text, text, text,
                                                   text, text)
    to harbor_app, harbor_admin, harbor_search;

-- harbor._prepare_on_shard: the statements a delegated call runs on its tenant's own shard
-- tables (harbor._append_statements, harbor._save_statements), prepared in this connection
-- unless they already are: p_texts are whole PREPARE commands, p_names their names.
-- Each is checked by its whole text; when one is missing or another text holds its name
-- (whoever prepared it), all are dropped and prepared again. Prepared statements last as
-- long as the connection, and Citus keeps its connections to the workers open, so each
-- is prepared once for many calls. Run as the caller, as the statements are. Done, it
-- marks the connection (harbor._prepared_on_shard, below).
--
-- Such statements run their generic plans, planned once a connection: the calls that run
-- them set plan_cache_mode to force_generic_plan (in their SET clause, or around the one
-- statement: a save's insert). With the default, PostgreSQL planned the statements of an
-- append, a recent, a save, a search or a read again at each call (it estimated their
-- generic plans dearer than the custom ones): 0.1-0.6 ms a statement on the test
-- cluster, for plans no better. Citus cannot plan a statement on a distributed table
-- generically when a parameter is in a subquery ("could not create distributed plan"),
-- so the setting stays off those: on the coordinator (a call that was not delegated,
-- whose statements name the distributed tables) the calls set it back to auto (those
-- that prepare their statement with harbor._statement_on_shard, below, through that
-- function); a function they reach that reads a distributed table on the worker names
-- auto in its SET clause (harbor._delegated_session_turns); and a save's vectors, whose
-- owner trigger reads one, are inserted with the caller's setting.
create or replace function harbor._prepare_on_shard(p_names text[], p_texts text[])
    returns void
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_name text;
    v_text text;
begin
    if (select count(*)
          from unnest(p_names, p_texts) x(name, text)
          join pg_catalog.pg_prepared_statements p
            on p.name = x.name and p.statement = x.text)
       < pg_catalog.cardinality(p_names) then
        foreach v_name in array p_names loop
            if exists (select 1 from pg_catalog.pg_prepared_statements p
                        where p.name = v_name) then
                execute pg_catalog.format('deallocate %I', v_name);
            end if;
        end loop;
        foreach v_text in array p_texts loop
            execute v_text;
        end loop;
    end if;
    perform pg_catalog.set_config('harbor.prepared_' || p_names[1], '@statements_version@',
                                  false);
end
$$;
alter function harbor._prepare_on_shard(text[], text[]) owner to harbor_owner;
revoke all on function harbor._prepare_on_shard(text[], text[]) from public;
grant execute on function harbor._prepare_on_shard(text[], text[]) to harbor_app, harbor_admin;

-- harbor._tenant_table: the table a delegated call's statements name for p_tenant_id's
-- rows of p_table: on a worker, the tenant's shard table (harbor.memories_NNN, which
-- carries the distributed table's policies, triggers and grants); on the coordinator (a
-- call Citus did not delegate), the distributed table itself, which Citus routes.
create or replace function harbor._tenant_table(p_table regclass, p_tenant_id text)
    returns text
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if (select g.groupid from pg_dist_local_group g) = 0 then
        return p_table::text;
    end if;
    return shard_name(p_table, get_shard_id_for_distribution_column(p_table, p_tenant_id));
end
$$;
alter function harbor._tenant_table(regclass, text) owner to harbor_owner;
revoke all on function harbor._tenant_table(regclass, text) from public;
grant execute on function harbor._tenant_table(regclass, text)
    to harbor_app, harbor_admin, harbor_search;

-- harbor._statement_on_shard: the name of a delegated call's one statement for
-- p_tenant_id, prepared in this connection unless the mark says it is (above): on the
-- worker that holds the tenant's shard, p_prefix and the shard's id, the statement over
-- the shard table (which carries the distributed table's policies); on the coordinator (a
-- call in a transaction block, not delegated), p_prefix and 'tables', over the
-- distributed table, which Citus routes to the tenant's shard. p_prepare is the PREPARE
-- command with two %s: its name, then the table. Run as the caller, as the statement is.
create or replace function harbor._statement_on_shard(
    p_prefix text, p_table regclass, p_tenant_id text, p_prepare text)
    returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_shard bigint;
    v_name  text := p_prefix || 'tables';
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_shard := get_shard_id_for_distribution_column(p_table, p_tenant_id);
        v_name := p_prefix || v_shard;
    else
        -- (the statement names the distributed table, which Citus plans: not with the
        -- generic plans a caller names for a shard table's, above; its SET clause
        -- restores them when it returns, and a caller without one keeps the default)
        perform pg_catalog.set_config('plan_cache_mode', 'auto', true);
    end if;
    if not harbor._prepared_on_shard(v_name) then
        perform harbor._prepare_on_shard(array[v_name], array[pg_catalog.format(
            p_prepare, v_name, harbor._tenant_table(p_table, p_tenant_id))]);
    end if;
    return v_name;
end
$$;
alter function harbor._statement_on_shard(text, regclass, text, text) owner to harbor_owner;
revoke all on function harbor._statement_on_shard(text, regclass, text, text) from public;
grant execute on function harbor._statement_on_shard(text, regclass, text, text) to harbor_app;

-- harbor._prepared_on_shard: whether this connection holds the statements that
-- harbor._prepare_on_shard prepared under p_name (the first of their names) in this
-- version of the Citus forms (@statements_version@: a digest of the SQL files, set when
-- `harbor-pg distribute` applies them), by the mark it left: a setting of the session,
-- read without listing the connection's prepared statements and comparing their texts
-- (pg_prepared_statements builds a row with the text of every statement the connection
-- holds, about a tenth of a short delegated call's time on the worker). A caller
-- builds and checks its statements' texts only when the mark is missing or older: on a
-- new connection, after `harbor-pg distribute` changed them, or after a transaction that
-- set the mark was rolled back. A session that drops the statements itself (DEALLOCATE)
-- keeps the mark, and its next call fails on the missing statement; DISCARD ALL drops
-- both. The mark says nothing to anyone else: the statements run as the caller, under
-- the caller's policies, whoever prepared them.
create or replace function harbor._prepared_on_shard(p_name text) returns boolean
    language sql stable security invoker parallel safe
return coalesce(pg_catalog.current_setting('harbor.prepared_' operator(pg_catalog.||)
                                           p_name, true), '')
       operator(pg_catalog.=) '@statements_version@';
alter function harbor._prepared_on_shard(text) owner to harbor_owner;
revoke all on function harbor._prepared_on_shard(text) from public;
grant execute on function harbor._prepared_on_shard(text) to harbor_app, harbor_admin;
