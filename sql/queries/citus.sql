-- The bound roles that can SET ROLE to another role holding harbor-pg rights: a
-- harbor-pg role, or any member of one (another bound role, an unbound login granted
-- harbor_app), directly or through a role granted to them with SET. Citus opens its
-- worker connections as the current user: after SET ROLE harbor_app such a role reaches
-- the workers as harbor_app, where its binding is not seen and the SET LOCAL identity it
-- sends holds. harbor-pg distribute refuses to run while one exists; on a distributed
-- database the bindings' trigger refuses to bind one, by the same test
-- (harbor_pg.db.citus, _REWRITES).
-- name: citus_unsafe_bindings
select b.tenant_id, b.role_name, array_agg(x.rolname::text order by x.rolname) as can_set
  from harbor.role_bindings b
  join pg_catalog.pg_roles r on r.rolname = b.role_name
  join pg_catalog.pg_roles x on x.oid <> r.oid and pg_catalog.pg_has_role(r.oid, x.oid, 'SET')
 where exists (select 1 from pg_catalog.pg_roles h
                where h.rolname in ('harbor_owner', 'harbor_app', 'harbor_admin', 'harbor_search')
                  and pg_catalog.pg_has_role(x.oid, h.oid, 'MEMBER'))
 group by b.tenant_id, b.role_name
 order by b.tenant_id, b.role_name

-- name: drop_change_triggers
-- The triggers that announce changes to memories (sql/functions/changes.sql), dropped
-- before the table is distributed: a notification cannot come from a shard. And the one
-- that forgets a session's last summarised turn when its turns are deleted
-- (sql/functions/tiers.sql): a shard's trigger cannot write another distributed table.
drop trigger if exists memories_announce_insert on harbor.memories;
drop trigger if exists memories_announce_update on harbor.memories;
drop trigger if exists memories_announce_delete on harbor.memories;
drop trigger if exists messages_forget_summary_frontier on harbor.messages

-- The Citus form of a memory's save (long_term.sql's insert_memory and get_memory),
-- used on a distributed database (Database.set_local). One statement with a writing CTE
-- is planned there in steps: the CTE runs first, its result is copied to the workers, the
-- INSERT is pulled through the coordinator, and the transaction, having reached more than
-- one node, commits in two phases. The same parts as statements of their own, sent in one
-- round trip and one transaction, each carry the tenant and go whole to the tenant's
-- worker: one worker, one-phase commit. They run in the order of the single statement's
-- parts.

