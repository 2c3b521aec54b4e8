"""The credential filter guards every long-term write, not only extraction."""

from __future__ import annotations

import pytest

from harbor_pg.errors import MemoryValidationError
from harbor_pg.extraction.secrets import secret_kind
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory

OWNER = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1")
AWS_KEY = "Dana's deploy key is AKIAIOSFODNN7EXAMPLE"

STATED = [
    "Dana uses Tr0ub4dor&3 as her password",
    "Dana uses Tr0ub4dor&3 as Dana's password",
    "She picked kitten42 as her email passphrase",
    'He set "blue sky" as the wifi password',
    "Erin uses 4821 as her PIN",
    "the wifi password is now hunter22",
    "her password is still Tr0ub4dor&3",
    "His password is: Tr0ub4dor",
    "Dana's password was Tr0ub4dor&3",
]
ORDINARY = [
    "She uses her birthday as her password",
    "Use 2FA as well as a password",
    "He uses a password manager as his password vault",
    "Set up SSO as the password replacement",
    "The password is now required for every login",
    "My password was changed yesterday",
    "The PIN is now 4 digits long",
    "Dana uses Face ID as her passcode",
    "the password is now stored in the vault",
    "Treat the reset link as a password",
    "I use the same one as my password",
    "The password was reset by IT on Monday",
]


@pytest.mark.parametrize("text", STATED)
def test_stated_passwords_in_the_as_and_is_now_shapes_are_secrets(text: str) -> None:
    assert secret_kind(text) == "password"


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_sentences_about_passwords_are_not_secrets(text: str) -> None:
    assert secret_kind(text) is None


@pytest.fixture
def manager() -> MemoryManager:
    from harbor_pg.tiers.in_process import InMemoryLongTermStore

    return MemoryManager(long_term=InMemoryLongTermStore())


async def test_save_refuses_a_secret_naming_its_kind(manager: MemoryManager) -> None:
    with pytest.raises(MemoryValidationError, match=r"aws_access_key"):
        await manager.save(OWNER, Memory(content=AWS_KEY))
    with pytest.raises(MemoryValidationError, match=r"context .*password"):
        await manager.save(OWNER, Memory(content="Dana logs in", context=STATED[0]))
    assert await manager.search(OWNER, "Dana") == []


async def test_save_many_refuses_a_batch_holding_a_secret(manager: MemoryManager) -> None:
    batch = [Memory(content="Dana likes tea"), Memory(content=STATED[0])]
    with pytest.raises(MemoryValidationError, match=r"password"):
        await manager.save_many(OWNER, batch)
    assert await manager.search(OWNER, "Dana") == []  # nothing of the batch was written


async def test_inject_memory_refuses_a_secret(manager: MemoryManager) -> None:
    with pytest.raises(MemoryValidationError, match=r"aws_access_key"):
        await manager.inject_memory(OWNER, AWS_KEY, scope="project")
    assert await manager.search(OWNER, "deploy key") == []


async def test_every_write_stores_a_secret_with_the_explicit_opt_out(
    manager: MemoryManager,
) -> None:
    await manager.save(OWNER, Memory(content=AWS_KEY), allow_secrets=True)
    await manager.save_many(OWNER, [Memory(content=STATED[0])], allow_secrets=True)
    await manager.inject_memory(OWNER, STATED[5], allow_secrets=True)
    found = {m.content for m in await manager.search(OWNER, "password key")}
    assert found == {AWS_KEY, STATED[0], STATED[5]}


async def test_ordinary_sentences_about_passwords_are_saved(manager: MemoryManager) -> None:
    for text in ORDINARY:
        assert (await manager.inject_memory(OWNER, text)).created
