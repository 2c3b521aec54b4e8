"""MemoryOwner validation and scope narrowing (no database)."""

from __future__ import annotations

import pytest

from harbor_pg.errors import MemoryScopeError
from harbor_pg.owner import SCOPE_OWNER_FIELDS, MemoryOwner, MemoryScope, scope_owner_fields
from harbor_pg.records import content_hash, validate_source


@pytest.mark.parametrize(
    "fields",
    [
        {"tenant_id": ""},
        {"tenant_id": "   "},
        {"tenant_id": "t" * 201},
        {"tenant_id": "t\n1"},
        {"tenant_id": "t", "session_id": "s\x00"},
        {"tenant_id": "t", "principal_id": 7},
        {"tenant_id": "t", "unknown": "x"},
        {},
    ],
    ids=["empty", "blank", "too-long", "newline", "nul", "not-a-string", "extra", "no-tenant"],
)
def test_bad_owner_input_is_rejected_before_sql(fields: dict[str, object]) -> None:
    with pytest.raises(MemoryScopeError):
        MemoryOwner(**fields)  # type: ignore[arg-type]


def test_user_id_defaults_to_principal() -> None:
    owner = MemoryOwner(tenant_id="t", principal_id="alice")
    assert owner.user_id == "alice"
    assert MemoryOwner(tenant_id="t", principal_id="svc", user_id="bob").user_id == "bob"


def test_scope_table_matches_the_seed() -> None:
    assert scope_owner_fields("global") == ()
    assert SCOPE_OWNER_FIELDS[MemoryScope.TENANT] == ("tenant_id",)
    assert SCOPE_OWNER_FIELDS[MemoryScope.PROJECT] == ("tenant_id", "project_id")
    assert SCOPE_OWNER_FIELDS[MemoryScope.USER] == ("tenant_id", "user_id")
    assert SCOPE_OWNER_FIELDS[MemoryScope.SESSION] == ("tenant_id", "user_id", "session_id")
    assert SCOPE_OWNER_FIELDS[MemoryScope.RUN][-1] == "run_id"


def test_missing_fields_for_a_scope_are_named() -> None:
    owner = MemoryOwner(tenant_id="t", principal_id="alice")
    with pytest.raises(MemoryScopeError, match="session_id"):
        owner.require_scope("session")
    with pytest.raises(MemoryScopeError, match="project_id"):
        owner.key("project")
    assert not owner.can_address("run")


def test_key_and_narrowing() -> None:
    owner = MemoryOwner(tenant_id="t", project_id="p", principal_id="a", session_id="s", run_id="r")
    assert owner.key("user") == {
        "tenant_id": "t",
        "project_id": "",
        "user_id": "a",
        "session_id": "",
        "run_id": "",
    }
    narrowed = owner.narrowed("session")
    assert (narrowed.project_id, narrowed.session_id, narrowed.run_id) == (None, "s", None)


def test_content_hash_normalises() -> None:
    assert content_hash("user", "Hello   World") == content_hash("user", " hello world ")
    assert content_hash("user", "x") != content_hash("session", "x")


@pytest.mark.parametrize("good", ["user", "extracted", "tool:web_search"])
def test_valid_sources(good: str) -> None:
    assert validate_source(good) == good


@pytest.mark.parametrize("bad", ["", "bot", "tool:", "tool:a b", "USER"])
def test_invalid_sources(bad: str) -> None:
    with pytest.raises(ValueError):
        validate_source(bad)