-- name: append_turn_delegated
-- A turn's append (short_term.sql's append_message and, with %(min_turns)s not null,
-- append_message_check_summary) on a distributed database: one call of
-- harbor.append_turn (sql/citus/append.sql), which Citus sends whole to the tenant's
-- worker. The identity is its arguments (the worker checks them against the caller's);
-- sent in autocommit, it needs no transaction block.
select t.id, t.created_at, t.summary_due
  from harbor.append_turn(%(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text,
                          %(user_id)s::text, %(session_id)s::text, %(run_id)s::text,
                          %(role)s::harbor.message_role, %(content)s::text, %(name)s::text,
                          %(tool_calls)s::jsonb, %(tool_call_id)s::text, %(metadata)s::jsonb,
                          %(token_estimate)s::integer, %(min_turns)s::bigint,
                          %(cooldown_seconds)s::double precision) t

-- name: queue_turn_jobs_citus
-- append_message_with_jobs (short_term.sql) on a distributed database, its second half: the
-- jobs of the turn that append_turn_delegated (above) has just stored in the same
-- transaction block, queued on the coordinator (the queue's tables are its own) by
-- harbor_jobs.queue_turn_jobs, from the turn's id and whether its session is now due a
-- summary, as the call returned them. The call went whole to the tenant's worker
-- (force_delegation, harbor_pg.db.citus) and ran append_turn there, the turn's id drawn
-- above the session's last, as for every append; this statement and the COMMIT follow in
-- a second round trip, so the worker sees BEGIN, the call and COMMIT, and commits in one
-- phase with the jobs. queue_turn_jobs reads the identity on the coordinator: it is set
-- there before this statement by set_identity, whose set_config Citus does not forward.
select harbor_jobs.queue_turn_jobs(%(turn_id)s::bigint, %(extract)s::boolean,
                                   %(fold)s::boolean and coalesce(%(summary_due)s::boolean,
                                                                  false),
                                   %(slots)s::integer) as job_ids

-- name: close_expired_duplicate_citus
-- insert_memory's expired CTE as a statement: a current duplicate past its expiry,
-- closed at its expiry, when insert_memory_citus found the memory's place taken (then
-- the memory is inserted again).
update harbor.memories d
   set valid = case when d.expires_at > pg_catalog.lower(d.valid)
                    then pg_catalog.tstzrange(pg_catalog.lower(d.valid), d.expires_at, '[)')
                    else pg_catalog.tstzrange(pg_catalog.lower(d.valid),
                                              pg_catalog.lower(d.valid), '[]') end
 where d.tenant_id = %(tenant_id)s::text
   and d.expires_at is not null and d.expires_at <= pg_catalog.now()
   and pg_catalog.upper_inf(d.valid)
   and d.user_id = %(user_id)s::text and d.project_id = %(project_id)s::text
   and d.session_id = %(session_id)s::text and d.run_id = %(run_id)s::text
   and d.content_hash = %(content_hash)s::text and d.scope = %(scope)s::harbor.memory_scope

-- name: global_memories_noted
-- Whether the flag that global memories may exist is set (harbor.global_memory_flag,
-- sql/citus/global.sql; a reference table, read from the coordinator's copy).
select coalesce((select f.may_exist from harbor.global_memory_flag f), false) as may_exist

-- name: note_global_memories
-- The flag set, before a global memory is written in the same transaction (the elevated
-- role may set it, never unset it): a delegated search then reads the global memories too.
update harbor.global_memory_flag set may_exist = true where not may_exist

-- name: insert_memory_citus
-- insert_memory without its CTE; nothing when a currently valid duplicate exists (or one
-- past its expiry not closed yet: close_expired_duplicate_citus, then again).
insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                             principal_id, memory_type, importance, content, content_hash,
                             context, entity_ids, source, sensitivity, source_session_id,
                             source_message_ids, metadata, valid, expires_at)
values (%(tenant_id)s::text, coalesce(%(id)s::text, (pg_catalog.gen_random_uuid())::text),
        %(scope)s::harbor.memory_scope, %(project_id)s::text, %(user_id)s::text,
        %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
        %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
        %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
        %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
        %(source_message_ids)s::text[], %(metadata)s::jsonb,
        tstzrange(coalesce(%(valid_from)s::timestamptz, pg_catalog.now()), null, '[)'),
        %(expires_at)s::timestamptz)
on conflict do nothing
returning id

-- name: get_memory_citus
-- get_memory for a memory whose tenant is known (the one just saved: '' for a GLOBAL
-- one): one shard, where get_memory's two tenants ('' and the caller's) are two.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.id = %(id)s::text

-- name: get_memories_delegated
-- get_memories (long_term.sql) on a distributed database, the caller's tenant's memories:
-- one call of harbor.get_memories_delegated (sql/citus/get.sql), which Citus sends whole
-- to the tenant's worker. The identity is its first arguments (the worker checks them
-- against the caller's); sent in autocommit, it needs no transaction block. A last row,
-- every column null, says that global memories may exist (read them: below).
select g.*
  from harbor.get_memories_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(ids)s::text[]) g

-- name: get_global_memories
-- get_memories (long_term.sql) on a distributed database, the global memories (tenant '',
-- scope global, which every caller may read: no identity needed): one statement Citus
-- routes to their shard's node, in autocommit (its fast path: one table, the distribution
-- column equal to a constant). After get_memories_delegated (above), only when its answer
-- says that global memories may exist.
-- get_memory's column list, repeated on purpose (see there).
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from harbor.memories m
 where m.tenant_id = '' and m.scope = 'global' and m.id = any (%(ids)s::text[])

-- name: current_memories_delegated
-- extraction_current_memories (extraction.sql) on a distributed database: one call of
-- harbor.current_memories_delegated (sql/citus/current.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, it needs no transaction block.
select c.*
  from harbor.current_memories_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(user_user_id)s::text,
      %(session_user_id)s::text, %(session_session_id)s::text,
      %(project_project_id)s::text, %(limit)s::integer) c

