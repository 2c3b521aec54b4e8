-- The Citus form of the superseded_by foreign key's ON DELETE SET NULL (sql/schema.sql),
-- applied by `harbor-pg distribute` and after every `harbor-pg migrate` of a distributed
-- database (harbor_pg.db.citus). Citus refuses ON DELETE SET NULL on a key that holds the
-- distribution column, so distribute drops the action; without it, deleting a memory that
-- a surviving version links to (harbor.erase of an agent's newer fact, a user deleting
-- their own) fails the foreign key. This trigger does what the action did, on the
-- deleted row's shard: it clears superseded_by in the rows of the same tenant that link
-- to the deleted row (tenant-qualified, so the update stays on that shard; a statement
-- over every shard is refused inside a shard's trigger).
--
-- As the referential action, it runs as the table's owner and sees every row of the
-- tenant: security definer, owned by harbor_owner, which reads and updates memories
-- through the two policies below, only inside a trigger (pg_trigger_depth() > 0) and
-- only to clear a link. So the add-only guard (guards.sql) tells it apart as it tells
-- the referential action apart: current_user is the table's owner, which no caller is;
-- and reopens a listed row only for an unbound administrator's harbor.erase, as on one
-- server.
--
-- Nothing a caller holds lets it run the function elsewhere: EXECUTE is revoked from
-- everyone (grants.sql grants every harbor function; this file runs after it), so no
-- caller can attach it to a table of its own (CREATE TRIGGER checks EXECUTE; a temporary
-- table is any login's), and the function refuses to act for any trigger but an AFTER
-- DELETE row trigger of a table harbor_owner owns in schema harbor (harbor.memories, or
-- one of its shards).
--
-- AFTER, not BEFORE: erase deletes a whole chain in one statement, and a BEFORE trigger
-- that updated a row the same statement deletes next would make that delete fail. The
-- name sorts before the foreign key's own triggers ("RI_ConstraintTrigger_..."; triggers
-- of one event fire in name order, uppercase before lowercase), so the links are cleared
-- before the key checks that no row still references the deleted one.
create or replace function harbor._memories_successor_set_null() returns trigger
    language plpgsql security definer
    set search_path to pg_catalog, pg_temp
as $$
begin
    if tg_when <> 'AFTER' or tg_op <> 'DELETE' or tg_level <> 'ROW'
       or tg_table_schema <> 'harbor'
       or not exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_roles r
                                on r.oid = c.relowner
                       where c.oid = tg_relid and r.rolname = current_user) then
        raise exception 'harbor._memories_successor_set_null() is the superseded_by foreign '
                        'key''s action on harbor.memories'
            using errcode = '42501';
    end if;
    update harbor.memories m set superseded_by = null
     where m.tenant_id operator(pg_catalog.=) old.tenant_id
       and m.superseded_by operator(pg_catalog.=) old.id;
    return null;
end
$$;

-- (owned as the table: `harbor-pg migrate` runs as harbor_owner and re-applies this file;
-- distribute runs it as a superuser)
alter function harbor._memories_successor_set_null() owner to harbor_owner;
revoke all on function harbor._memories_successor_set_null()
    from public, harbor_app, harbor_admin, harbor_search;

-- harbor_owner reads and updates memories only inside a trigger, and an update of its
-- may only leave a row without a successor (row security is forced on the owner too)
drop policy if exists memories_owner_set_null_read on harbor.memories;
create policy memories_owner_set_null_read on harbor.memories for select to harbor_owner
    using (pg_catalog.pg_trigger_depth() > 0);
drop policy if exists memories_owner_set_null on harbor.memories;
create policy memories_owner_set_null on harbor.memories for update to harbor_owner
    using (pg_catalog.pg_trigger_depth() > 0)
    with check (superseded_by is null);

create or replace trigger "FK_memories_superseded_by_set_null"
    after delete on harbor.memories
    for each row execute function harbor._memories_successor_set_null();
