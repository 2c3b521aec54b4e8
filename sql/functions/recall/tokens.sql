-- Token estimates, for harbor.recall()'s token budget (ranking.sql).

-- Approximate tokens, as harbor_pg.tokens.approximate_tokens: ASCII at
-- about four characters per token, every other character one token.
create or replace function harbor.approximate_tokens(t text) returns integer
    language sql immutable security invoker parallel safe
-- not STRICT: a strict SQL function with a CASE body is never inlined
return case when t is null then null
            when t = '' then 0
            -- all ASCII (one byte per character): no regular expression needed
            when pg_catalog.octet_length(t) = pg_catalog.length(t)
            then greatest(1, ceil(pg_catalog.length(t) / 4.0)::integer)
            else greatest(1,
    ceil(pg_catalog.length(pg_catalog.regexp_replace(t, '[^\x01-\x7f]', '', 'g')) / 4.0)::integer
    + (pg_catalog.length(t)
       - pg_catalog.length(pg_catalog.regexp_replace(t, '[^\x01-\x7f]', '', 'g')))) end;

-- Tokens of a memory's rendered recall line, '[<hash12>] <content>' with the
-- content's whitespace runs collapsed to one space (as
-- harbor_pg.context.ranking.render_recalled), by harbor.approximate_tokens.
-- regexp_replace() starts a new matcher per match (about 25 us for an
-- eight-word memory: most of the ranking step), so the common case, ASCII
-- with single spaces and no other whitespace, skips it: collapsing cannot
-- change that text beyond btrim(), and all-ASCII text is four characters a
-- token. Not STRICT and argument-only, so it is inlined into the ranking.
-- The same single-spaced-ASCII test is written out again in harbor.context_hash
-- (context_hash.sql), on purpose: a shared helper would be one more function
-- call per candidate row unless the planner inlines it; change both together.
create or replace function harbor.recall_line_tokens(content_hash text, content text)
    returns integer
    language sql immutable security invoker parallel safe
return case
    when pg_catalog.octet_length(content) = pg_catalog.length(content)
         and pg_catalog.octet_length(content_hash) = pg_catalog.length(content_hash)
         and pg_catalog.strpos(content, '  ') = 0
         and pg_catalog.strpos(content, E'\t') = 0
         and pg_catalog.strpos(content, E'\n') = 0
         and pg_catalog.strpos(content, E'\r') = 0
         and pg_catalog.strpos(content, E'\f') = 0
         and pg_catalog.strpos(content, pg_catalog.chr(11)) = 0
    then greatest(1, ceil((3 + pg_catalog.length(left(content_hash, 12))
                           + pg_catalog.length(pg_catalog.btrim(content))) / 4.0)::integer)
    else harbor.approximate_tokens('[' || left(content_hash, 12) || '] '
             || pg_catalog.regexp_replace(pg_catalog.btrim(content), '\s+', ' ', 'g')) end;
