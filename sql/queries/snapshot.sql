-- name: snapshot
-- Recent turns, working state and matching memories of the caller in one statement.
select
  (select coalesce(jsonb_agg(jsonb_build_object(
              'id', r.id, 'role', r.role, 'content', r.content, 'name', r.name,
              'tool_calls', r.tool_calls, 'tool_call_id', r.tool_call_id,
              'metadata', r.metadata, 'created_at', r.created_at) order by r.id), '[]'::jsonb)
     from (select * from harbor.messages m
            where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
              and m.session_id = %(session_id)s::text
            order by m.id desc limit %(recent_limit)s::integer) r) as recent,
  (select w.state from harbor.working_state w
    where %(run_id)s::text <> ''
      and w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
      and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
      and w.project_id = %(project_id)s::text
    order by w.id desc limit 1) as working,
  (select coalesce(jsonb_agg(to_jsonb(s) order by s.rank desc, s.importance desc), '[]'::jsonb)
     from (select m.id, m.tenant_id, m.scope, m.project_id, m.principal_id, m.user_id,
                  m.session_id, m.run_id, m.memory_type, m.content, m.content_hash,
                  m.importance, m.entity_ids, m.source, m.sensitivity,
                  lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
                  m.source_session_id, m.source_message_ids, m.metadata, m.context,
                  m.created_at, m.updated_at,
                  pg_catalog.ts_rank_cd(m.fts, q.tsq) as rank
             from harbor.memories m, (select harbor.or_tsquery(%(query)s::text) as tsq) q
            where %(query)s::text <> ''
              and m.tenant_id = any (array['', %(tenant_id)s::text])
              and m.valid @> pg_catalog.now() and m.memory_type <> 'summary'
              and (m.fts @@ q.tsq or pg_catalog.strpos(pg_catalog.lower(m.content),
                                                       pg_catalog.lower(%(query)s::text)) > 0)
            order by rank desc, m.importance desc
            limit %(top_k)s::integer) s) as memories