-- name: profile_delegated
-- profile (recall.sql) on a distributed database: one call of harbor.profile_delegated
-- (sql/citus/profile.sql), which Citus sends whole to the tenant's worker. The identity is
-- its first arguments (the worker checks them against the caller's); sent in autocommit,
-- it needs no transaction block.
select p.*
  from harbor.profile_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text,
      scopes => %(scopes)s::text[]::harbor.memory_scope[],
      token_budget => %(token_budget)s::integer,
      stable_after => %(stable_after)s::interval,
      as_of => %(as_of)s::timestamptz,
      max_sensitivity => %(max_sensitivity)s::harbor.sensitivity) p

-- name: delete_memory_delegated
-- delete_memory (long_term.sql) on a distributed database: one call of
-- harbor.delete_memory_delegated (sql/citus/delete.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select d.id
  from harbor.delete_memory_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(id)s::text) d

-- name: clear_session_delegated
-- clear_messages (short_term.sql) on a distributed database: one call of
-- harbor.clear_session_delegated (sql/citus/clear.sql), which Citus sends whole to the
-- tenant's worker. The identity is its arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction. How many turns it deleted.
select harbor.clear_session_delegated(
           %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text,
           %(user_id)s::text, %(session_id)s::text, %(run_id)s::text) as deleted

-- name: clear_working_delegated
-- clear_working (working.sql) on a distributed database: one call of
-- harbor.clear_working_delegated (sql/citus/clear.sql), which Citus sends whole to the
-- tenant's worker. The identity is its arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction. How many versions of the
-- run's state it deleted.
select harbor.clear_working_delegated(
           %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text,
           %(user_id)s::text, %(session_id)s::text, %(run_id)s::text) as deleted

-- name: save_summary_delegated
-- A session summary's write (job_write_lock and job_turn_present with a turn id,
-- context_refresh_summary, context_insert_summary when %(create)s, the row read back) on a
-- distributed database: one call of harbor.save_summary_delegated
-- (sql/citus/summary_write.sql), which Citus sends whole to the tenant's worker. The
-- identity is its first arguments (the worker checks them against the caller's); sent in
-- autocommit, the call is its own transaction. The row written, none when another writer
-- got there first.
select s.*
  from harbor.save_summary_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(id)s::text, %(importance)s::real,
      %(content)s::text, %(content_hash)s::text, %(source_message_ids)s::text[],
      %(metadata)s::jsonb, %(expected_frontier)s::text, %(create)s::boolean,
      %(turn_id)s::bigint) s

-- name: consolidate_delegated
-- consolidate (recall.sql) on a distributed database: one call of
-- harbor.consolidate_delegated (sql/citus/consolidate.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select c.*
  from harbor.consolidate_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text,
      scopes => %(scopes)s::text[]::harbor.memory_scope[],
      min_similarity => %(min_similarity)s::double precision,
      model_id => %(model_id)s::text,
      max_merges => %(max_merges)s::integer,
      dry_run => %(dry_run)s::boolean,
      since => %(since)s::timestamptz,
      merged => %(merged)s::jsonb) c

-- name: memory_history_delegated
-- memory_history (history.sql) on a distributed database, the caller's tenant's chain: one
-- call of harbor.memory_history_delegated (sql/citus/history.sql), which Citus sends whole
-- to the tenant's worker. The identity is its first arguments (the worker checks them
-- against the caller's); sent in autocommit, it needs no transaction block.
select h.*
  from harbor.memory_history_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(id)s::text) h

-- name: summary_lease_acquire_delegated
-- context_acquire_summary_lease (context.sql) on a distributed database: one call of
-- harbor.summary_lease_acquire_delegated (sql/citus/lease.sql), which Citus sends whole to
-- the tenant's worker. The identity is its first arguments (the worker checks them against
-- the caller's); sent in autocommit, the call is its own transaction.
select l.summary_lease_until, l.turns_at_summary, l.turns
  from harbor.summary_lease_acquire_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(min_turns)s::bigint,
      %(cooldown_seconds)s::double precision, %(lease_seconds)s::double precision) l

-- name: summary_lease_end_delegated
-- context_finish_summary_lease (%(turns_at_summary)s given) or
-- context_release_summary_lease (null) (context.sql) on a distributed database: one call of
-- harbor.summary_lease_end_delegated (sql/citus/lease.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select l.session_id
  from harbor.summary_lease_end_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(lease_until)s::timestamptz,
      %(turns_at_summary)s::bigint) l

