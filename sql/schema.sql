-- harbor-pg canonical schema: what a fresh install looks like.
--
-- Run as harbor_owner after sql/roles.sql and after a superuser created the
-- extensions `vector` and `btree_gist` in schema public. Functions, views and
-- policies are re-runnable and live in sql/functions/ and sql/policies/; they
-- are applied after this file on every install and upgrade.
--
-- The migrations under migrations/versions/ repeat parts of this file on purpose
-- (e.g. 0014's access_tokens table): a revision is frozen once committed, this file is the fresh install, and
-- tests/migration/test_migrations.py holds the two to the same schema.
--
-- Conventions that make the schema Citus-ready (distribute every table by
-- tenant_id): every primary key, unique and exclusion constraint starts with
-- tenant_id, and foreign keys between tables include it. tests/integration
-- checks this from the catalog.
--
-- Owner columns are NOT NULL; '' means "not keyed by this row's scope". A row
-- of scope S stores exactly the owner fields S keys on (see harbor_pg/owner.py),
-- so equality on the full key is what visibility and dedup compare. GLOBAL rows
-- use the reserved tenant_id ''.

create schema harbor;

create type harbor.memory_scope as enum ('global', 'tenant', 'project', 'user', 'session', 'run');
-- ('observation': what several facts about one entity add up to, written by a model
-- from them; migration 0026)
create type harbor.memory_type as enum ('fact', 'preference', 'decision', 'episode', 'summary',
                                        'observation');
create type harbor.sensitivity as enum ('none', 'low', 'pii', 'sensitive');
create type harbor.message_role as enum ('system', 'user', 'assistant', 'tool');

-- Database roles bound to a fixed identity: for a bound role the binding wins
-- over anything the session sets (see harbor.bind_role).
create table harbor.role_bindings (
    tenant_id   text not null check (tenant_id <> ''),
    role_name   name not null,
    project_id  text check (project_id <> ''),
    user_id     text check (user_id <> ''),
    created_at  timestamptz not null default pg_catalog.now(),
    primary key (tenant_id, role_name)
);

-- Short-term tier: conversation turns, per (tenant, user, session).
create table harbor.messages (
    tenant_id      text not null check (tenant_id <> ''),
    id             bigint generated always as identity,
    user_id        text not null check (user_id <> ''),
    session_id     text not null check (session_id <> ''),
    project_id     text not null default '',
    principal_id   text not null default '',
    role           harbor.message_role not null,
    content        text not null,
    name           text,
    tool_calls     jsonb not null default '[]'::jsonb check (jsonb_typeof(tool_calls) = 'array'),
    tool_call_id   text,
    metadata       jsonb not null default '{}'::jsonb check (jsonb_typeof(metadata) = 'object'),
    token_estimate integer not null default 0 check (token_estimate >= 0),
    created_at     timestamptz not null default pg_catalog.clock_timestamp(),
    primary key (tenant_id, id)
);
-- hot path: the newest turns of one session
create index messages_session_recent_idx
    on harbor.messages (tenant_id, user_id, session_id, id desc);

-- Working tier: per-run scratch state with an expiry. An expired row is
-- invisible the moment it expires (the read policy compares expires_at with
-- now()); harbor.purge_working_state() reclaims the space. Each update writes
-- a new version holding the merged state and removes the older visible ones,
-- so an expired (hidden) version never blocks a write.
create table harbor.working_state (
    tenant_id    text not null check (tenant_id <> ''),
    id           bigint generated always as identity,
    project_id   text not null default '',
    user_id      text not null check (user_id <> ''),
    session_id   text not null check (session_id <> ''),
    run_id       text not null check (run_id <> ''),
    principal_id text not null default '',
    state        jsonb not null default '{}'::jsonb check (jsonb_typeof(state) = 'object'),
    expires_at   timestamptz,
    updated_at   timestamptz not null default pg_catalog.now(),
    primary key (tenant_id, id)
);
create index working_state_run_idx
    on harbor.working_state (tenant_id, user_id, session_id, run_id, project_id, id desc);
create index working_state_expires_idx on harbor.working_state (expires_at)
    where expires_at is not null;

-- Long-term tier: add-only memories with validity intervals.
create table harbor.memories (
    tenant_id          text not null,
    id                 text not null default (pg_catalog.gen_random_uuid())::text,
    scope              harbor.memory_scope not null,
    project_id         text not null default '',
    user_id            text not null default '',
    session_id         text not null default '',
    run_id             text not null default '',
    principal_id       text not null default '',
    memory_type        harbor.memory_type not null default 'fact',
    importance         real not null default 0.5 check (importance >= 0 and importance <= 1),
    content            text not null check (content <> ''),
    content_hash       text not null check (content_hash ~ '^[0-9a-f]{64}$'),
    context            text,
    entity_ids         text[] not null default '{}',
    source             text not null default 'unknown' check (
        source in ('user', 'assistant', 'tool', 'summary', 'injected', 'extracted',
                   'reflection', 'imported', 'unknown')
        or source ~ '^tool:[A-Za-z0-9_./-]{1,100}$'),
    sensitivity        harbor.sensitivity not null default 'none',
    valid              tstzrange not null default tstzrange(pg_catalog.now(), null, '[)')
                       check (not isempty(valid) and not lower_inf(valid)),
    superseded_by      text,
    source_session_id  text,
    source_message_ids text[] not null default '{}',
    metadata           jsonb not null default '{}'::jsonb check (jsonb_typeof(metadata) = 'object'),
    created_at         timestamptz not null default pg_catalog.now(),
    updated_at         timestamptz not null default pg_catalog.now(),
    fts                tsvector generated always as (
        to_tsvector('english'::regconfig, coalesce(context, '') || ' ' || content)) stored,
    -- whose conversation source_session_id / source_message_ids belong to (session ids
    -- repeat across users; a GLOBAL row has no tenant of its own): set on insert from the
    -- writer's identity by the memories_provenance trigger, NULL for a row naming no source
    source_tenant_id   text,
    source_user_id     text,
    -- the content_hash this row's context would have as content of its scope (null
    -- without a context): recall links a candidate to the one before it on it. Set
    -- by the memories_context_hash trigger from the row's own scope and context
    context_hash       text,
    -- when the memory stops holding (null: never). Reads treat a memory as valid
    -- only before it (valid @> t and not expires_at <= t); harbor.expire_memories()
    -- then closes its interval at that time, as a supersession would, so the row
    -- stays as history and leaves the dedup index (migration 0024)
    expires_at         timestamptz,
    primary key (tenant_id, id),
    -- a row stores exactly the owner fields its scope keys on: a tenant but for the
    -- global scope; a user for user, session and run; a session for session and run;
    -- a run for run; a project for project, and optionally for run (one test a field:
    -- each INSERT and UPDATE reads the constraint's expression afresh, and a CASE of
    -- every scope's five fields cost each statement about 20 us; migration 0030)
    constraint memories_scope_key check (
        (tenant_id = '') = (scope = 'global')
        and (user_id <> '') = (scope in ('user', 'session', 'run'))
        and (session_id <> '') = (scope in ('session', 'run'))
        and (run_id <> '') = (scope = 'run')
        and (project_id <> '' or scope <> 'project')
        and (project_id = '' or scope in ('project', 'run'))),
    constraint memories_superseded_by_fkey foreign key (tenant_id, superseded_by)
        references harbor.memories (tenant_id, id) on delete set null (superseded_by)
);
-- Dedup under concurrent writers: two currently valid rows with the same owner key
-- and content hash cannot coexist. A current row's interval is open (two open
-- intervals always overlap), so the rule is a unique key over the open rows;
-- supersession closes the old row in the transaction that inserts its successor,
-- which takes it out of the index. The scope last: the owner fields determine it
-- (memories_scope_key), and under row-level security its enum equality, not
-- leakproof, cannot be an index condition (migration 0021).
create unique index memories_no_duplicate_current
    on harbor.memories (tenant_id, user_id, project_id, session_id, run_id, content_hash, scope)
    where upper_inf(valid);
