"""The templates of recall's twins on a shard (harbor_pg.db.citus.shard_twin_templates):
what a delegated recall's worker fills in and runs (no database: the definitions are
the catalog's text, pg_get_functiondef)."""

from __future__ import annotations

import pytest

from harbor_pg.db.citus import _ON_SHARD, shard_twin_templates
from harbor_pg.errors import MemoryConfigurationError


def _definition(name: str, body: str, *, definer: bool = False) -> str:
    return (
        f"CREATE OR REPLACE FUNCTION harbor.{name}(p_tenant text, top_k integer)\n"
        " RETURNS integer\n LANGUAGE plpgsql\n STABLE"
        + (" SECURITY DEFINER" if definer else "")
        + "\n SET search_path TO 'pg_catalog', 'pg_temp'\n"
        " SET plan_cache_mode TO 'force_custom_plan'\n"
        f"AS $function$\n{body}\n$function$\n"
    )


BODY = """begin
    perform harbor._lexical_candidates(1), harbor._dense_candidates(2),
            harbor._substring_matches(3), harbor._decayed_importance(4), harbor.recall(5),
            harbor._owner_memories(6), harbor._memory_hits_of(7), harbor.profile(8);
    return (select count(*) from harbor.memories m
              join harbor.memory_embeddings e on e.tenant_id = m.tenant_id
              join harbor.memory_hits h on h.tenant_id = m.tenant_id
             where m.tenant_id = NAME.p_tenant
               and m.id <> 'harbor.memories'
               and c.oid = 'harbor.memories'::regclass
               and (null::harbor.memories) is null
               and x.y = harbor.memories_other.y
             limit NAME.top_k);
end"""


def _templates() -> dict[str, str]:
    definitions = {
        name: _definition(name, BODY.replace("NAME", name), definer=False) for name in _ON_SHARD
    }
    return dict(zip(_ON_SHARD, shard_twin_templates(definitions), strict=True))


def test_each_twin_is_a_temporary_function_calling_the_others_twins() -> None:
    for name, text in _templates().items():
        assert text.startswith(f"CREATE FUNCTION pg_temp.{name}_on_shard_@@suffix@@(")
        for other in _ON_SHARD:
            assert f"pg_temp.{other}_on_shard_@@suffix@@(" in text
            assert f"harbor.{other}(" not in text
        # its parameters qualified by its own name follow it
        assert f"{name}_on_shard_@@suffix@@.p_tenant" in text
        assert f"{name}_on_shard_@@suffix@@.top_k" in text


def test_tables_become_placeholders_but_not_in_strings_casts_or_longer_names() -> None:
    for text in _templates().values():
        assert "from @@harbor.memories@@ m" in text
        assert "join @@harbor.memory_embeddings@@ e" in text
        assert "join @@harbor.memory_hits@@ h" in text
        assert "'harbor.memories'" in text
        assert "'harbor.memories'::regclass" in text
        assert "null::harbor.memories)" in text
        assert "harbor.memories_other.y" in text


def test_the_legs_are_definers_and_plans_generic() -> None:
    for name, text in _templates().items():
        head = text.split("AS $function$")[0]
        assert ("SECURITY DEFINER" in head) == (
            name in ("_lexical_candidates", "_dense_candidates")
        )
        assert "force_generic_plan" in head
        assert "force_custom_plan" not in text


def test_a_definition_of_another_shape_is_refused() -> None:
    definitions = {name: _definition(name, "begin return 1; end") for name in _ON_SHARD}
    definitions["recall"] = definitions["recall"].replace("CREATE OR REPLACE", "CREATE")
    with pytest.raises(MemoryConfigurationError, match="unexpected definition"):
        shard_twin_templates(definitions)
