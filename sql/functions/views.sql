-- Views for what people query with plain SQL. Re-runnable: dropped and created.
-- security_invoker: each reader sees only the rows the policies show them (a view
-- without it would read harbor.memories with its owner's rights).

-- The memories valid now: superseded and expired versions left out. Rolling
-- summaries are included (memory_type = 'summary').
-- (an expired memory whose interval is still open too: the expiry column comes with
-- revision 0024, and this file also runs on the revisions before it)
drop view if exists harbor.current_memories;
do $$
begin
    execute 'create view harbor.current_memories with (security_invoker = true) as
select m.tenant_id, m.id, m.scope, m.project_id, m.user_id, m.session_id, m.run_id,
       m.principal_id, m.memory_type, m.content, m.context, m.importance, m.sensitivity,
       m.entity_ids, m.source, lower(m.valid) as valid_from, m.source_session_id,
       m.metadata, m.created_at
  from harbor.memories m
 where m.valid @> pg_catalog.now()'
        || case when exists (select 1 from pg_catalog.pg_attribute
                              where attrelid = 'harbor.memories'::pg_catalog.regclass
                                and attname = 'expires_at' and not attisdropped)
                then '
   and not coalesce(m.expires_at <= pg_catalog.now(), false)'
                else '' end;
end
$$;

-- Every version of every memory, by supersession chain: chain_id is the id of the
-- chain's first version and version counts from 1, so
--   select version, content, valid_from, valid_to from harbor.memory_history
--    where chain_id in (select chain_id from harbor.memory_history where id = '...')
--    order by chain_id, version
-- is one memory's history. A chain is followed through the versions the reader may
-- see (a supersession keeps scope and owner, so that is the whole chain). A
-- consolidation's successor (harbor.consolidate_memories) ends the chain of every
-- memory it merged, so it stands in several chains.
drop view if exists harbor.memory_history;
create view harbor.memory_history with (security_invoker = true) as
with recursive chain (tenant_id, chain_id, id, version) as (
    select m.tenant_id, m.id, m.id, 1
      from harbor.memories m
     where not exists (select 1 from harbor.memories p
                        where p.tenant_id = m.tenant_id and p.superseded_by = m.id)
    union all
    select n.tenant_id, c.chain_id, n.id, c.version + 1
      from chain c
      join harbor.memories prev on prev.tenant_id = c.tenant_id and prev.id = c.id
      join harbor.memories n on n.tenant_id = prev.tenant_id and n.id = prev.superseded_by
) cycle id set in_cycle using path
select c.chain_id, c.version, m.tenant_id, m.id, m.scope, m.project_id, m.user_id,
       m.session_id, m.run_id, m.principal_id, m.memory_type, m.content, m.context,
       m.importance, m.sensitivity, m.source, lower(m.valid) as valid_from,
       upper(m.valid) as valid_to, m.superseded_by, m.valid @> pg_catalog.now() as is_current,
       m.created_at
  from chain c
  join harbor.memories m on m.tenant_id = c.tenant_id and m.id = c.id
 where not c.in_cycle;

grant select on harbor.current_memories, harbor.memory_history to harbor_app, harbor_admin;