-- hot paths: a scope's current rows, validity lookups (no index on the entity ids
-- nor on the text vectors alone: nothing read them, migrations 0023 and 0028; the
-- lexical leg matches through the owner-term index below)
create index memories_owner_idx
    on harbor.memories (tenant_id, scope, user_id, project_id, session_id, run_id);
create index memories_current_idx
    on harbor.memories (tenant_id, user_id, scope) where upper_inf(valid);
-- The lexical leg reads every row of an owner (up to 2,000). A live service
-- writes many owners' rows in turn, so one owner's rows lie on as many heap
-- pages as it has rows; a B-tree keeps them side by side in key order. This
-- one carries what the leg reads (text vector, ranking columns), so an owner's
-- rows come from a few leaf pages without visiting the heap. A B-tree entry
-- holds at most 2,704 bytes: rows whose entry might not fit go to the second
-- index, and the leg reads both.
create function harbor.lexical_entry_fits(tenant_id text, project_id text, user_id text,
                                          session_id text, run_id text, id text,
                                          fts tsvector, entity_ids text[]) returns boolean
    language sql immutable parallel safe
-- an upper bound on the entry's size: a text vector is stored in at most its text
-- form plus 4 bytes a lexeme, a text array in at most its text form plus 8 bytes an
-- element; 256 bytes cover the headers, the fixed-size columns and the padding
return 256 + pg_catalog.octet_length(tenant_id) + pg_catalog.octet_length(project_id)
       + pg_catalog.octet_length(user_id) + pg_catalog.octet_length(session_id)
       + pg_catalog.octet_length(run_id) + pg_catalog.octet_length(id)
       + pg_catalog.octet_length(fts::text) + 4 * pg_catalog.length(fts)
       + pg_catalog.octet_length(entity_ids::text) + 8 * pg_catalog.cardinality(entity_ids)
       <= 2000;
