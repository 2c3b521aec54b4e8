-- Changes to memories are announced, in the transaction that makes them.
--
-- A statement that writes, supersedes or erases memories notifies, once, on the
-- channel of each tenant it touched (harbor.change_channel): a JSON payload
-- {"kind": ..., "ids": [...]} with ids and a kind only, never content or owner:
--   written     a memory inserted, or a rolling summary folded again (its content);
--   superseded  a memory's validity changed: closed by its successor or by expiry,
--               or reopened when an erasure took its successor;
--   erased      a memory deleted.
-- Other updates (importance decay, recall counts) are not announced. The notification
-- is delivered when the transaction commits, and not at all when it rolls back.
-- PostgreSQL lets any login LISTEN on any channel: a channel tells its listeners the
-- ids, kinds and timing of the tenant's changes, nothing more (docs/security.md).
-- MemoryManager.watch() reads each id back under row-level security before handing it
-- on.
--
-- Statement-level triggers with transition tables: one call a statement, whatever its
-- row count (a save_many of 256 memories sends one notification of 256 ids), in chunks
-- of at most 100 ids (a payload stays under PostgreSQL's 8,000 bytes).

-- The channel of a tenant's changes: a fixed prefix and 32 hex digits of the tenant
-- id's SHA-256 (a channel name is an identifier: at most 63 bytes, whatever the id).
-- GLOBAL memories (tenant '') have the channel of ''.
create or replace function harbor.change_channel(tenant_id text) returns text
    language sql immutable parallel safe
return 'harbor_changes_' operator(pg_catalog.||) pg_catalog.left(pg_catalog.encode(
    pg_catalog.sha256(pg_catalog.convert_to(tenant_id, 'UTF8')), 'hex'), 32);

-- One statement for each kind of statement (a transition table exists only for the
-- statements that have it), alike on purpose: the changed rows, numbered in chunks
-- of 100 by tenant (and kind), one notification a chunk.
create or replace function harbor._announce_memory_changes() returns trigger
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if tg_op = 'INSERT' then
        perform pg_notify(harbor.change_channel(c.tenant_id),
                          json_build_object('kind', 'written', 'ids', c.ids)::text)
           from (select x.tenant_id, array_agg(x.id order by x.id) as ids
                   from (select n.tenant_id, n.id,
                                (row_number() over (partition by n.tenant_id order by n.id)
                                 - 1) / 100 as chunk
                           from new_rows n) x
                  group by x.tenant_id, x.chunk) c;
    elsif tg_op = 'UPDATE' then
        perform pg_notify(harbor.change_channel(c.tenant_id),
                          json_build_object('kind', c.kind, 'ids', c.ids)::text)
           from (select x.tenant_id, x.kind, array_agg(x.id order by x.id) as ids
                   from (select n.tenant_id, n.id, k.kind,
                                (row_number() over (partition by n.tenant_id, k.kind
                                                    order by n.id) - 1) / 100 as chunk
                           from new_rows n
                           join old_rows o on o.tenant_id = n.tenant_id and o.id = n.id
                          cross join lateral (
                              select case when n.content is distinct from o.content
                                          then 'written' else 'superseded' end as kind) k
                          where n.content is distinct from o.content
                             or n.valid is distinct from o.valid
                             or n.superseded_by is distinct from o.superseded_by) x
                  group by x.tenant_id, x.kind, x.chunk) c;
    else
        perform pg_notify(harbor.change_channel(c.tenant_id),
                          json_build_object('kind', 'erased', 'ids', c.ids)::text)
           from (select x.tenant_id, array_agg(x.id order by x.id) as ids
                   from (select o.tenant_id, o.id,
                                (row_number() over (partition by o.tenant_id order by o.id)
                                 - 1) / 100 as chunk
                           from old_rows o) x
                  group by x.tenant_id, x.chunk) c;
    end if;
    return null;
end
$$;

-- Not on a distributed table (Citus): a shard's trigger would notify on its worker,
-- and a transaction that touched several shards (two-phase commit) cannot notify at
-- all. harbor_pg.db.citus.distribute drops these triggers (query drop_change_triggers),
-- and they are not made again here on a distributed table (docs/citus.md).
do $announce$
declare
    distributed boolean := false;
begin
    if exists (select 1 from pg_catalog.pg_extension where extname = 'citus') then
        execute 'select exists (select 1 from pg_catalog.pg_dist_partition'
                ' where logicalrelid = ''harbor.memories''::pg_catalog.regclass)'
           into distributed;
    end if;
    if distributed then
        return;
    end if;
    create or replace trigger memories_announce_insert
        after insert on harbor.memories
        referencing new table as new_rows
        for each statement execute function harbor._announce_memory_changes();
    create or replace trigger memories_announce_update
        after update on harbor.memories
        referencing old table as old_rows new table as new_rows
        for each statement execute function harbor._announce_memory_changes();
    create or replace trigger memories_announce_delete
        after delete on harbor.memories
        referencing old table as old_rows
        for each statement execute function harbor._announce_memory_changes();
end
$announce$;
