-- Maintenance and governance: purge, retention, erasure. Run as harbor_admin
-- (the elevated role); the policies confine them to the caller's tenant.

-- Reclaim the space of expired working state (already invisible to readers).
create or replace function harbor.purge_working_state() returns bigint
    language sql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
    with d as (
        delete from harbor.working_state w
         where w.expires_at is not null and w.expires_at <= pg_catalog.now()
        returning 1)
    select count(*) from d
$$;

-- Close the validity interval of the caller's expired memories: each current memory
-- whose expiry (expires_at) has passed and that the caller may update ends at its
-- expiry, as a superseded row ends at its successor. Row-level security decides
-- which: the application role its own owner keys, the elevated role its tenant's
-- and, with no identity set (the periodic upkeep job), every tenant's expired rows
-- (memories_admin_expire). Nothing is deleted; reads hide an expired memory before
-- this runs too, so the sweep keeps history exact and takes the row out of the
-- dedup index. Returns how many it closed. Run by harbor.apply_retention() and the
-- periodic upkeep; memories_expiring_idx holds its candidates.
create or replace function harbor.expire_memories() returns bigint
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    t text := harbor.caller_tenant();
    n bigint;
begin
    -- (an expiry at or before the start: the start alone, never empty. No arithmetic on
    -- the timestamps: Citus refuses a STABLE function of a column in an UPDATE)
    update harbor.memories m
       set valid = case when m.expires_at > lower(m.valid)
                        then tstzrange(lower(m.valid), m.expires_at, '[)')
                        else tstzrange(lower(m.valid), lower(m.valid), '[]') end
     where (t is null or m.tenant_id = t)
       and m.expires_at is not null and m.expires_at <= pg_catalog.now()
       and upper_inf(m.valid);
    get diagnostics n = row_count;
    return n;
end
$$;

-- Retention for the caller's tenant, one entry point: always reclaims the
-- tenant's expired working state (already invisible to readers, and the lock rows of
-- the runs left with none) and, when
-- max_age is given, removes long-term memories older than it, for one scope
-- and/or at or above one sensitivity (both optional). Rolling summaries are
-- kept unless include_summaries. Embeddings go with their memories (ON DELETE
-- CASCADE). It also closes the tenant's expired memories (harbor.expire_memories():
-- closed, not deleted). Returns the three counts.
do $$
begin
    -- earlier versions returned only the memory count, then two counts: a new result
    -- type needs DROP (CREATE OR REPLACE cannot change it)
    if exists (select 1 from pg_catalog.pg_proc p
                where p.oid = pg_catalog.to_regprocedure('harbor.apply_retention(interval, '
                          'harbor.memory_scope, harbor.sensitivity, boolean)')
                  and pg_catalog.pg_get_function_result(p.oid) not like '%expired bigint%') then
        drop function harbor.apply_retention(interval, harbor.memory_scope, harbor.sensitivity,
                                             boolean);
    end if;
end
$$;

create or replace function harbor.apply_retention(
    max_age interval default null,
    only_scope harbor.memory_scope default null,
    min_sensitivity harbor.sensitivity default null,
    include_summaries boolean default false,
    out working_state bigint,
    out memories bigint,
    out expired bigint
) returns record
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    t text := harbor.caller_tenant();
begin
    if t is null then
        raise exception 'harbor.apply_retention: no identity set (harbor.set_identity)'
            using errcode = '42501';
    end if;
    if max_age is null and (only_scope is not null or min_sensitivity is not null) then
        raise exception 'harbor.apply_retention: a scope or sensitivity needs max_age'
            using errcode = '22023';
    end if;
    if max_age < interval '0' then
        raise exception 'harbor.apply_retention: max_age must not be negative'
            using errcode = '22023';
    end if;

    delete from harbor.working_state w
     where w.tenant_id = t
       and w.expires_at is not null and w.expires_at <= pg_catalog.now();
    get diagnostics working_state = row_count;
    -- and the serialisation locks of the tenant's runs that have no working state left
    -- (migration 0017; a write locking one now waits, then inserts it again)
    if pg_catalog.to_regclass('harbor.owner_locks') is not null then
        delete from harbor.owner_locks l
         where l.tenant_id = t and l.scope = 'run'
           and not exists (select 1 from harbor.working_state w
                            where w.tenant_id = l.tenant_id and w.user_id = l.user_id
                              and w.session_id = l.session_id and w.run_id = l.run_id
                              and w.project_id = l.project_id);
    end if;

    memories := 0;
    if max_age is not null then
        delete from harbor.memories m
         where m.tenant_id = t
           and m.created_at < pg_catalog.now() - max_age
           and (only_scope is null or m.scope = only_scope)
           and (min_sensitivity is null or m.sensitivity >= min_sensitivity)
           and (include_summaries or m.memory_type <> 'summary');
        get diagnostics memories = row_count;
    end if;
    expired := 0;
    if exists (select 1 from pg_catalog.pg_attribute
                where attrelid = 'harbor.memories'::pg_catalog.regclass
                  and attname = 'expires_at' and not attisdropped) then
        expired := harbor.expire_memories();
    end if;
