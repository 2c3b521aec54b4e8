-- Guards that keep long-term memory add-only.

-- Only the validity interval and the successor link of a memory may change
-- after insert; a rolling summary (memory_type 'summary') is the one row whose
-- content is refreshed in place under its deterministic id.
create or replace function harbor._memories_add_only() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if old.memory_type <> 'summary' and (
           new.content is distinct from old.content
        or new.content_hash is distinct from old.content_hash
        or new.context is distinct from old.context
        or new.source_message_ids is distinct from old.source_message_ids
        or new.metadata is distinct from old.metadata
        or new.importance is distinct from old.importance
        or new.entity_ids is distinct from old.entity_ids) then
        raise exception 'harbor.memories is add-only: only valid and superseded_by may change'
            using errcode = '42501', constraint = 'memories_add_only';
    end if;
    if upper(old.valid) is not null and new.valid is distinct from old.valid then
        raise exception 'harbor.memories: a closed validity interval cannot be reopened'
            using errcode = '42501', constraint = 'memories_add_only';
    end if;
    new.updated_at := pg_catalog.now();
    return new;
end
$$;

create or replace trigger memories_add_only
    before update on harbor.memories
    for each row execute function harbor._memories_add_only();
