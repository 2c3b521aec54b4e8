-- Erasure of a user, a user's session or an agent (MemoryManager.erase) on a distributed
-- database, in one call that Citus delegates whole to the tenant's worker (harbor-pg
-- distribute registers it with create_distributed_function, distribution argument
-- p_tenant_id, co-located with harbor.memories, force_delegation: harbor_pg.db.citus).
-- harbor.erase (sql/functions/maintenance.sql), run on the coordinator, sent each of its
-- statements to the tenant's worker and to the global memories' ('') shard, in a
-- transaction committed on both in two phases. This call does harbor.erase's work on the
-- tenant's shards alone, in the worker's transaction.
--
-- It is sent in a transaction block (the coordinator's BEGIN, the call, then the erased
-- subject's jobs deleted from the queue, erase_jobs_citus in sql/queries/long_term.sql,
-- then COMMIT, in one round trip): the queue's tables are the coordinator's, and a
-- subject's jobs go in the erasure's transaction, as on one server. force_delegation sends
-- the call whole to the tenant's worker inside that block; the worker is the transaction's
-- only other node, so it commits in one phase.
--
-- It erases only what lies on the tenant's shards, and refuses (SQLSTATE 55000, before
-- anything is deleted; the transaction is rolled back) when something of the subject may
-- lie elsewhere, for the caller to run harbor.erase instead (harbor_pg.governance):
-- * GLOBAL memories may exist (harbor.global_memory_flag, read on this node,
--   sql/citus/global.sql): a memory derived from the subject may be one of them, on the
--   '' shard. The flag is read in the call's own transaction, so one set after the
--   caller last looked is seen here;
-- * the erased user has role bindings or access tokens: reference tables, whose delete
--   would reach every node.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statements then run as the caller (security invoker), under the same policies as
-- harbor.erase's: who may erase what is unchanged. They name the distributed tables, which
-- Citus runs on this node's shards (each names the tenant).
--
-- Returns harbor.erase's rows: one a tier, with the count deleted.
create or replace function harbor.erase_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    erase_user_id text, erase_session_id text, erase_principal_id text
) returns table (tier text, deleted bigint)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_custom_plan
as $$
declare
    t text;
    u text := erase_delegated.erase_user_id;
    s text := erase_delegated.erase_session_id;
    p text := erase_delegated.erase_principal_id;
    turn_ids text[];
    sessions text[];     -- user || chr(31) || session of every session that lost turns
    runs text[];         -- user, session, project, run (chr(31)) of every run that lost state
    gone_local text[];   -- ids of the tenant's memories to delete
    chain_id text[];
    chain_successor text[];
    chain_reopen boolean[];
    gone_id text[];
    gone_successor text[];
    gone_current boolean[];
    start_id text[];
    start_successor text[];
    n bigint;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.erase_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, p_user_id, p_session_id, p_run_id);
    t := harbor.caller_tenant();
    if t is null then
        raise exception 'harbor.erase: no identity set (harbor.set_identity)' using errcode = '42501';
    end if;
    if u is null and p is null then
        raise exception 'harbor.erase: name a user_id or a principal_id' using errcode = '22023';
    end if;
    -- what may lie off the tenant's shards (above): harbor.erase's to erase
    if harbor._global_memories_may_exist() then
        raise exception 'harbor.erase_delegated: GLOBAL memories may exist; erase with harbor.erase'
            using errcode = '55000';
    end if;
    if u is not null and s is null and p is null
       and (exists (select 1 from harbor.role_bindings b where b.tenant_id = t and b.user_id = u)
            or exists (select 1 from harbor.access_tokens k
                        where k.tenant_id = t
                          and (k.user_id = u or (k.user_id is null and k.principal_id = u)))) then
        raise exception 'harbor.erase_delegated: the user has role bindings or access tokens;'
                        ' erase with harbor.erase'
            using errcode = '55000';
    end if;

    -- from here, harbor.erase's steps (sql/functions/maintenance.sql: what each is for),
    -- over the tenant's rows alone
    -- the erased user's own lock row, then the lock of every session of the subject
    if u is not null then
        insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
        values (t, u, '', 'user')
        on conflict on constraint owner_locks_pkey
        do update set scope = excluded.scope where false;
    end if;
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    select distinct t, x.user_id, x.session_id, 'session'::harbor.memory_scope
      from harbor.messages x
     where x.tenant_id = t
       and (u is null or x.user_id = u or x.principal_id = u)
       and (s is null or x.session_id = s)
       and (p is null or x.principal_id = p)
     order by 2, 3
    on conflict on constraint owner_locks_pkey
    do update set scope = excluded.scope where false;

    with gone as (
        delete from harbor.messages x
         where x.tenant_id = t
           and (u is null or x.user_id = u or x.principal_id = u)
           and (s is null or x.session_id = s)
           and (p is null or x.principal_id = p)
        returning x.id, x.user_id, x.session_id)
    select coalesce(array_agg(gone.id::text), '{}'),
           coalesce(array_agg(distinct gone.user_id || chr(31) || gone.session_id), '{}'),
           count(*)
      into turn_ids, sessions, n from gone;
    tier := 'short_term'; deleted := n; return next;

    with doomed as (
        select m.id from harbor.memories m
         where m.tenant_id = t
           and (u is null or m.user_id = u or m.principal_id = u)
           and (s is null or m.session_id = s
                or (m.source_session_id = s and (u is null or m.source_user_id = u)))
           and (p is null or m.principal_id = p)
        union
        select m.id from harbor.memories m
         where m.tenant_id = t
           and m.source_tenant_id = t
           and u is not null and m.source_user_id = u
           and m.source_session_id is not null
           and (s is null or m.source_session_id = s)
           and (p is null or m.principal_id = p)
        union
        select m.id from harbor.memories m
         where m.tenant_id = t
           and m.source_message_ids operator(pg_catalog.&&) turn_ids
        union
        select m.id from harbor.memories m
         where m.tenant_id = t and m.scope = 'session' and m.memory_type = 'summary'
           and m.user_id || chr(31) || m.session_id = any (sessions))
    select coalesce(array_agg(d.id), '{}') into gone_local from doomed d;

    select count(*) into n from harbor.memory_embeddings x
     where x.tenant_id = t and x.memory_id = any (gone_local);
    tier := 'embeddings'; deleted := n; return next;

    -- the chains through an erased memory (harbor.erase's walk, one tenant)
    select coalesce(array_agg(m.id), '{}'), coalesce(array_agg(m.superseded_by), '{}'),
           coalesce(array_agg(upper_inf(m.valid)), '{}')
      into gone_id, gone_successor, gone_current
      from harbor.memories m
     where m.tenant_id = t and m.id = any (gone_local);
    select coalesce(array_agg(m.id), '{}'), coalesce(array_agg(m.superseded_by), '{}')
      into start_id, start_successor
      from harbor.memories m
     where m.tenant_id = t and m.superseded_by = any (gone_local)
       and not m.id = any (gone_local);
    with recursive gone as (
        select * from unnest(gone_id, gone_successor, gone_current)
                      g(id, superseded_by, is_current)
    ), walk(pred, succ) as (
        select * from unnest(start_id, start_successor)
        union
        select w.pred, x.superseded_by
          from walk w join gone x on x.id = w.succ
         where x.superseded_by is not null),
    chain as (
        select w.pred,
               max(w.succ) filter (where x.id is null) as successor,
               coalesce(bool_or(x.is_current), false) as reopen
          from walk w left join gone x on x.id = w.succ
         group by w.pred)
    select coalesce(array_agg(c.pred), '{}'), coalesce(array_agg(c.successor), '{}'),
           coalesce(array_agg(c.reopen), '{}')
      into chain_id, chain_successor, chain_reopen from chain c;

    -- the predecessors to reopen, for the add-only guard where the successor is deleted
    -- (on this node; SET LOCAL as the Citus form of harbor.erase sets it)
    execute pg_catalog.format('set local harbor.erase_reopen = %L', coalesce((
        select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(m.tenant_id, m.id))
          from unnest(chain_id, chain_successor, chain_reopen) as c(id, successor, reopen)
          join harbor.memories m on m.tenant_id = t and m.id = c.id
         where c.successor is null and c.reopen and not upper_inf(m.valid)
           and not exists (
               select 1 from harbor.memories d
                where d.tenant_id = t and d.scope = m.scope
                  and d.project_id = m.project_id and d.user_id = m.user_id
                  and d.session_id = m.session_id and d.run_id = m.run_id
                  and d.content_hash = m.content_hash and d.id <> m.id
                  and not d.id = any (gone_local)
                  and d.valid && tstzrange(lower(m.valid), null, '[)')))::text, ''));

    delete from harbor.memories m where m.tenant_id = t and m.id = any (gone_local);
    get diagnostics n = row_count;
    tier := 'long_term'; deleted := n; return next;
    set local harbor.erase_reopen = '';

    update harbor.memories m set superseded_by = c.successor
      from unnest(chain_id, chain_successor) as c(id, successor)
     where m.tenant_id = t and m.id = c.id and c.successor is not null;

    with gone as (
        delete from harbor.working_state w
         where w.tenant_id = t
           and (u is null or w.user_id = u or w.principal_id = u)
           and (s is null or w.session_id = s)
           and (p is null or w.principal_id = p)
        returning w.user_id, w.session_id, w.project_id, w.run_id)
    select coalesce(array_agg(distinct gone.user_id || chr(31) || gone.session_id || chr(31)
                                       || gone.project_id || chr(31) || gone.run_id), '{}'),
           count(*)
      into runs, n from gone;
    tier := 'working'; deleted := n; return next;

    delete from harbor.owner_locks l
     where l.tenant_id = t
       and ((u is not null and p is null and l.user_id = u
             and (s is null or l.session_id = s))
            or (l.scope = 'session' and l.user_id || chr(31) || l.session_id = any (sessions))
            or (l.scope = 'run' and l.user_id || chr(31) || l.session_id || chr(31)
                                    || l.project_id || chr(31) || l.run_id = any (runs)));

    delete from harbor.session_state x
     where x.tenant_id = t
       and ((u is not null and p is null and x.user_id = u and (s is null or x.session_id = s))
            or x.user_id || chr(31) || x.session_id = any (sessions));

    -- (role bindings and access tokens: none, checked above)
    tier := 'role_bindings'; deleted := 0; return next;
end
$$;
alter function harbor.erase_delegated(text, text, text, text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.erase_delegated(text, text, text, text, text, text, text, text,
                                              text) from public;
-- (as harbor.erase: the elevated role erases, a harbor_app caller only what its policies
-- let it delete)
grant execute on function harbor.erase_delegated(text, text, text, text, text, text, text,
                                                 text, text) to harbor_app, harbor_admin;