-- name: recent_turns_delegated
-- recent_turns (short_term.sql), and recent_live_turns with %(ttl_seconds)s not null, on a
-- distributed database: one call of harbor.recent_turns_delegated (sql/citus/recent.sql),
-- which Citus sends whole to the tenant's worker. The identity is its first arguments (the
-- worker checks them against the caller's); sent in autocommit, it needs no transaction
-- block.
select r.id, r.role, r.content, r.name, r.tool_calls, r.tool_call_id, r.metadata, r.created_at
  from harbor.recent_turns_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(limit)s::integer,
      %(ttl_seconds)s::double precision) r

-- name: working_state_delegated
-- scratch (working.sql) on a distributed database: one call of
-- harbor.working_state_delegated (sql/citus/working.sql), which Citus sends whole to the
-- tenant's worker. The identity is its arguments (the worker checks them against the
-- caller's); sent in autocommit, it needs no transaction block.
select w.state, w.expires_at
  from harbor.working_state_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text) w

-- name: session_summary_delegated
-- context_load_summary (context.sql) on a distributed database: one call of
-- harbor.session_summary_delegated (sql/citus/summary.sql), which Citus sends whole to the
-- tenant's worker. The identity is its arguments (the worker checks them against the
-- caller's); sent in autocommit, it needs no transaction block.
select s.*
  from harbor.session_summary_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text) s

-- name: working_update_delegated
-- lock_run and update_working (working.sql) on a distributed database: one call of
-- harbor.working_update_delegated (sql/citus/working.sql), which Citus sends whole to the
-- tenant's worker. The identity is its arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select w.state, w.expires_at
  from harbor.working_update_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(state)s::jsonb,
      %(ttl_seconds)s::double precision) w

-- name: search_delegated
-- search_memories on a distributed database, the tenant's memories: one call of
-- harbor.search_delegated (sql/citus/search.sql), which Citus sends whole to the tenant's
-- worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, it needs no transaction block. A last row whose id is
-- null says that global memories may exist: then search_global too; the facade merges the
-- two by rank, importance, the newest, the id.
select s.*
  from harbor.search_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text,
      %(query)s::text, %(as_of)s::timestamptz, %(limit)s::integer) s

-- name: search_global
-- search_memories on a distributed database, the global memories (tenant '', scope
-- global, which every caller may read: no identity needed): one statement Citus routes to
-- their shard's node, in autocommit. With search_delegated (above). One table, the
-- distribution column equal to a constant, no subquery: Citus's fast path, which keeps
-- the plan of a prepared statement (with the query's tsquery in a subquery, each call was
-- planned in full, about 1 ms).
-- get_memory's column list, repeated on purpose (see there), and the rank.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at,
       pg_catalog.ts_rank_cd(m.fts, harbor.or_tsquery(%(query)s::text)) as rank
  from harbor.memories m
 where m.tenant_id = ''
   and m.scope = 'global'
   and m.valid @> coalesce(%(as_of)s::timestamptz, pg_catalog.now())
   and not coalesce(m.expires_at <= coalesce(%(as_of)s::timestamptz, pg_catalog.now()), false)
   and m.memory_type <> 'summary'
   and (m.fts @@ harbor.or_tsquery(%(query)s::text)
        or pg_catalog.strpos(pg_catalog.lower(m.content), pg_catalog.lower(%(query)s::text)) > 0)
 order by rank desc, m.importance desc, lower(m.valid) desc, m.id collate "C"
 limit %(limit)s::integer

-- name: recall_delegated
-- recall.sql's recall on a distributed database: one call of harbor.recall_delegated
-- (sql/citus/recall.sql), which Citus sends whole to the tenant's worker. The identity is
-- its first arguments (the worker checks them against the caller's); sent in autocommit,
-- it needs no transaction block.
select r.*
  from harbor.recall_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text,
      %(query)s::text,
      query_embedding => %(embedding)s::public.vector,
      model_id => %(model_id)s::text,
      scopes => %(scopes)s::text[]::harbor.memory_scope[],
      top_k => %(top_k)s::integer,
      anchor_entity_ids => %(anchors)s::text[],
      wanted_types => %(wanted)s::text[]::harbor.memory_type[],
      as_of => %(as_of)s::timestamptz,
      recency_half_life_hours => %(half_life)s::double precision,
      entity_weight => %(entity_weight)s::double precision,
      type_weight => %(type_weight)s::double precision,
      rrf_k => %(rrf_k)s::integer,
      min_similarity => %(min_similarity)s::double precision,
      token_budget => %(token_budget)s::integer,
      candidates => %(candidates)s::integer,
      dense_weight => %(dense_weight)s::double precision,
      lexical_weight => %(lexical_weight)s::double precision,
      fusion => %(fusion)s::text,
      max_sensitivity => %(max_sensitivity)s::harbor.sensitivity,
      neighbour_weight => %(neighbour_weight)s::double precision,
      date_weight => %(date_weight)s::double precision,
      importance_half_life_hours => %(importance_half_life)s::double precision,
      excluded_types => %(excluded)s::text[]::harbor.memory_type[]) r