create index memories_lexical_idx
    on harbor.memories (tenant_id, scope, user_id, project_id, session_id, run_id)
    include (id, fts, memory_type, importance, valid, content_hash, entity_ids, expires_at)
    where harbor.lexical_entry_fits(tenant_id, project_id, user_id, session_id, run_id, id,
                                    fts, entity_ids);
create index memories_lexical_rest_idx
    on harbor.memories (tenant_id, scope, user_id, project_id, session_id, run_id)
    where not harbor.lexical_entry_fits(tenant_id, project_id, user_id, session_id, run_id,
                                        id, fts, entity_ids);
-- The memories with an expiry still open: harbor.expire_memories() finds the
-- ones due here, and a save the expired duplicate it closes first (empty in a
-- store that never sets an expiry, so a probe costs one descent)
create index memories_expiring_idx on harbor.memories (tenant_id, expires_at)
    where expires_at is not null and upper_inf(valid);
-- The rows classified above 'none' under their owner keys: the lexical leg
-- looks up an owner's rows above recall's sensitivity ceiling here, since the
-- covering index above does not carry the sensitivity (migration 0015).
create index memories_sensitivity_idx
    on harbor.memories (tenant_id, scope, user_id, project_id, session_id, run_id, sensitivity)
    include (id)
    where sensitivity <> 'none';

