-- name: recall
-- Ranked hybrid recall for the caller (identity already set): harbor.recall() with every signal.
-- snapshot.sql repeats this call on purpose, so that a snapshot is one statement;
-- tests/unit/test_sql_twins.py holds the two equal.
select r.*
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

-- name: profile
-- The caller's profile (identity already set): harbor.profile(), stable section first.
select p.*
  from harbor.profile(
      scopes => %(scopes)s::text[]::harbor.memory_scope[],
      token_budget => %(token_budget)s::integer,
      stable_after => %(stable_after)s::interval,
      as_of => %(as_of)s::timestamptz,
      max_sensitivity => %(max_sensitivity)s::harbor.sensitivity) p

-- name: consolidate
-- Merge the caller's near-duplicate memories (identity already set):
-- harbor.consolidate_memories(), one row a merge.
select c.*
  from harbor.consolidate_memories(
      scopes => %(scopes)s::text[]::harbor.memory_scope[],
      min_similarity => %(min_similarity)s::double precision,
      model_id => %(model_id)s::text,
      max_merges => %(max_merges)s::integer,
      dry_run => %(dry_run)s::boolean,
      since => %(since)s::timestamptz,
      merged => %(merged)s::jsonb) c

-- name: record_hits
-- Count a recall's hits (after it returned): harbor.record_hits().
select harbor.record_hits(%(ids)s::text[]) as counted

-- name: record_hits_delegated
-- record_hits on a distributed database: one call of harbor.record_hits_delegated
-- (sql/citus/hits.sql), which Citus sends whole to the tenant's worker. The identity is its
-- first arguments (the worker checks them against the caller's); sent in autocommit, the
-- call is its own transaction. How many of the caller's tenant's memories it counted, and
-- the ids it did not count when GLOBAL memories may exist (for record_hits, above).
select h.counted, h.uncounted
  from harbor.record_hits_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(ids)s::text[]) h
