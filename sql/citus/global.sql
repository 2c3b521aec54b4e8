-- Whether GLOBAL memories (tenant '', scope global) may exist, on a distributed database.
--
-- A search reads every caller's own memories and the global ones, which hash to another
-- shard than most tenants' (sql/citus/search.sql). Reading them costs a second command,
-- on a second connection to a second worker, on every search, even where no global memory
-- was ever written. So one flag says whether any may exist: harbor.global_memory_flag, a
-- reference table (a copy on every node), which a delegated search reads on the tenant's
-- worker; only when it is set does the facade read the global memories too. The flag is
-- conservative: set before a global memory is written (by the writer, in the writing
-- transaction: harbor_pg.tiers.long_term, the elevated role's save), and never unset by
-- harbor-pg (an operator who deleted every global memory may unset it, as a superuser).
--
-- Applied by `harbor-pg distribute` (a superuser) and after every `harbor-pg migrate` of a
-- distributed database (harbor_owner), as the other files of sql/citus.
create table if not exists harbor.global_memory_flag (
    singleton boolean primary key default true check (singleton),
    may_exist boolean not null
);
alter table harbor.global_memory_flag owner to harbor_owner;
do $$
begin
    if not exists (select 1 from pg_catalog.pg_dist_partition p
                    where p.logicalrelid = 'harbor.global_memory_flag'::pg_catalog.regclass) then
        perform create_reference_table('harbor.global_memory_flag');
    end if;
end
$$;

-- Every role reads it (a GLOBAL memory is every caller's to read, so whether one may exist
-- is no secret); the elevated role, which alone writes GLOBAL memories, may set it and
-- never unset it; the table's owner initialises it (below).
alter table harbor.global_memory_flag enable row level security;
revoke all on harbor.global_memory_flag from public;
grant select on harbor.global_memory_flag to harbor_app, harbor_admin, harbor_search;
grant update (may_exist) on harbor.global_memory_flag to harbor_admin;
drop policy if exists global_memory_flag_read on harbor.global_memory_flag;
create policy global_memory_flag_read on harbor.global_memory_flag for select
    to harbor_app, harbor_admin, harbor_search
    using (true);
drop policy if exists global_memory_flag_set on harbor.global_memory_flag;
create policy global_memory_flag_set on harbor.global_memory_flag for update to harbor_admin
    using (true)
    with check (may_exist);

-- Initialised from the memories stored: made now (a database distributed before the flag
-- existed), it says whether a global memory is there; already there, it is set if one is
-- (a global memory written past it: never by harbor-pg, whose writes set it first and whose
-- trigger below refuses one written without it). harbor_owner runs this file on `harbor-pg
-- migrate`, and row security is forced on it: it reads the global memories (every
-- caller's to read) through the policy below.
drop policy if exists memories_owner_global_read on harbor.memories;
create policy memories_owner_global_read on harbor.memories for select to harbor_owner
    using (tenant_id = '' and scope = 'global');
do $$
declare
    v_stored boolean := exists (select 1 from harbor.memories m
                                 where m.tenant_id = '' and m.scope = 'global');
begin
    if not exists (select 1 from harbor.global_memory_flag) then
        insert into harbor.global_memory_flag (may_exist) values (v_stored);
    elsif v_stored and not (select f.may_exist from harbor.global_memory_flag f) then
        update harbor.global_memory_flag set may_exist = true;
    end if;
end
$$;

-- harbor._global_memories_may_exist(): the flag, read from this node's own placement of
-- the reference table (one shard, placed on every node under the same name): on a
-- worker, inside a delegated call or a shard's trigger, the distributed table is not
-- what PostgreSQL reads. True when the table holds no row (unknown: they may). A string
-- body, written with the placement's name: Citus forwards it to the workers as it is.
do $$
declare
    v_placement text := (
        select pg_catalog.shard_name(s.logicalrelid, s.shardid)
          from pg_catalog.pg_dist_shard s
         where s.logicalrelid = 'harbor.global_memory_flag'::pg_catalog.regclass);
begin
    execute pg_catalog.format($f$
        create or replace function harbor._global_memories_may_exist() returns boolean
            language sql stable security invoker parallel safe
            set search_path to pg_catalog, pg_temp
        as $body$
        select coalesce((select f.may_exist from %s f), true)
        $body$ $f$, v_placement);
end
$$;
alter function harbor._global_memories_may_exist() owner to harbor_owner;
revoke all on function harbor._global_memories_may_exist() from public;
grant execute on function harbor._global_memories_may_exist()
    to harbor_app, harbor_admin, harbor_search;

-- The safety net: a global memory inserted while the flag is unset is refused, on the
-- shard that would hold it, so a write path that forgot to set the flag fails loudly
-- instead of leaving searches that do not see its memory. AFTER INSERT, for the rows of
-- tenant '' alone (the WHEN condition, tested as the row is queued: no other row costs
-- more than that test): a row the policies refuse never reaches it.
create or replace function harbor._global_memory_written() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if not harbor._global_memories_may_exist() then
        raise exception 'a GLOBAL memory was written while harbor.global_memory_flag says '
                        'none may exist'
            using errcode = '55000',
                  hint = 'set it first, in the same transaction: update '
                         'harbor.global_memory_flag set may_exist = true where not may_exist';
    end if;
    return null;
end
$$;
alter function harbor._global_memory_written() owner to harbor_owner;
revoke all on function harbor._global_memory_written() from public;
grant execute on function harbor._global_memory_written()
    to harbor_app, harbor_admin, harbor_search;

create or replace trigger memories_global_flag_check
    after insert on harbor.memories
    for each row when (new.tenant_id = '')
    execute function harbor._global_memory_written();
