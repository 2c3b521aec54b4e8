-- The Citus form of harbor.summary_due_rows (sql/functions/tiers.sql), applied by
-- `harbor-pg distribute` and after every `harbor-pg migrate` of a distributed database
-- (harbor_pg.db.citus), after the PL/pgSQL twins: the same rule, with the session's
-- turns counted in the statement itself, under the policies of the shard. Citus sends
-- the statement whole to the session's worker, where a function may not query a
-- distributed table ("cannot execute a distributed query from a query on a shard"), so
-- the single-server count, harbor._session_turns, is not called here.
create or replace function harbor.summary_due_rows(
    p_tenant text, p_user text, p_session text, p_min_turns bigint,
    p_cooldown_seconds double precision, p_unseen integer default 0
) returns table (due boolean)
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    return query
    select case
             when s.session_id is null then
               (select pg_catalog.count(*) operator(pg_catalog.+) p_unseen
                  from (select 1 from harbor.messages m
                         where m.tenant_id operator(pg_catalog.=) p_tenant
                           and m.user_id operator(pg_catalog.=) p_user
                           and m.session_id operator(pg_catalog.=) p_session
                         limit p_min_turns) first_turns) operator(pg_catalog.>=) p_min_turns
             when s.summary_lease_until operator(pg_catalog.>) pg_catalog.clock_timestamp()
                  or s.summarised_at operator(pg_catalog.>)
                     (pg_catalog.clock_timestamp()
                      operator(pg_catalog.-) pg_catalog.make_interval(secs => p_cooldown_seconds))
             then false
             else
               (select c.n operator(pg_catalog.>=) p_min_turns
                       and (c.n operator(pg_catalog.<) s.turns_at_summary
                            or (c.n operator(pg_catalog.-) s.turns_at_summary)
                               operator(pg_catalog.>=) p_min_turns)
                  from (select pg_catalog.count(*) operator(pg_catalog.+) p_unseen as n
                          from harbor.messages m
                         where m.tenant_id operator(pg_catalog.=) p_tenant
                           and m.user_id operator(pg_catalog.=) p_user
                           and m.session_id operator(pg_catalog.=) p_session) c)
           end
      from (select) one
      left join harbor.session_state s
        on s.tenant_id operator(pg_catalog.=) p_tenant
       and s.user_id operator(pg_catalog.=) p_user
       and s.session_id operator(pg_catalog.=) p_session;
end
$$;
