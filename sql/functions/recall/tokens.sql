-- Token estimates, for harbor.recall()'s token budget (ranking.sql).

-- Approximate tokens, as harbor_pg.tokens.approximate_tokens: ASCII at
-- about four characters per token, every other character one token.
-- The text without its non-ASCII characters is taken by removing their runs, one
-- match a run rather than a character (the same text; on CJK text, where every
-- character is one, 53 -> 7 us for a 120-character line).
create or replace function harbor.approximate_tokens(t text) returns integer
    language sql immutable security invoker parallel safe
-- not STRICT: a strict SQL function with a CASE body is never inlined
return case when t is null then null
            when t = '' then 0
            -- all ASCII (one byte per character): no regular expression needed; a
            -- quarter rounded up in integers ((n + 3) / 4, not numeric ceil())
            when pg_catalog.octet_length(t) = pg_catalog.length(t)
            then greatest(1, (pg_catalog.octet_length(t) + 3) / 4)
            else greatest(1,
    ceil(pg_catalog.length(pg_catalog.regexp_replace(t, '[^\x01-\x7f]+', '', 'g')) / 4.0)::integer
    + (pg_catalog.length(t)
       - pg_catalog.length(pg_catalog.regexp_replace(t, '[^\x01-\x7f]+', '', 'g')))) end;

-- Tokens of a recall line whose content needs its white space collapsed (see
-- harbor.recall_line_tokens below): the collapse is done once, into a variable. Written
-- inline as approximate_tokens()'s argument, the inlined function repeated it at each
-- use of its argument, six regular-expression passes a line (77 us a line, where this
-- takes about 20).
create or replace function harbor._collapsed_line_tokens(content_hash text, content text)
    returns integer
    language plpgsql immutable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_line text := '[' || left(content_hash, 12) || '] '
                   || pg_catalog.regexp_replace(pg_catalog.btrim(content), '\s+', ' ', 'g');
begin
    return harbor.approximate_tokens(v_line);
end
$$;

-- Tokens of a memory's rendered recall line, '[<hash12>] <content>' with the
-- content's whitespace runs collapsed to one space (as
-- harbor_pg.context.ranking.render_recalled), by harbor.approximate_tokens.
-- regexp_replace() starts a new matcher per match (about 25 us for an
-- eight-word memory: most of the ranking step), so the common case, printable
-- ASCII (space to tilde) with no run of spaces, skips it: collapsing cannot
-- change that text beyond btrim(), and all-ASCII text is four characters a
-- token. That case is told by one match of a bracket expression (about 0.5 us a
-- line, where a length comparison and six strpos() calls took about 1), and
-- counted in integers ((n + 3) / 4 is n / 4 rounded up, without numeric's
-- ceil()): on the LoCoMo turns 2.2 -> 1.5 us a line beyond the scan. Not STRICT and
-- argument-only, so it is inlined into the ranking.
-- The same printable-ASCII test is written out again in harbor.context_hash
-- (context_hash.sql), on purpose: a shared helper would be one more function
-- call per candidate row unless the planner inlines it; change both together.
create or replace function harbor.recall_line_tokens(content_hash text, content text)
    returns integer
    language sql immutable security invoker parallel safe
return case
    when content operator(pg_catalog.!~) '[^ -~]|  '
         and pg_catalog.octet_length(content_hash) = pg_catalog.length(content_hash)
    then greatest(1, (6 + pg_catalog.length(left(content_hash, 12))
                      + pg_catalog.octet_length(pg_catalog.btrim(content))) / 4)
    -- other text whose white space is single spaces only (no run, no other white space
    -- character: the collapse's own test, so the two cannot disagree): collapsing
    -- cannot change it beyond btrim() either, whatever its characters
    when pg_catalog.octet_length(content_hash) = pg_catalog.length(content_hash)
         and content operator(pg_catalog.!~) '\s\s|(?! )\s'
    then harbor.approximate_tokens('[' || left(content_hash, 12) || '] '
                                   || pg_catalog.btrim(content))
    else harbor._collapsed_line_tokens(content_hash, content) end;
