-- Function privileges, re-applied after every upgrade: nothing for PUBLIC,
-- EXECUTE for the harbor roles only.
revoke all on all functions in schema harbor from public;
grant execute on all functions in schema harbor to harbor_app, harbor_admin, harbor_search;
