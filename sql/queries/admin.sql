-- name: server_versions
-- PostgreSQL and pgvector versions of the connected database.
select current_setting('server_version') as server_version,
       (select extversion from pg_extension where extname = 'vector') as vector_version

-- name: tier_totals
-- Row counts per tier across every tenant (needs a login that bypasses RLS).
select (select count(*) from harbor.messages) as short_term,
       (select count(*) from harbor.working_state) as working,
       (select count(*) from harbor.memories) as long_term,
       (select count(*) from harbor.memories where upper_inf(valid)) as current_memories,
       (select count(*) from harbor.memory_embeddings) as embeddings