-- name: save_memories_delegated
-- A batch's save on a distributed database (save_memories' arrays, without the tenants:
-- every memory is the caller's tenant's): one call of harbor.save_memories_delegated
-- (sql/citus/save.sql), which Citus sends whole to the tenant's worker. The caller's
-- identity is its first arguments; sent in autocommit, the batch is the call's one
-- transaction. One row per memory, in input order.
select s.*
  from harbor.save_memories_delegated(
      %(caller_tenant_id)s::text, %(caller_project_id)s::text, %(caller_principal_id)s::text,
      %(caller_user_id)s::text, %(caller_session_id)s::text, %(caller_run_id)s::text,
      %(ids)s::text[], %(scopes)s::harbor.memory_scope[], %(project_ids)s::text[],
      %(user_ids)s::text[], %(session_ids)s::text[], %(run_ids)s::text[],
      %(principal_ids)s::text[], %(memory_types)s::harbor.memory_type[],
      %(importances)s::real[], %(contents)s::text[], %(content_hashes)s::text[],
      %(contexts)s::text[], %(entity_ids)s::jsonb[], %(sources)s::text[],
      %(sensitivities)s::harbor.sensitivity[], %(source_session_ids)s::text[],
      %(source_message_ids)s::jsonb[], %(metadata)s::jsonb[], %(valid_froms)s::timestamptz[],
      %(expires_ats)s::timestamptz[], %(model_id)s::text, %(embeddings)s::public.vector[],
      %(context_embeddings)s::public.vector[]) s

-- name: save_tenant_memories_delegated
-- The elevated role's save of TENANT memories (one, or a batch) on a distributed database,
-- with save_memories_delegated's arguments: one call of
-- harbor.save_tenant_memories_delegated (sql/citus/save.sql), which Citus sends whole to
-- the tenant's worker; sent in autocommit, the batch is the call's one transaction. One
-- row per memory, in input order.
select s.*
  from harbor.save_tenant_memories_delegated(
      %(caller_tenant_id)s::text, %(caller_project_id)s::text, %(caller_principal_id)s::text,
      %(caller_user_id)s::text, %(caller_session_id)s::text, %(caller_run_id)s::text,
      %(ids)s::text[], %(scopes)s::harbor.memory_scope[], %(project_ids)s::text[],
      %(user_ids)s::text[], %(session_ids)s::text[], %(run_ids)s::text[],
      %(principal_ids)s::text[], %(memory_types)s::harbor.memory_type[],
      %(importances)s::real[], %(contents)s::text[], %(content_hashes)s::text[],
      %(contexts)s::text[], %(entity_ids)s::jsonb[], %(sources)s::text[],
      %(sensitivities)s::harbor.sensitivity[], %(source_session_ids)s::text[],
      %(source_message_ids)s::jsonb[], %(metadata)s::jsonb[], %(valid_froms)s::timestamptz[],
      %(expires_ats)s::timestamptz[], %(model_id)s::text, %(embeddings)s::public.vector[],
      %(context_embeddings)s::public.vector[]) s

