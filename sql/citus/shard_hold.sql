-- The delegated calls' hold on their tenant's shard (sql/citus/append.sql, recall.sql,
-- save.sql). Citus sends a delegated call to the node that holds the tenant's shard when
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
grant execute on function harbor._hold_tenant_shard(regclass, text) to harbor_app, harbor_search;
