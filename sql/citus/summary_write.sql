-- A session's rolling summary written (PostgresLongTermStore.save_summary: the per-turn
-- context's and the queued fold's write) on a distributed database, in one call that
-- Citus delegates whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it, and its own transaction on the worker: no transaction block,
-- no SET LOCAL, no commit round trip, where the coordinator's transaction sent on each of
-- its statements (the guards, the refresh, the insert, the read-back) with its BEGIN,
-- identity and COMMIT.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The steps
-- are the one-server statements', in the call's one transaction, as the caller (security
-- invoker), over the tenant's shard tables (which carry the distributed tables' policies,
-- triggers and keys; prepared once a connection, harbor._prepare_on_shard; the distributed
-- tables on the coordinator, for a call Citus did not delegate):
--   with p_turn_id (the newest turn the summary folded), job_write_lock and
--       job_turn_present (sql/queries/extraction.sql): the session's lock row, then the
--       turn still stored, or no_data_found and nothing written (an erasure that held
--       the lock deleted it);
--   context_refresh_summary (sql/queries/context.sql): the summary refreshed in place if
--       its frontier is still p_expected_frontier;
--   with p_create and nothing refreshed, context_insert_summary: the summary created;
--   the row written, read back (get_memory's columns); none when another writer got there
--   first.
create or replace function harbor._summary_statements(p_tenant_id text) returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key      text := 'tables';
    v_memories text;
    v_locks    text;
    v_messages text;
    v_names    text[];
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.memories'::regclass,
                                                      p_tenant_id)::text;
    end if;
    -- (prepared already: their names are all this needs)
    if harbor._prepared_on_shard('harbor_summary_lock_' || v_key) then
        return v_key;
    end if;
    v_memories := harbor._tenant_table('harbor.memories', p_tenant_id);
    v_locks := harbor._tenant_table('harbor.owner_locks', p_tenant_id);
    v_messages := harbor._tenant_table('harbor.messages', p_tenant_id);
    v_names := array['harbor_summary_lock_' || v_key, 'harbor_summary_turn_' || v_key,
                     'harbor_summary_refresh_' || v_key, 'harbor_summary_insert_' || v_key,
                     'harbor_summary_read_' || v_key];
    perform harbor._prepare_on_shard(v_names, array[
        format('prepare %s(text, text, text) as insert into %s as l (tenant_id, user_id,'
               ' session_id, scope) values ($1, $2, $3, ''session'') on conflict (tenant_id,'
               ' user_id, session_id, scope, project_id, run_id) do update set scope ='
               ' excluded.scope where false', v_names[1], v_locks),
        format('prepare %s(text, bigint) as select exists (select 1 from %s m'
               ' where m.tenant_id = $1 and m.id = $2)', v_names[2], v_messages),
        format('prepare %s(text, text, text, text, text, text, text[], jsonb, text) as'
               ' update %s m set content = $5, content_hash = $6, source_message_ids = $7,'
               ' metadata = $8, updated_at = pg_catalog.now()'
               ' where m.tenant_id = $1 and m.id = $2 and m.scope = ''session'''
               ' and m.memory_type = ''summary'' and m.user_id = $3 and m.session_id = $4'
               ' and upper_inf(m.valid)'
               ' and coalesce(m.metadata ->> ''last_covered_message_id'', '''') = $9'
               ' returning m.id', v_names[3], v_memories),
        format('prepare %s(text, text, text, text, text, real, text, text, text[], jsonb) as'
               ' insert into %s (tenant_id, id, scope, project_id, user_id, session_id,'
               ' run_id, principal_id, memory_type, importance, content, content_hash,'
               ' entity_ids, source, sensitivity, source_session_id, source_message_ids,'
               ' metadata) values ($1, $2, ''session'', '''', $3, $4, '''', $5, ''summary'','
               ' $6, $7, $8, ''{}'', ''summary'', ''none'', $4, $9, $10)'
               ' on conflict do nothing returning id', v_names[4], v_memories),
        format('prepare %s(text, text) as'
               ' select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id,'
               ' m.user_id, m.session_id, m.run_id, m.memory_type::text, m.content,'
               ' m.content_hash, m.importance, m.entity_ids, m.source, m.sensitivity::text,'
               ' lower(m.valid), upper(m.valid), m.superseded_by, m.source_session_id,'
               ' m.source_message_ids, m.metadata, m.context, m.created_at, m.updated_at,'
               ' m.expires_at from %s m where m.tenant_id = $1 and m.id = $2',
               v_names[5], v_memories)]);
    return v_key;
end
$$;
alter function harbor._summary_statements(text) owner to harbor_owner;
revoke all on function harbor._summary_statements(text) from public;
grant execute on function harbor._summary_statements(text) to harbor_app;

create or replace function harbor.save_summary_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_id text, p_importance real, p_content text, p_content_hash text,
    p_source_message_ids text[], p_metadata jsonb, p_expected_frontier text,
    p_create boolean, p_turn_id bigint
) returns table (
    id text, tenant_id text, scope text, project_id text, principal_id text, user_id text,
    session_id text, run_id text, memory_type text, content text, content_hash text,
    importance real, entity_ids text[], source text, sensitivity text,
    valid_from timestamptz, invalid_at timestamptz, superseded_by text,
    source_session_id text, source_message_ids text[], metadata jsonb, context text,
    created_at timestamptz, updated_at timestamptz, expires_at timestamptz
)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user    text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_key     text;     -- the suffix of the prepared statements' names
    v_present boolean;
    v_written text;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.save_summary_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_key := harbor._summary_statements(p_tenant_id);
    if p_turn_id is not null then
        execute format('execute harbor_summary_lock_%s(%L, %L, %L)', v_key, p_tenant_id,
                       v_user, p_session_id);
        execute format('execute harbor_summary_turn_%s(%L, %L)', v_key, p_tenant_id,
                       p_turn_id)
            into v_present;
        if not v_present then
            -- (harbor.require_turn's error: the facade raises MemoryNotFoundError)
            raise exception 'harbor.require_turn: turn % is gone (erased or expired)', p_turn_id
                using errcode = 'no_data_found';
        end if;
    end if;
    execute format('execute harbor_summary_refresh_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L)',
                   v_key, p_tenant_id, p_id, v_user, p_session_id, p_content, p_content_hash,
                   p_source_message_ids, p_metadata, coalesce(p_expected_frontier, ''))
        into v_written;
    if v_written is null and p_create then
        execute format('execute harbor_summary_insert_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L,'
                       ' %L)', v_key, p_tenant_id, p_id, v_user, p_session_id,
                       coalesce(p_principal_id, ''), p_importance, p_content, p_content_hash,
                       p_source_message_ids, p_metadata)
            into v_written;
    end if;
    if v_written is null then
        return;  -- another writer refreshed (or created) it first
    end if;
    return query execute format('execute harbor_summary_read_%s(%L, %L)', v_key, p_tenant_id,
                                v_written);
end
$$;
alter function harbor.save_summary_delegated(text, text, text, text, text, text, text, real,
                                             text, text, text[], jsonb, text, boolean, bigint)
    owner to harbor_owner;
revoke all on function harbor.save_summary_delegated(text, text, text, text, text, text, text,
                                                     real, text, text, text[], jsonb, text,
                                                     boolean, bigint)
    from public, harbor_admin;
grant execute on function harbor.save_summary_delegated(text, text, text, text, text, text,
                                                        text, real, text, text, text[], jsonb,
                                                        text, boolean, bigint)
    to harbor_app;
