-- Row-level security of harbor.access_tokens (migration 0014). Re-runnable;
-- skipped while the table does not exist yet (an upgrade stepping through
-- earlier revisions applies this file after each of them).
--
-- The application role reads a token's row only when the transaction names
-- that row's hash in the setting harbor.token_hash: only a holder of the
-- token can compute it, so the role cannot list tokens or read another
-- token's identity. The elevated role manages the tokens of the tenant it
-- set with harbor.set_identity.
do $tokens$
begin
    if pg_catalog.to_regclass('harbor.access_tokens') is null then
        return;
    end if;
    -- erasure of a user takes the tokens that stand for them (harbor.erase)
    grant delete on harbor.access_tokens to harbor_admin;
    drop policy if exists access_tokens_holder on harbor.access_tokens;
    create policy access_tokens_holder on harbor.access_tokens for select to harbor_app
        using (token_hash operator(pg_catalog.=) (select harbor._setting('token_hash')));
    drop policy if exists access_tokens_admin on harbor.access_tokens;
    create policy access_tokens_admin on harbor.access_tokens for all to harbor_admin
        using (tenant_id operator(pg_catalog.=) (select harbor.caller_tenant()))
        with check (tenant_id operator(pg_catalog.=) (select harbor.caller_tenant()));
end
$tokens$;
