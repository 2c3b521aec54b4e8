-- An extracted fact's write (PostgresLongTermStore.add_fact: the similarity gate, then the
-- supersede of the memory it replaces or its insert; PostgresLongTermStore.supersede: an
-- observation written anew over the old one) on a distributed database, in one call that
-- Citus delegates whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it, and its own transaction on the worker: the write guards, the
-- gate and the write all or nothing there, committed in one phase. The statements it
-- replaces (sql/queries/extraction.sql: extraction_supersede_memory and
-- extraction_insert_memory, each after its guards, job_write_lock, job_turn_present,
-- job_user_lock and job_memories_present) were a transaction of several statements from
-- the coordinator, each a hop, and a writing CTE that Citus planned in steps.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statements then run as the caller (security invoker), on the tenant's shard tables
-- (harbor._fact_statements, below), under the policies they carry: the fact's owner key
-- (p_key_*) must be one the caller may write, as on one server.
--
-- The steps are one server's, in one server's order, each a statement of its own (so each
-- sees what committed before it, as the guards of the coordinator's transaction do):
--   * a queued job's write (p_turn_id): the session's lock (job_write_lock), then the turn
--     still there (harbor.require_turn; no_data_found, nothing written, when it is gone);
--   * an observation's write (p_read_ids): the user's lock (job_user_lock), then the
--     memories it was written from all still stored (no_data_found when one is gone);
--   * with p_replaces, extraction_supersede_memory's steps: the gate (a NULL
--     p_dedup_threshold: none), the replaced memory locked (current, not superseded, the
--     same scope and owner key), the successor inserted valid from now() with its vector,
--     the old interval closed and linked; when the replaced memory is not there and
--     p_insert_if_gone, the fact is inserted as new, in the same transaction;
--   * else extraction_insert_memory's: the gate, an expired duplicate closed at its
--     expiry, the memory inserted valid from p_valid_from (or now()) with its vector.
--
-- The memories an observation read may include GLOBAL ones (tenant ''), whose shard may be
-- another worker's: a call on the tenant's worker would reach it through a connection of
-- its own. So once it holds the user's lock, before it writes anything, the call looks
-- for the read memories on the tenant's shard; when one is not there (a GLOBAL memory, or
-- one erased since), it writes nothing and answers with global_read true, and the caller writes the
-- fact as before this call existed, in the coordinator's transaction, which reads the ''
-- shard too (and raises no_data_found for an erased memory). An observation of
-- MemoryManager.observe reads the caller's USER memories only, so it is decided here.
--
-- Returns one row: global_read (then nothing else), the gate's restatement_of and
-- restatement_similarity (nothing written), replaced_found (p_replaces: whether the
-- replaced memory was there to supersede) and closed_id, then the memory's columns and
-- created: the memory written, or the currently valid duplicate that took its place
-- (created false; as find_current_duplicate and get_memory read it back: no columns when
-- the caller cannot see it), none when nothing was to be written.

-- The similarity gate of extraction_insert_memory and extraction_supersede_memory, for
-- harbor.add_fact_delegated below: the owner's nearest currently valid memory when it is at
-- least p_threshold similar and not past its expiry (else no row). The nearest memory is
-- read in a statement of its own, beside no distributed table: on Citus
-- harbor.nearest_current_memory runs statements of its own on the tenant's shards, which
-- a statement already on a shard cannot.
create or replace function harbor._fact_gate(
    p_tenant_id text, p_scope harbor.memory_scope, p_project_id text, p_user_id text,
    p_session_id text, p_run_id text, p_model_id text, p_dims integer,
    p_embedding public.vector, p_exclude_ids text[], p_threshold double precision)
    returns table (restatement_of text, restatement_similarity double precision)
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_id  text;
    v_sim double precision;
begin
    select n.memory_id, n.similarity into v_id, v_sim
      from harbor.nearest_current_memory(p_tenant_id, p_scope, p_project_id, p_user_id,
                                         p_session_id, p_run_id, p_model_id, p_dims,
                                         p_embedding, p_exclude_ids) n;
    if v_id is null or not (v_sim >= p_threshold)
       or exists (select 1 from harbor.memories x
                   where x.tenant_id = p_tenant_id and x.id = v_id
                     and x.expires_at <= pg_catalog.now()) then
        return;
    end if;
    restatement_of := v_id;
    restatement_similarity := v_sim;
    return next;