-- Embeddings: one or two rows per (memory, model). The owner key is copied from the
-- memory so the candidate search can filter by visibility without a join; the
-- memory_embeddings_owner trigger (sql/functions/guards.sql) refuses copies that
-- differ from the memory's. A model change never mixes vector spaces because
-- every search names model_id.
create table harbor.memory_embeddings (
    tenant_id  text not null,
    memory_id  text not null,
    model_id   text not null check (model_id <> ''),
    dims       integer not null check (dims > 0 and dims <= 16000),
    embedding  public.vector not null,
    scope      harbor.memory_scope not null,
    project_id text not null default '',
    user_id    text not null default '',
    session_id text not null default '',
    run_id     text not null default '',
    created_at timestamptz not null default pg_catalog.now(),
    -- false: the vector of the content alone; true: of the context line, then
    -- the content (a memory saved with a context has both; recall takes the nearer)
    with_context boolean not null default false,
    -- in the HNSW graph (the partial indexes below): the rows of an owner key with
    -- at least harbor.graph_min_vectors() vectors. Recall scans a smaller owner's
    -- vectors exactly and never walks the graph for them, so a write to such an
    -- owner skips the graph insert (most of a write's cost). Set by the write
    -- (save_memories, insert_embedding) and harbor.promote_vector_owner().
    in_graph boolean not null default false,
    primary key (tenant_id, memory_id, model_id, with_context),
    constraint memory_embeddings_memory_fkey foreign key (tenant_id, memory_id)
        references harbor.memories (tenant_id, id) on delete cascade,
    constraint memory_embeddings_dims check (public.vector_dims(embedding) = dims)
);
-- (in_graph last: an owner key's rows outside the graph, or in it, in one descent)
create index memory_embeddings_owner_idx
    on harbor.memory_embeddings (tenant_id, model_id, scope, user_id, project_id, session_id, run_id,
                                 in_graph);
-- The exact dense scan reads all of an owner's vectors; as for the lexical leg,
-- a B-tree holding the vectors keeps one owner's side by side however the
-- writes interleave. It is keyed on one column, the owner fields encoded by
-- harbor.vector_owner_key(), so that the scan checks one key per entry instead
-- of seven (about 0.2 ms of a 1,000-vector owner's recall, docs/decisions.md);
-- the fields are carried too (an index-only scan must see the columns its
-- condition names). Only 384-dimension vectors (1,544 bytes) fit an entry, with
-- owner fields of at most 900 bytes counted twice (the key and the fields) plus
-- the memory id; the others go to the second index.
create function harbor.vector_owner_key(tenant_id text, model_id text, scope harbor.memory_scope,
                                        user_id text, project_id text, session_id text,
                                        run_id text) returns text
    language sql immutable parallel safe
-- each field prefixed by its length in bytes, so that different fields never
-- give the same key; the scope as one letter (an enum's text is not immutable:
-- a new scope needs a letter here, and a migration that rebuilds the indexes
-- on it, this one and memories_owner_terms_idx)
return pg_catalog.octet_length(tenant_id)::text || ':' || tenant_id
       || pg_catalog.octet_length(model_id)::text || ':' || model_id
       || case scope when 'global' then 'g' when 'tenant' then 't' when 'project' then 'p'
                     when 'user' then 'u' when 'session' then 's' when 'run' then 'r' end
       || pg_catalog.octet_length(user_id)::text || ':' || user_id
       || pg_catalog.octet_length(project_id)::text || ':' || project_id
       || pg_catalog.octet_length(session_id)::text || ':' || session_id
       || pg_catalog.octet_length(run_id)::text || ':' || run_id;
create function harbor.vector_owner_entry_fits(dims integer, tenant_id text, model_id text,
                                               project_id text, user_id text,
                                               session_id text, run_id text,
                                               memory_id text) returns boolean
    language sql immutable parallel safe
return dims = 384
       and 2 * (pg_catalog.octet_length(tenant_id) + pg_catalog.octet_length(model_id)
                + pg_catalog.octet_length(project_id) + pg_catalog.octet_length(user_id)
                + pg_catalog.octet_length(session_id) + pg_catalog.octet_length(run_id))
           + pg_catalog.octet_length(memory_id) <= 900;
create index memory_embeddings_owner_vectors_idx
    on harbor.memory_embeddings ((harbor.vector_owner_key(tenant_id, model_id, scope, user_id,
                                                          project_id, session_id, run_id))
                                 collate "C")
    include (tenant_id, model_id, scope, user_id, project_id, session_id, run_id, memory_id,
             with_context, embedding)
    where harbor.vector_owner_entry_fits(dims, tenant_id, model_id, project_id, user_id,
                                         session_id, run_id, memory_id);
create index memory_embeddings_owner_vectors_rest_idx
    on harbor.memory_embeddings (tenant_id, model_id, scope, user_id, project_id, session_id,
                                 run_id)
    where not harbor.vector_owner_entry_fits(dims, tenant_id, model_id, project_id, user_id,
                                             session_id, run_id, memory_id);
-- The owner-term index: every memory under one key per lexeme of its text,
-- '<owner hash>:<lexeme>', the hash being the first 8 hex digits of the md5 of
-- its owner key (harbor.vector_owner_key() above, with no model: the owner
-- fields, each prefixed by its length). The lexical leg looks up the query's
-- lexemes under the caller's owner keys and reads only the rows that can match,
-- instead of all of the owner's rows, when few do (harbor._lexical_candidates).
-- Two owners whose hashes collide share keys: the leg tests the owner key and
-- the text of every row it reads, so a collision costs a read, never a wrong row.
-- fastupdate off: a lookup never scans a pending list of recent writes.
create function harbor.owner_term_prefix(owner_key text) returns text
    language sql immutable parallel safe
return pg_catalog.left(pg_catalog.md5(owner_key), 8) || ':';
create function harbor.memory_owner_terms(tenant_id text, scope harbor.memory_scope,
                                          user_id text, project_id text, session_id text,
                                          run_id text, fts tsvector) returns text[]
    language sql immutable parallel safe
return array(select harbor.owner_term_prefix(harbor.vector_owner_key(tenant_id, '', scope,
                                                                     user_id, project_id,
                                                                     session_id, run_id))
                    || lexeme
               from pg_catalog.unnest(pg_catalog.tsvector_to_array(fts)) lexeme);
create index memories_owner_terms_idx
    on harbor.memories using gin (harbor.memory_owner_terms(tenant_id, scope, user_id, project_id,
                                                            session_id, run_id, fts))
    with (fastupdate = off);
-- HNSW per common dimension (expression indexes: the column itself is untyped
-- so one table serves every model). 384: MiniLM / bge-small; 1536: OpenAI.
-- ef_construction 128 (pgvector's default is 64): with 64, a graph built over
-- rows written round robin by many owners found 93% of a 100,000-row owner's
-- exact top 25 (76% at worst); with 128, 99.8% (96% at worst), for 1.5 times
-- the build time (migration 0006's docstring has the measurement).
-- Only the rows in_graph (migration 0018): the owner keys recall walks the graph for.
create index memory_embeddings_hnsw_384 on harbor.memory_embeddings
    using hnsw ((embedding::public.vector(384)) public.vector_cosine_ops)
    with (m = 16, ef_construction = 128) where dims = 384 and in_graph;
create index memory_embeddings_hnsw_1536 on harbor.memory_embeddings
    using hnsw ((embedding::public.vector(1536)) public.vector_cosine_ops)
    with (m = 16, ef_construction = 128) where dims = 1536 and in_graph;

-- Recall hits: how often, and when last, recall returned each memory. Memories are
-- add-only, so the counts live beside them; written after a recall returns (never in
-- recall's own statement) by harbor.record_hits(), read by recall's importance decay
-- (importance_half_life_hours). The owner columns are the memory's (the
-- memory_hits_owner trigger refuses others) so that the policies can test them
-- without a sub-select; the foreign key takes a memory's hits when it is deleted
-- (erasure, retention) (migration 0025).
create table harbor.memory_hits (
    tenant_id        text not null,
    memory_id        text not null,
    scope            harbor.memory_scope not null,
    project_id       text not null default '',
    user_id          text not null default '',
    session_id       text not null default '',
    run_id           text not null default '',
    hits             bigint not null default 0 check (hits >= 0),
    last_recalled_at timestamptz not null default pg_catalog.now(),
    primary key (tenant_id, memory_id),
    constraint memory_hits_memory_fkey foreign key (tenant_id, memory_id)
        references harbor.memories (tenant_id, id) on delete cascade
);

-- Per-session bookkeeping for background summaries: the cooldown lives in the
-- database so two workers never summarise one session at once.
create table harbor.session_state (
    tenant_id        text not null check (tenant_id <> ''),
    user_id          text not null check (user_id <> ''),
    session_id       text not null check (session_id <> ''),
    summarised_at    timestamptz,
    summary_lease_until timestamptz,
    turns_at_summary bigint not null default 0,
    -- the id of the last of the turns_at_summary turns (in id order) while no turn of
    -- the session was deleted since: the summary rule then counts only the turns after
    -- it (harbor.summary_due_rows); null: unknown, every turn is counted
    summarised_through bigint,
    primary key (tenant_id, user_id, session_id)
);

-- Every table enables and forces row-level security, line by line on purpose (FORCE
-- holds the table owner to the policies too).
alter table harbor.role_bindings     enable row level security;
alter table harbor.role_bindings     force row level security;
alter table harbor.messages          enable row level security;
alter table harbor.messages          force row level security;
alter table harbor.working_state     enable row level security;
alter table harbor.working_state     force row level security;
alter table harbor.memories          enable row level security;
alter table harbor.memories          force row level security;
alter table harbor.memory_embeddings enable row level security;
alter table harbor.memory_embeddings force row level security;
alter table harbor.session_state     enable row level security;
alter table harbor.session_state     force row level security;
alter table harbor.memory_hits       enable row level security;
alter table harbor.memory_hits       force row level security;

-- Privileges: nothing for PUBLIC; table privileges per role, rows by policy.
revoke all on schema harbor from public;
grant usage on schema harbor to harbor_app, harbor_admin, harbor_search;

grant select on harbor.role_bindings to harbor_app, harbor_admin, harbor_search;
grant insert, delete on harbor.role_bindings to harbor_admin;

-- INSERT on every column but the identity id: with table-level INSERT a caller could
-- write OVERRIDING SYSTEM VALUE with an id the sequence has not reached, hold it in
-- an open transaction and stall whoever draws it (migration 0017)
grant select, delete on harbor.messages to harbor_app;
grant insert (tenant_id, user_id, session_id, project_id, principal_id, role, content, name,
              tool_calls, tool_call_id, metadata, token_estimate, created_at)
    on harbor.messages to harbor_app;
grant select, delete on harbor.messages to harbor_admin;

grant select, delete on harbor.working_state to harbor_app;
grant insert (tenant_id, project_id, user_id, session_id, run_id, principal_id, state, expires_at,
              updated_at)
    on harbor.working_state to harbor_app;
grant select, delete on harbor.working_state to harbor_admin;

-- add-only: the app may close an interval and link the successor, nothing else
-- (summaries are the one row whose content is refreshed in place)
grant select, insert, delete on harbor.memories to harbor_app;
grant update (valid, superseded_by, updated_at, content, content_hash, context,
              source_message_ids, metadata, importance, entity_ids) on harbor.memories to harbor_app;
grant select, insert, delete on harbor.memories to harbor_admin;
grant update (valid, superseded_by, updated_at) on harbor.memories to harbor_admin;
grant select on harbor.memories to harbor_search;

grant select, insert, delete on harbor.memory_embeddings to harbor_app;
grant select, insert, delete on harbor.memory_embeddings to harbor_admin;
grant select on harbor.memory_embeddings to harbor_search;
-- (harbor.promote_vector_owner, owned by harbor_search, puts an owner key's rows in the graph)
grant update (in_graph) on harbor.memory_embeddings to harbor_search;

-- (a hit row is counted up, never rewritten otherwise)
grant select, insert on harbor.memory_hits to harbor_app;
grant update (hits, last_recalled_at) on harbor.memory_hits to harbor_app;
grant select, delete on harbor.memory_hits to harbor_admin;
grant select on harbor.memory_hits to harbor_search;

grant select, insert, update on harbor.session_state to harbor_app;
grant select, delete on harbor.session_state to harbor_admin;

-- Serialisation locks (migration 0017): one row per session (scope 'session') and per
-- run (scope 'run'), locked by INSERT ... ON CONFLICT DO UPDATE ... WHERE false. An
-- append locks its session's row before its id is drawn, so within a session ids are
-- in commit order; a working-state write locks its run's row. Row-level security
-- (sql/policies/locks.sql) admits only a row of the caller's own identity, so no one
-- else can take or hold an owner's lock (an advisory key could be held by any login).
-- No table-level UPDATE, DELETE or TRUNCATE for the application role: LOCK TABLE then
-- allows it nothing stronger than ROW EXCLUSIVE, which no harbor-pg statement waits for.
-- Migration 0017 creates this table and its grants again on purpose: the revision
-- stands alone once committed, this is the fresh install.
create table harbor.owner_locks (
    tenant_id  text not null check (tenant_id <> ''),
    user_id    text not null check (user_id <> ''),
    session_id text not null,
    scope      harbor.memory_scope not null check (scope in ('user', 'session', 'run')),
    project_id text not null default '',
    run_id     text not null default '',
    check (scope = 'run' or (project_id = '' and run_id = '')),
    -- a user's row (migration 0027): every append locks it before its session's, and an
    -- erasure of the user first (harbor.erase), so it waits for the appends in flight
    check ((scope = 'user') = (session_id = '')),
    -- a session's row (migration 0029): an extraction of the session's turns is queued and
    -- has not started; set by the append that queues it, cleared by that job as it reads
    -- the turns (harbor_pg/jobs.py), both under the row's lock
    extraction_queued boolean not null default false,
    primary key (tenant_id, user_id, session_id, scope, project_id, run_id)
);
alter table harbor.owner_locks enable row level security;
alter table harbor.owner_locks force row level security;
grant select, insert on harbor.owner_locks to harbor_app;
grant update (scope, extraction_queued) on harbor.owner_locks to harbor_app;
grant select, delete on harbor.owner_locks to harbor_admin;

-- Bearer tokens of the MCP server (migration 0014): the SHA-256 of a token's
-- text and the identity it stands for; the text itself is kept nowhere.
-- Policies: sql/policies/tokens.sql.
create table harbor.access_tokens (
    tenant_id    text not null check (tenant_id <> ''),
    id           text not null default (pg_catalog.gen_random_uuid())::text,
    token_hash   text not null check (token_hash ~ '^[0-9a-f]{64}$'),
    name         text not null default '',
    project_id   text check (project_id <> ''),
    principal_id text check (principal_id <> ''),
    user_id      text check (user_id <> ''),
    session_id   text check (session_id <> ''),
    run_id       text check (run_id <> ''),
    is_admin     boolean not null default false,
    created_at   timestamptz not null default pg_catalog.now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    primary key (tenant_id, id),
    constraint access_tokens_hash_key unique (tenant_id, token_hash)
);
create index access_tokens_hash_idx on harbor.access_tokens (token_hash);
alter table harbor.access_tokens enable row level security;
alter table harbor.access_tokens force row level security;
grant select on harbor.access_tokens to harbor_app;
grant select, insert on harbor.access_tokens to harbor_admin;
grant update (revoked_at) on harbor.access_tokens to harbor_admin;
