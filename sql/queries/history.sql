-- name: memory_history
-- A memory's supersession chain, oldest first: the rows it replaced (superseded_by links
-- back to it), itself, and the rows that replaced it, as far as the caller may see them.
-- %(tenants)s: the tenants whose rows it reads, the caller's and '' (the global memories);
-- on Citus one at a time, since it plans the recursive CTEs only with one value of the
-- distribution column (a chain never leaves its tenant: superseded_by names a memory of
-- the same one).
with recursive back (id, depth) as (
    select m.id, 0
      from harbor.memories m
     where m.tenant_id = any (%(tenants)s::text[]) and m.id = %(id)s::text
    union
    select p.id, b.depth - 1
      from back b
      join harbor.memories p
        on p.tenant_id = any (%(tenants)s::text[]) and p.superseded_by = b.id
     where b.depth > -1000
), ahead (id, next_id, depth) as (
    select m.id, m.superseded_by, 0
      from harbor.memories m
     where m.tenant_id = any (%(tenants)s::text[]) and m.id = %(id)s::text
    union
    select n.id, n.superseded_by, a.depth + 1
      from ahead a
      join harbor.memories n
        on n.tenant_id = any (%(tenants)s::text[]) and n.id = a.next_id
     where a.depth < 1000
), chain (id, depth) as (
    select id, depth from back
    union
    select id, depth from ahead
)
-- The memory column list of get_memory (long_term.sql), repeated on purpose: each
-- statement stands alone, and memory_from_row reads the columns by name.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from (select id, min(depth) as depth from chain group by id) c
  join harbor.memories m
    on m.tenant_id = any (%(tenants)s::text[]) and m.id = c.id
 order by c.depth, lower(m.valid), m.id
