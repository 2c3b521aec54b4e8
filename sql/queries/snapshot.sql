-- name: snapshot
-- Recent turns, working state and recalled memories (harbor.recall) of the caller in one statement.
-- Its harbor.recall(...) call is the one in recall.sql, repeated so that the snapshot is
-- one statement: change the two together (tests/unit/test_sql_twins.py checks it).
select
  (select coalesce(jsonb_agg(jsonb_build_object(
              'id', r.id, 'role', r.role, 'content', r.content, 'name', r.name,
              'tool_calls', r.tool_calls, 'tool_call_id', r.tool_call_id,
              'metadata', r.metadata, 'created_at', r.created_at) order by r.id), '[]'::jsonb)
     from (select x.* from (
             -- the session TTL of inactivity, as in recent_live_turns
             select n.*, bool_or(n.gap_after) over (order by n.id desc rows between
                                                    unbounded preceding and current row) as expired
               from (select m.*,
                            coalesce(lag(m.created_at) over (order by m.id desc), pg_catalog.now())
                                - m.created_at
                                > make_interval(secs => %(ttl_seconds)s::double precision)
                                as gap_after
                       from (select * from harbor.messages m
                              where m.tenant_id = %(tenant_id)s::text
                                and m.user_id = %(user_id)s::text
                                and m.session_id = %(session_id)s::text
                              order by m.id desc limit %(recent_limit)s::integer) m) n) x
            where %(ttl_seconds)s::double precision is null or not x.expired) r) as recent,
  (select w.state from harbor.working_state w
    where %(run_id)s::text <> ''
      and w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
      and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
      and w.project_id = %(project_id)s::text
    order by w.id desc limit 1) as working,
  (select coalesce(jsonb_agg(to_jsonb(r) order by r.rank), '[]'::jsonb)
     from harbor.recall(
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
    where %(recall)s::boolean) as memories