end
$$;

-- Right to erasure: delete, in the caller's transaction, every row of the
-- caller's tenant that belongs to a user (all their sessions), to one session
-- of a user, or to an agent (the principal that wrote it), and every memory
-- derived from them in any scope, GLOBAL included. Returns one row per tier
-- with counts; no copy of the erased text is written anywhere.
--
-- Provenance decides, not scope:
-- * a user's rows are those keyed to them (user_id) and those they wrote as the
--   principal in any scope (a PROJECT memory stores user_id = '' and the author
--   in principal_id); a session's are those of the session;
-- * a memory derived from the erased conversations goes too, whoever wrote it
--   and in whatever scope: its source (source_tenant_id, source_user_id,
--   source_session_id) is the erased user's (session), or it names an erased
--   turn (source_message_ids). The source is qualified by its user, so erasing
--   one user's session `s1` never takes what another user's `s1` produced;
-- * a rolling summary of a session that lost turns is deleted, and that
--   session's summary bookkeeping with it, so the next summary is folded from
--   the turns that remain (a summary's source_message_ids lists only its last
--   fold, so the ids cannot tell which turns it holds);
-- * a memory whose successor is erased gets the chain back: it is linked to the
--   nearest successor that stays, or, when the erased successor was the current
--   version, reopened (current again), unless its content is current again
--   under the same owner already;
-- * erasing a user (not one session) removes the role bindings naming them;
-- * the serialisation locks (harbor.owner_locks) of the erased sessions and runs go (and
--   the user's own row when the user is erased).
-- * a turn being appended for the user when the erasure starts, in any session, is
--   committed first and erased (the user's lock row, taken first), with its jobs.
-- * a queued job already running for the subject writes nothing after the erasure
--   commits: the erasure takes the subject's session locks first, and a job's write
--   transaction takes its session's lock and then finds its turn gone.
-- * the jobs queued for the erased user, session or agent (harbor_jobs) go: pending,
--   finished and failed alike.
-- Embeddings go with their memories (counted, then ON DELETE CASCADE).
-- harbor.erase's DELETEs (messages, working_state, ...) each repeat the
-- erased owner's predicate on purpose: one statement a
-- table, each with its own RETURNING of what the next step needs.
create or replace function harbor.erase(
    user_id text default null,
    session_id text default null,
    principal_id text default null,
    out tier text, out deleted bigint
) returns setof record
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    t text := harbor.caller_tenant();
    u text := erase.user_id;
    s text := erase.session_id;
    p text := erase.principal_id;
    turn_ids text[];
    -- the (user, session) of every session that lost turns, as user || chr(31) || session
    -- (ids hold no control characters: set_identity refuses them)
    sessions text[];
    -- the (user, session, project, run) of every run that lost working state, joined by chr(31)
    runs text[];
    gone_local text[];   -- ids of the tenant's memories to delete
    gone_global text[];  -- ids of GLOBAL memories (tenant '') to delete
    -- the surviving predecessors of erased memories (parallel arrays)
    chain_tenant text[];
    chain_id text[];
    chain_successor text[];
    chain_reopen boolean[];
    -- the erased memories' links and whether each is current, and the
    -- surviving predecessors of erased memories (parallel arrays)
    gone_tenant text[];
    gone_id text[];
    gone_successor text[];
    gone_current boolean[];
    start_tenant text[];
    start_id text[];
    start_successor text[];
    n bigint;
begin
    if t is null then
        raise exception 'harbor.erase: no identity set (harbor.set_identity)' using errcode = '42501';
    end if;
    if u is null and p is null then
        raise exception 'harbor.erase: name a user_id or a principal_id' using errcode = '22023';
    end if;
    -- before anything else, the erased user's own lock row (scope 'user', migration 0027),
    -- which every append of the user locks to its commit: this waits for the
    -- appends in flight, in any session, a new one too (their turns and jobs are then
    -- found below), and an append that starts later waits for this erasure to commit.
    if u is not null and exists (
            select 1 from pg_catalog.pg_constraint c
             where c.conrelid = pg_catalog.to_regclass('harbor.owner_locks')
               and c.conname = 'owner_locks_check1') then
        insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
        values (t, u, '', 'user')
        on conflict on constraint owner_locks_pkey
        do update set scope = excluded.scope where false;
    end if;
    -- before anything is deleted, the lock of every session of the subject (the row of
    -- harbor.owner_locks an append takes, migration 0017), held to the end: a queued
    -- job takes it too in its write transaction and then looks for its turn
    -- (harbor.require_turn). A job that writes before this waits here, and its rows are
    -- found below; one that writes after finds its turn gone and writes nothing. In
    -- the order of the keys, so that two erasures wait for each other, never deadlock.
    if pg_catalog.to_regclass('harbor.owner_locks') is not null then
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
    end if;
    -- the turns first: their ids and sessions find what was derived from them
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
        -- keyed to the subject, or written by it
        select m.tenant_id, m.id from harbor.memories m
         where m.tenant_id = t
           and (u is null or m.user_id = u or m.principal_id = u)
           and (s is null or m.session_id = s
                or (m.source_session_id = s and (u is null or m.source_user_id = u)))
           and (p is null or m.principal_id = p)
        union
        -- derived from the subject's conversations, in any scope
        select m.tenant_id, m.id from harbor.memories m
         where m.tenant_id = any (array['', t])
           and m.source_tenant_id = t
           and u is not null and m.source_user_id = u
           and m.source_session_id is not null
           and (s is null or m.source_session_id = s)
           and (p is null or m.principal_id = p)
        union
        -- derived from an erased turn (message ids are the tenant's)
        select m.tenant_id, m.id from harbor.memories m
         where m.tenant_id = any (array['', t])
           and (m.tenant_id = t or m.source_tenant_id = t)
           and m.source_message_ids operator(pg_catalog.&&) turn_ids
        union
        -- the rolling summary of a session that lost turns
        select m.tenant_id, m.id from harbor.memories m
         where m.tenant_id = t and m.scope = 'session' and m.memory_type = 'summary'
           and m.user_id || chr(31) || m.session_id = any (sessions))
    select coalesce(array_agg(d.id) filter (where d.tenant_id = t), '{}'),
           coalesce(array_agg(d.id) filter (where d.tenant_id = ''), '{}')
      into gone_local, gone_global from doomed d;

    select count(*) into n from harbor.memory_embeddings x
     where (x.tenant_id = t and x.memory_id = any (gone_local))
        or (x.tenant_id = '' and x.memory_id = any (gone_global));
    tier := 'embeddings'; deleted := n; return next;

    -- the chains through an erased memory: each surviving predecessor, the nearest
    -- surviving successor after it (if any), and whether the chain ended at an
    -- erased current version. The erased memories and the predecessors are read
    -- by id (no join, no recursion over the table: on Citus a recursive CTE must
    -- name one tenant, and here there can be two); the walk then runs over them.
    select coalesce(array_agg(m.tenant_id), '{}'), coalesce(array_agg(m.id), '{}'),
           coalesce(array_agg(m.superseded_by), '{}'), coalesce(array_agg(upper_inf(m.valid)), '{}')
      into gone_tenant, gone_id, gone_successor, gone_current
      from harbor.memories m
     where (m.tenant_id = t and m.id = any (gone_local))
        or (m.tenant_id = '' and m.id = any (gone_global));
    select coalesce(array_agg(m.tenant_id), '{}'), coalesce(array_agg(m.id), '{}'),
           coalesce(array_agg(m.superseded_by), '{}')
      into start_tenant, start_id, start_successor
      from harbor.memories m
     where (m.tenant_id = t and m.superseded_by = any (gone_local)
            and not m.id = any (gone_local))
        or (m.tenant_id = '' and m.superseded_by = any (gone_global)
            and not m.id = any (gone_global));
    with recursive gone as (
        select * from unnest(gone_tenant, gone_id, gone_successor, gone_current)
                      g(tenant_id, id, superseded_by, is_current)
    ), walk(tenant_id, pred, succ) as (
        select * from unnest(start_tenant, start_id, start_successor)
        union
        select w.tenant_id, w.pred, x.superseded_by
          from walk w join gone x on x.tenant_id = w.tenant_id and x.id = w.succ
         where x.superseded_by is not null),
    chain as (
        -- (a successor not among the erased one survives: the nearest surviving one)
        select w.tenant_id, w.pred,
               max(w.succ) filter (where x.id is null) as successor,
               coalesce(bool_or(x.is_current), false) as reopen
          from walk w left join gone x on x.tenant_id = w.tenant_id and x.id = w.succ
         group by w.tenant_id, w.pred)
    select coalesce(array_agg(c.tenant_id), '{}'), coalesce(array_agg(c.pred), '{}'),
           coalesce(array_agg(c.successor), '{}'), coalesce(array_agg(c.reopen), '{}')
      into chain_tenant, chain_id, chain_successor, chain_reopen from chain c;

    -- the predecessors to reopen: their chain ended at an erased current version, and their
    -- content is not current under the same owner in a row that stays. The add-only guard
    -- (guards.sql) reopens them when the foreign key clears their link to the erased row,
    -- and only then: a row listed here whose successor is not deleted stays closed.
    perform pg_catalog.set_config('harbor.erase_reopen', coalesce((
        select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(m.tenant_id, m.id))
          from unnest(chain_tenant, chain_id, chain_successor, chain_reopen)
               as c(tenant_id, id, successor, reopen)
          join harbor.memories m on m.tenant_id = c.tenant_id and m.id = c.id
         where c.successor is null and c.reopen and not upper_inf(m.valid)
           and not exists (
               select 1 from harbor.memories d
                where d.tenant_id = m.tenant_id and d.scope = m.scope
                  and d.project_id = m.project_id and d.user_id = m.user_id
                  and d.session_id = m.session_id and d.run_id = m.run_id
                  and d.content_hash = m.content_hash and d.id <> m.id
                  and not d.id = any (case when d.tenant_id = '' then gone_global
                                           else gone_local end)
                  and d.valid && tstzrange(lower(m.valid), null, '[)')))::text, ''), true);

    -- successors of an erased memory lose their link (ON DELETE SET NULL; on Citus the
    -- trigger of sql/citus/successor.sql), and the listed predecessors are reopened then
    delete from harbor.memories m
     where (m.tenant_id = t and m.id = any (gone_local))
        or (m.tenant_id = '' and m.id = any (gone_global));
    get diagnostics n = row_count;
    tier := 'long_term'; deleted := n; return next;
    perform pg_catalog.set_config('harbor.erase_reopen', '', true);

    update harbor.memories m set superseded_by = c.successor
      from unnest(chain_tenant, chain_id, chain_successor, chain_reopen)
           as c(tenant_id, id, successor, reopen)
     where m.tenant_id = c.tenant_id and m.id = c.id and c.successor is not null;

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

    -- the serialisation locks (migration 0017: ids only, but they name the owner) of the
    -- erased user's sessions and runs, of the sessions that lost turns, and of the runs
    -- that lost working state
    if pg_catalog.to_regclass('harbor.owner_locks') is not null then
        delete from harbor.owner_locks l
         where l.tenant_id = t
           and ((u is not null and p is null and l.user_id = u
                 and (s is null or l.session_id = s))
                or (l.scope = 'session' and l.user_id || chr(31) || l.session_id = any (sessions))
                or (l.scope = 'run' and l.user_id || chr(31) || l.session_id || chr(31)
                                        || l.project_id || chr(31) || l.run_id = any (runs)));
    end if;

    -- summary bookkeeping of the erased sessions and of those that lost turns (no text,
    -- but it names them; and a deleted summary must be folded again from the start)
    delete from harbor.session_state x
     where x.tenant_id = t
       and ((u is not null and p is null and x.user_id = u and (s is null or x.session_id = s))
            or x.user_id || chr(31) || x.session_id = any (sessions));

    -- the database roles bound to the erased user
    n := 0;
    if u is not null and s is null and p is null then
        delete from harbor.role_bindings b where b.tenant_id = t and b.user_id = u;
        get diagnostics n = row_count;
    end if;
    tier := 'role_bindings'; deleted := n; return next;

    -- the access tokens that stand for the erased user (they name them; table of 0014)
    if u is not null and s is null and p is null
       and pg_catalog.to_regclass('harbor.access_tokens') is not null then
        execute 'delete from harbor.access_tokens k where k.tenant_id = $1'
                ' and (k.user_id = $2 or (k.user_id is null and k.principal_id = $2))'
            using t, u;
    end if;

    -- the erased subject's jobs on the queue (migration 0020; their arguments name the
    -- owner): pending ones never run, and no finished or failed one keeps their ids.
    -- Deleted in this transaction, so a job is gone exactly when the rows it would read
    -- are; a job a worker is running meanwhile finds its turns gone and writes nothing.
    if pg_catalog.to_regclass('harbor_jobs.procrastinate_jobs') is not null then
        execute 'delete from harbor_jobs.procrastinate_jobs j'
                ' where j.args operator(pg_catalog.->>) ''tenant_id'' = $1'
                '   and ($2 is null or j.args operator(pg_catalog.->>) ''user_id'' = $2'
                '        or j.args operator(pg_catalog.->>) ''principal_id'' = $2)'
                '   and ($3 is null or j.args operator(pg_catalog.->>) ''session_id'' = $3)'
                '   and ($4 is null or j.args operator(pg_catalog.->>) ''principal_id'' = $4)'
            using t, u, s, p;
    end if;

    return;
end
$$;
