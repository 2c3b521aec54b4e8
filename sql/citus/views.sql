-- The Citus form of harbor.memory_history (sql/functions/views.sql), applied by
-- `harbor-pg distribute` and after every `harbor-pg migrate` of a distributed database
-- (harbor_pg.db.citus). Citus refuses the view's recursive CTE: "recursive CTEs are only
-- supported when they contain a filter on the distribution column", a literal one (a
-- function of the caller's identity is refused too, and so is a literal of two
-- tenants). So the chains are followed by one statement per tenant the reader may see
-- (its own, then GLOBAL's ''), each with that tenant as a literal (one shard each), in
-- a function the view reads (its CYCLE clause written out as a path: Citus's deparse of
-- CYCLE makes its column ambiguous on the worker); the same columns, the same rows: a supersession keeps its
-- tenant, so no chain crosses tenants. security invoker, as the view: the reader's
-- policies hold on every row.
create or replace function harbor._memory_history_citus()
    returns table (chain_id text, version integer, tenant_id text, id text,
                   scope harbor.memory_scope, project_id text, user_id text,
                   session_id text, run_id text, principal_id text,
                   memory_type harbor.memory_type, content text, context text,
                   importance real, sensitivity harbor.sensitivity, source text,
                   valid_from timestamptz, valid_to timestamptz, superseded_by text,
                   is_current boolean, created_at timestamptz)
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_tenant text;
begin
    foreach v_tenant in array array(select distinct t from unnest(
            array[coalesce(harbor.caller_tenant(), ''), '']) t) loop
        return query execute pg_catalog.format($q$
            with recursive chain (tenant_id, chain_id, id, version, path) as (
                select m.tenant_id, m.id, m.id, 1, array[m.id]
                  from harbor.memories m
                 where m.tenant_id = %1$L
                   and not exists (select 1 from harbor.memories p
                                    where p.tenant_id = %1$L and p.superseded_by = m.id)
                union all
                select n.tenant_id, c.chain_id, n.id, c.version + 1, c.path || n.id
                  from chain c
                  join harbor.memories prev on prev.tenant_id = %1$L and prev.id = c.id
                  join harbor.memories n on n.tenant_id = %1$L and n.id = prev.superseded_by
                 where not n.id = any (c.path)
            )
            select c.chain_id, c.version, m.tenant_id, m.id, m.scope, m.project_id, m.user_id,
                   m.session_id, m.run_id, m.principal_id, m.memory_type, m.content, m.context,
                   m.importance, m.sensitivity, m.source, lower(m.valid), upper(m.valid),
                   m.superseded_by, m.valid @> pg_catalog.now(), m.created_at
              from chain c
              join harbor.memories m on m.tenant_id = %1$L and m.id = c.id$q$, v_tenant);
    end loop;
end
$$;

-- (owned as the schema's other functions are: `harbor-pg migrate` runs as harbor_owner and
-- re-applies this file; distribute runs it as a superuser)
alter function harbor._memory_history_citus() owner to harbor_owner;

create or replace view harbor.memory_history with (security_invoker = true) as
select * from harbor._memory_history_citus();

grant select on harbor.memory_history to harbor_app, harbor_admin;
