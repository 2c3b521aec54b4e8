-- The key of a memory's context, read by recall's neighbour signal (ranking.sql),
-- and the trigger that stores it in memories.context_hash.

-- The dedup key a memory's context would have as content of its scope
-- (harbor_pg.records.content_hash: scope ':' the text, whitespace runs collapsed,
-- trimmed, lower case; sha256 in hex), null without a context: recall's neighbour
-- signal links a candidate to the one whose content_hash this is. Stored in
-- memories.context_hash (migration 0019) by the trigger below. regexp_replace()
-- costs about 25 us a text: printable ASCII with no run of spaces is its own
-- collapsed form, so it skips the matcher (the same test as
-- harbor.recall_line_tokens, tokens.sql).
-- Stable, not immutable: an enum's text is not immutable.
create or replace function harbor.context_hash(scope harbor.memory_scope, context text)
    returns text
    language sql stable security invoker parallel safe
return case when context is null then null
            else pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                     scope::text || ':' || pg_catalog.lower(pg_catalog.btrim(
                         case when context operator(pg_catalog.!~) '[^ -~]|  '
                              then context
                              else pg_catalog.regexp_replace(context, '\s+', ' ', 'g') end)),
                     'UTF8')), 'hex') end;

-- memories.context_hash follows the row's scope and context on every insert and
-- on an update of either (or of the column: a writer's own value is replaced).
create or replace function harbor._memories_context_hash() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    new.context_hash := harbor.context_hash(new.scope, new.context);
    return new;
end
$$;

-- (the column comes with revision 0019; this file also runs on the revisions before
-- it. The condition keeps the call off the rows without a context)
do $$
begin
    if exists (select 1 from pg_catalog.pg_attribute
                where attrelid = 'harbor.memories'::pg_catalog.regclass
                  and attname = 'context_hash' and not attisdropped) then
        create or replace trigger memories_context_hash
            before insert or update of scope, context, context_hash on harbor.memories
            for each row
            when (new.context is not null or new.context_hash is not null)
            execute function harbor._memories_context_hash();
    else
        drop trigger if exists memories_context_hash on harbor.memories;
    end if;
end
$$;