-- name: save_memory_delegated
-- One memory's save on a distributed database (insert_memory_citus and the statements
-- around it): one call of harbor.save_memory_delegated (sql/citus/save.sql), which Citus
-- sends whole to the tenant's worker. The caller's identity is its first arguments (the
-- worker checks them against the caller's), then the memory's owner key and fields, then
-- its vectors; sent in autocommit, it needs no transaction block.
select s.*
  from harbor.save_memory_delegated(
      %(caller_tenant_id)s::text, %(caller_project_id)s::text, %(caller_principal_id)s::text,
      %(caller_user_id)s::text, %(caller_session_id)s::text, %(caller_run_id)s::text,
      %(id)s::text, %(scope)s::harbor.memory_scope, %(project_id)s::text,
      %(user_id)s::text, %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
      %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
      %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
      %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
      %(source_message_ids)s::text[], %(metadata)s::jsonb, %(valid_from)s::timestamptz,
      %(expires_at)s::timestamptz, %(model_id)s::text, %(embedding)s::public.vector,
      %(context_embedding)s::public.vector) s

-- name: summary_due_delegated
-- summary_due (short_term.sql) on a distributed database: one call of
-- harbor.summary_due_delegated (sql/citus/lease.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select harbor.summary_due_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(min_turns)s::bigint,
      %(cooldown_seconds)s::double precision) as due

-- name: close_memory_delegated
-- close_memory (extraction.sql) on a distributed database: one call of
-- harbor.close_memory_delegated (sql/citus/close.sql), which Citus sends whole to the
-- tenant's worker, for the scope and owner key (key_*) given. The identity is its first
-- arguments (the worker checks them against the caller's); sent in autocommit, the call is
-- its own transaction.
select c.id
  from harbor.close_memory_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(scope)s::harbor.memory_scope,
      %(key_project_id)s::text, %(key_user_id)s::text, %(key_session_id)s::text,
      %(key_run_id)s::text, %(id)s::text) c

-- name: messages_after_delegated
-- messages_after (short_term.sql) on a distributed database: one call of
-- harbor.messages_after_delegated (sql/citus/turns.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select t.id, t.role, t.content, t.name, t.tool_calls, t.tool_call_id, t.metadata, t.created_at
  from harbor.messages_after_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(after_id)s::bigint, %(before_id)s::bigint,
      %(limit)s::integer) t

-- name: turns_through_delegated
-- turns_through (short_term.sql) on a distributed database: one call of
-- harbor.turns_through_delegated (sql/citus/turns.sql), which Citus sends whole to the
-- tenant's worker. The identity is its first arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction.
select t.id, t.role, t.content, t.name, t.tool_calls, t.tool_call_id, t.metadata, t.created_at
  from harbor.turns_through_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(message_id)s::bigint, %(limit)s::integer) t

-- name: expire_memories_delegated
-- expire_memories (long_term.sql) on a distributed database: one call of
-- harbor.expire_memories_delegated (sql/citus/expire.sql), which Citus sends whole to the
-- tenant's worker. The identity is its arguments (the worker checks them against the
-- caller's); sent in autocommit, the call is its own transaction. How many of the caller's
-- expired memories it closed.
select harbor.expire_memories_delegated(
           %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text,
           %(user_id)s::text, %(session_id)s::text, %(run_id)s::text) as closed

-- name: add_fact_delegated
-- extraction_supersede_memory and extraction_insert_memory (extraction.sql), with the
-- guards sent before them (job_write_lock, job_turn_present, job_user_lock,
-- job_memories_present), on a distributed database: one call of
-- harbor.add_fact_delegated (sql/citus/fact.sql), which Citus sends whole to the tenant's
-- worker, for the scope and owner key (key_*) given. The identity is its first arguments
-- (the worker checks them against the caller's); sent in autocommit, the call is its own
-- transaction. One row: global_read (an observation read a memory not on the tenant's
-- shard: nothing written), then the gate's verdict, found and closed_id (with replaces),
-- the memory's columns and created (false: the current duplicate, read back).
select f.global_read, f.restatement_of, f.restatement_similarity,
       f.replaced_found as found, f.closed_id, f.id, f.tenant_id, f.scope, f.project_id,
       f.principal_id, f.user_id, f.session_id, f.run_id, f.memory_type, f.content,
       f.content_hash, f.importance, f.entity_ids, f.source, f.sensitivity, f.valid_from,
       f.invalid_at, f.superseded_by, f.source_session_id, f.source_message_ids, f.metadata,
       f.context, f.created_at, f.updated_at, f.expires_at, f.created
  from harbor.add_fact_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(scope)s::harbor.memory_scope,
      %(key_project_id)s::text, %(key_user_id)s::text, %(key_session_id)s::text,
      %(key_run_id)s::text, %(id)s::text, %(writer_id)s::text,
      %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
      %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
      %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
      %(source_message_ids)s::text[], %(metadata)s::jsonb, %(valid_from)s::timestamptz,
      %(model_id)s::text, %(dims)s::integer, %(embedding)s::public.vector,
      %(dedup_threshold)s::double precision, %(exclude_ids)s::text[], %(replaces)s::text,
      %(insert_if_gone)s::boolean, %(turn_id)s::bigint, %(read_ids)s::text[]) f