end
$$;
alter function harbor._fact_gate(text, harbor.memory_scope, text, text, text, text, text,
                                 integer, public.vector, text[], double precision)
    owner to harbor_owner;
revoke all on function harbor._fact_gate(text, harbor.memory_scope, text, text, text, text,
                                         text, integer, public.vector, text[],
                                         double precision)
    from public;
grant execute on function harbor._fact_gate(text, harbor.memory_scope, text, text, text, text,
                                            text, integer, public.vector, text[],
                                            double precision)
    to harbor_app;

-- The call's statements, prepared once a connection (harbor._prepare_on_shard,
-- sql/citus/delegated.sql) and run by name, as a save's are (sql/citus/save.sql): on the
-- worker they address the tenant's own shard tables (harbor.memories_NNN and the others),
-- which carry the distributed tables' policies, on the coordinator (a call Citus did not
-- delegate) the distributed tables. Each is one server's statement (the guards' of
-- sql/queries/extraction.sql and sql/functions/tiers.sql, the steps of
-- extraction_supersede_memory and extraction_insert_memory); on the distributed tables each
-- paid Citus's planning on the worker, about 1-2 ms a statement on the test cluster.
-- Returns the suffix of their names (the memories shard's id; 'tables' on the coordinator).
create or replace function harbor._fact_statements(p_tenant_id text) returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key      text := 'tables';
    v_memories text;
    v_vectors  text;
    v_locks    text;
    v_turns    text;
    v_names    text[];
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.memories'::regclass,
                                                      p_tenant_id)::text;
    end if;
    -- (prepared already: their names are all this needs)
    if harbor._prepared_on_shard('harbor_fact_read_' || v_key) then
        return v_key;
    end if;
    v_memories := harbor._tenant_table('harbor.memories', p_tenant_id);
    v_vectors := harbor._tenant_table('harbor.memory_embeddings', p_tenant_id);
    v_locks := harbor._tenant_table('harbor.owner_locks', p_tenant_id);
    v_turns := harbor._tenant_table('harbor.messages', p_tenant_id);
    v_names := array['harbor_fact_read_', 'harbor_fact_lock_', 'harbor_fact_turn_',
                     'harbor_fact_target_', 'harbor_fact_insert_', 'harbor_fact_vector_',
                     'harbor_fact_close_', 'harbor_fact_expired_', 'harbor_fact_duplicate_'];
    v_names := array(select n || v_key from unnest(v_names) with ordinality u(n, i) order by i);
    perform harbor._prepare_on_shard(v_names, array[
        -- the memories an observation read, on the tenant's shard (harbor.require_memories)
        format($f$prepare %s(text, text[]) as select pg_catalog.count(distinct m.id) from %s m
                   where m.tenant_id = $1 and m.id = any ($2)$f$, v_names[1], v_memories),
        -- a session's or a user's lock (job_write_lock, job_user_lock)
        format($f$prepare %s(text, text, text, harbor.memory_scope) as
                  insert into %s as l (tenant_id, user_id, session_id, scope)
                  values ($1, $2, $3, $4)
                  on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
                  do update set scope = excluded.scope where false$f$, v_names[2], v_locks),
        -- the job's turn still there (harbor.require_turn)
        format($f$prepare %s(text, bigint) as select exists (select 1 from %s m
                   where m.tenant_id = $1 and m.id = $2)$f$, v_names[3], v_turns),
        -- the replaced memory locked (extraction_supersede_memory's target)
        format($f$prepare %s(text, text, harbor.memory_scope, text, text, text, text) as
                  select m.id from %s m
                   where m.tenant_id = $1 and m.id = $2 and m.scope = $3
                     and m.project_id = $4 and m.user_id = $5 and m.session_id = $6
                     and m.run_id = $7 and m.memory_type <> 'summary'
                     and m.superseded_by is null
                     and upper_inf(m.valid) and lower(m.valid) < pg_catalog.now()
                     for update$f$, v_names[4], v_memories),
        -- the memory inserted, valid from $20 (or now())
        format($f$prepare %s(text, text, harbor.memory_scope, text, text, text, text, text,
                             harbor.memory_type, real, text, text, text, text[], text,
                             harbor.sensitivity, text, text[], jsonb, timestamptz) as
                  insert into %s as m (tenant_id, id, scope, project_id, user_id, session_id,
                                       run_id, principal_id, memory_type, importance, content,
                                       content_hash, context, entity_ids, source, sensitivity,
                                       source_session_id, source_message_ids, metadata, valid)
                  values ($1, coalesce($2, (pg_catalog.gen_random_uuid())::text), $3, $4, $5,
                          $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
                          pg_catalog.tstzrange(coalesce($20, pg_catalog.now()), null, '[)'))
                  on conflict do nothing
                  returning m.*$f$, v_names[5], v_memories),
        -- its vector
        format($f$prepare %s(text, text, text, integer, public.vector, harbor.memory_scope,
                             text, text, text, text) as
                  insert into %s (tenant_id, memory_id, model_id, dims, embedding, scope,
                                  project_id, user_id, session_id, run_id)
                  values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)$f$, v_names[6], v_vectors),
        -- the replaced memory's interval closed and linked to its successor
        format($f$prepare %s(text, text, text) as
                  update %s m set valid = pg_catalog.tstzrange(lower(m.valid), pg_catalog.now(),
                                                              '[)'),
                                  superseded_by = $3
                   where m.tenant_id = $1 and m.id = $2
                  returning m.id$f$, v_names[7], v_memories),
        -- a duplicate past its expiry closed at its expiry
        format($f$prepare %s(text, harbor.memory_scope, text, text, text, text, text) as
                  update %s d
                     set valid = case when d.expires_at > pg_catalog.lower(d.valid)
                                      then pg_catalog.tstzrange(pg_catalog.lower(d.valid),
                                                                d.expires_at, '[)')
                                      else pg_catalog.tstzrange(pg_catalog.lower(d.valid),
                                                                pg_catalog.lower(d.valid),
                                                                '[]') end
                   where d.tenant_id = $1
                     and d.expires_at is not null and d.expires_at <= pg_catalog.now()
                     and pg_catalog.upper_inf(d.valid)
                     and d.user_id = $4 and d.project_id = $3
                     and d.session_id = $5 and d.run_id = $6
                     and d.content_hash = $7 and d.scope = $2$f$, v_names[8], v_memories),
        -- the currently valid duplicate (find_current_duplicate, get_memory)
        format($f$prepare %s(text, harbor.memory_scope, text, text, text, text, text) as
                  select m.* from %s m
                   where m.tenant_id = $1 and m.scope = $2 and m.project_id = $3
                     and m.user_id = $4 and m.session_id = $5 and m.run_id = $6
                     and m.content_hash = $7 and upper_inf(m.valid)$f$,
               v_names[9], v_memories)]);
    return v_key;
end
$$;
alter function harbor._fact_statements(text) owner to harbor_owner;
revoke all on function harbor._fact_statements(text) from public;
grant execute on function harbor._fact_statements(text) to harbor_app;

create or replace function harbor.add_fact_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_scope harbor.memory_scope, p_key_project_id text, p_key_user_id text,
    p_key_session_id text, p_key_run_id text,
    p_id text, p_writer_id text, p_memory_type harbor.memory_type, p_importance real,
    p_content text, p_content_hash text, p_context text, p_entity_ids text[], p_source text,
    p_sensitivity harbor.sensitivity, p_source_session_id text,
    p_source_message_ids text[], p_metadata jsonb, p_valid_from timestamptz,
    p_model_id text, p_dims integer, p_embedding public.vector,
    p_dedup_threshold double precision, p_exclude_ids text[],
    p_replaces text, p_insert_if_gone boolean, p_turn_id bigint, p_read_ids text[])
    returns table (
        global_read boolean, restatement_of text, restatement_similarity double precision,
        replaced_found boolean, closed_id text,
        id text, tenant_id text, scope text, project_id text, principal_id text,
        user_id text, session_id text, run_id text, memory_type text, content text,
        content_hash text, importance real, entity_ids text[], source text,
        sensitivity text, valid_from timestamptz, invalid_at timestamptz,
        superseded_by text, source_session_id text, source_message_ids text[],
        metadata jsonb, context text, created_at timestamptz, updated_at timestamptz,
        expires_at timestamptz, created boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_user   text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_key    text;    -- the suffix of the statements' names (harbor._fact_statements)
    v_read   bigint;  -- how many of the memories read are on the tenant's shard
    v_wanted integer; -- how many distinct memories were read
    v_there  boolean;
    v_target text;
    v_row    harbor.memories%rowtype;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.add_fact_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_key := harbor._fact_statements(p_tenant_id);
    global_read := false;
    -- a queued job's guards (job_write_lock, then job_turn_present)
    if p_turn_id is not null then
        execute format('execute harbor_fact_lock_%s(%L, %L, %L, %L)', v_key, p_tenant_id,
                       v_user, p_session_id, 'session');
        execute format('execute harbor_fact_turn_%s(%L, %L)', v_key, p_tenant_id, p_turn_id)
            into v_there;
        if not v_there then
            raise exception 'harbor.require_turn: turn % is gone (erased or expired)', p_turn_id
                using errcode = 'no_data_found';
        end if;
    end if;
    -- an observation's guards (job_user_lock, then job_memories_present), on the tenant's
    -- shard: a memory read that is not there (a GLOBAL one, or one erased) is not decided
    -- here, and nothing is written
    if p_read_ids is not null then
        execute format('execute harbor_fact_lock_%s(%L, %L, %L, %L)', v_key, p_tenant_id,
                       v_user, '', 'user');
        v_wanted := cardinality(array(select distinct r from unnest(p_read_ids) r));
        execute format('execute harbor_fact_read_%s(%L, %L)', v_key, p_tenant_id, p_read_ids)
            into v_read;
        if v_read < v_wanted then
            global_read := true;
            return next;
            return;
        end if;
    end if;
    -- the similarity gate (a NULL threshold: no gate; never a memory past its expiry)
    if p_dedup_threshold is not null then
        select g.restatement_of, g.restatement_similarity
          into restatement_of, restatement_similarity
          from harbor._fact_gate(p_tenant_id, p_scope, p_key_project_id, p_key_user_id,
                                 p_key_session_id, p_key_run_id, p_model_id, p_dims,
                                 p_embedding, p_exclude_ids, p_dedup_threshold) g;
        if restatement_of is not null then
            return next;
            return;
        end if;
    end if;
    if p_replaces is not null then
        -- extraction_supersede_memory: the replaced memory locked (a concurrent superseder
        -- that won the lock first leaves nothing to lock), the successor inserted valid
        -- from now() with its vector, the old interval closed and linked
        execute format('execute harbor_fact_target_%s(%L, %L, %L, %L, %L, %L, %L)', v_key,
                       p_tenant_id, p_replaces, p_scope, p_key_project_id, p_key_user_id,
                       p_key_session_id, p_key_run_id)
            into v_target;
        replaced_found := v_target is not null;
        if v_target is not null then
            execute format('execute harbor_fact_insert_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L,'
                           ' %L, %L, %L, %L, %L, %L, %L, %L, %L, %L, %L)', v_key,
                           p_tenant_id, p_id, p_scope, p_key_project_id, p_key_user_id,
                           p_key_session_id, p_key_run_id, p_writer_id, p_memory_type,
                           p_importance, p_content, p_content_hash, p_context, p_entity_ids,
                           p_source, p_sensitivity, p_source_session_id, p_source_message_ids,
                           p_metadata, null)
                into v_row;
            if v_row.id is not null then
                if p_embedding is not null then
                    execute format('execute harbor_fact_vector_%s(%L, %L, %L, %L, %L, %L, %L,'
                                   ' %L, %L, %L)', v_key, v_row.tenant_id, v_row.id,
                                   p_model_id, p_dims, p_embedding, v_row.scope,
                                   v_row.project_id, v_row.user_id, v_row.session_id,
                                   v_row.run_id);
                end if;
                execute format('execute harbor_fact_close_%s(%L, %L, %L)', v_key, p_tenant_id,
                               v_target, v_row.id)
                    into closed_id;
            end if;
        end if;
    end if;
    if p_replaces is null or (v_target is null and p_insert_if_gone) then
        -- extraction_insert_memory (a replaced memory that is gone: the gate above, in
        -- this transaction, already found nothing to restate)
        -- a duplicate past its expiry closed at its expiry first
        execute format('execute harbor_fact_expired_%s(%L, %L, %L, %L, %L, %L, %L)', v_key,
                       p_tenant_id, p_scope, p_key_project_id, p_key_user_id,
                       p_key_session_id, p_key_run_id, p_content_hash);
        execute format('execute harbor_fact_insert_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L, %L,'
                       ' %L, %L, %L, %L, %L, %L, %L, %L, %L, %L)', v_key,
                       p_tenant_id, p_id, p_scope, p_key_project_id, p_key_user_id,
                       p_key_session_id, p_key_run_id, p_writer_id, p_memory_type,
                       p_importance, p_content, p_content_hash, p_context, p_entity_ids,
                       p_source, p_sensitivity, p_source_session_id, p_source_message_ids,
                       p_metadata, p_valid_from)
            into v_row;
        if v_row.id is not null and p_embedding is not null then
            execute format('execute harbor_fact_vector_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L,'
                           ' %L)', v_key, v_row.tenant_id, v_row.id, p_model_id, p_dims,
                           p_embedding, v_row.scope, v_row.project_id, v_row.user_id,
                           v_row.session_id, v_row.run_id);
        end if;
    end if;
    created := v_row.id is not null;
    if v_row.id is null and (p_replaces is null or v_target is not null or p_insert_if_gone) then
        -- a currently valid duplicate took its place: that memory, as find_current_duplicate
        -- and get_memory read it back (none when the caller cannot see it)
        execute format('execute harbor_fact_duplicate_%s(%L, %L, %L, %L, %L, %L, %L)', v_key,
                       p_tenant_id, p_scope, p_key_project_id, p_key_user_id,
                       p_key_session_id, p_key_run_id, p_content_hash)
            into v_row;
    end if;
    if v_row.id is not null then
        id := v_row.id;
        tenant_id := v_row.tenant_id;
        scope := v_row.scope::text;
        project_id := v_row.project_id;
        principal_id := v_row.principal_id;
        user_id := v_row.user_id;
        session_id := v_row.session_id;
        run_id := v_row.run_id;
        memory_type := v_row.memory_type::text;
        content := v_row.content;
        content_hash := v_row.content_hash;
        importance := v_row.importance;
        entity_ids := v_row.entity_ids;
        source := v_row.source;
        sensitivity := v_row.sensitivity::text;
        valid_from := lower(v_row.valid);
        invalid_at := upper(v_row.valid);
        superseded_by := v_row.superseded_by;
        source_session_id := v_row.source_session_id;
        source_message_ids := v_row.source_message_ids;
        metadata := v_row.metadata;
        context := v_row.context;
        created_at := v_row.created_at;
        updated_at := v_row.updated_at;
        expires_at := v_row.expires_at;
    end if;
    return next;
end
$$;
alter function harbor.add_fact_delegated(
    text, text, text, text, text, text, harbor.memory_scope, text, text, text, text, text, text,
    harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity, text, text[],
    jsonb, timestamptz, text, integer, public.vector, double precision, text[], text, boolean,
    bigint, text[])
    owner to harbor_owner;
revoke all on function harbor.add_fact_delegated(
    text, text, text, text, text, text, harbor.memory_scope, text, text, text, text, text, text,
    harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity, text, text[],
    jsonb, timestamptz, text, integer, public.vector, double precision, text[], text, boolean,
    bigint, text[])
    from public, harbor_admin;
grant execute on function harbor.add_fact_delegated(
    text, text, text, text, text, text, harbor.memory_scope, text, text, text, text, text, text,
    harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity, text, text[],
    jsonb, timestamptz, text, integer, public.vector, double precision, text[], text, boolean,
    bigint, text[])
    to harbor_app;
