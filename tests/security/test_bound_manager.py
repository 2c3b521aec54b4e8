"""A bound manager serves its caller only: every public method refuses any other owner.

The methods are enumerated by introspection (the manager's and those of the
helpers it hands out), so a method added later is walked too: one that takes
an owner and is not guarded fails here, and one that takes no owner must be
listed in NO_OWNER with the reason it needs none.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryScopeError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory

DANA = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1", run_id="r1"
)
EVE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="eve", session_id="s1", run_id="r1")
#: owners that differ from Dana in one field each (Eve, another session, another run,
#: no project, another tenant)
STRANGERS = [
    EVE,
    DANA.model_copy(update={"session_id": "s2"}),
    DANA.model_copy(update={"run_id": "r2"}),
    DANA.model_copy(update={"project_id": None}),
    DANA.model_copy(update={"tenant_id": "t2"}),
]
EVE_SECRET = "eve-private-marker-5521"

#: public methods of MemoryManager that take no owner, and why they need none
NO_OWNER = {
    "close": "waits for background work and closes pools",
    "drain": "waits for background work",
    "purge_working_state": "reclaims expired working state, already invisible to everyone",
    "expire_memories": "refused when bound: closes every tenant's expired memories",
    "apply_configured_retention": "refused when bound: the configured tenants' retention",
    "reembed": "refused when bound: a tenant's backfill runs as each of its owners",
    "queue_reembed": "refused when bound: a tenant's backfill runs as each of its owners",
    "run_reembed_job": "refused when bound: a tenant's backfill runs as each of its owners",
    "job_runner": "refused when bound: the queue's jobs run as the owners in their arguments",
    "run_worker": "refused when bound: the queue's jobs run as the owners in their arguments",
}
#: construction: class methods, no manager to bind yet
CONSTRUCTORS = {"create", "from_database"}
#: methods that hand out a helper whose own methods take the owner
HELPERS = {"recaller", "context_builder", "background_summarizer"}

#: sample values for the parameters the methods require, by name
SAMPLES: dict[str, Any] = {
    "turn": ConversationMessage(role="user", content="hello"),
    "state": {"step": 1},
    "memory": Memory(content="a fact"),
    "memories": [Memory(content="a fact")],
    "query": EVE_SECRET,
    "query_text": EVE_SECRET,
    "question": EVE_SECRET,
    "content": "a fact",
    "memory_id": "m-1",
    "destination": io.StringIO(),  # export_memories
    "source": io.StringIO(""),  # import_memories: an empty export
    "message_id": 1,  # run_extraction_job
    "from_id": 1,  # run_session_extraction_job
    "since": datetime(2026, 1, 1, tzinfo=UTC),  # run_consolidation_job
    "model": None,  # observe (the caller is checked first)
}


def owner_parameters(fn: Callable[..., Any]) -> list[str]:
    """Names of ``fn``'s parameters annotated as a MemoryOwner."""
    return [
        name
        for name, p in inspect.signature(fn).parameters.items()
        if "MemoryOwner" in str(p.annotation)
    ]


def call_args(fn: Callable[..., Any], owner: MemoryOwner) -> tuple[list[Any], dict[str, Any]]:
    """Arguments for ``fn``: ``owner`` for its owner parameters, samples for the rest."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name == "self":
            continue
        if "MemoryOwner" in str(p.annotation):
            value: Any = owner
        elif p.default is not inspect.Parameter.empty:
            continue
        else:
            assert name in SAMPLES, f"{fn.__qualname__}: add a sample value for {name!r}"
            value = SAMPLES[name]
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    return args, kwargs


async def invoke(fn: Callable[..., Any], owner: MemoryOwner) -> Any:
    args, kwargs = call_args(fn, owner)
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def public_methods(cls: type) -> list[str]:
    return sorted(
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member) and not isinstance(member, type)
    )


async def eve_fill(manager: MemoryManager) -> None:
    await manager.append(EVE, ConversationMessage(role="user", content=f"I am {EVE_SECRET}"))
    await manager.update(EVE, {"note": EVE_SECRET}, ttl_seconds=3600)
    await manager.save(EVE, Memory(content=f"Eve user fact {EVE_SECRET}"))
    await manager.save(EVE, Memory(content=f"Eve session fact {EVE_SECRET}", scope="session"))


async def eve_intact(manager: MemoryManager) -> None:
    """Eve's rows are all still there (nothing a refused call could have changed)."""
    assert [t.content for t in await manager.recent(EVE)] == [f"I am {EVE_SECRET}"]
    assert await manager.scratch(EVE) == {"note": EVE_SECRET}
    assert len(await manager.search(EVE, EVE_SECRET)) == 2


async def test_bound_manager_rejects_other_owners_on_every_public_method(
    database: Database,
) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    await eve_fill(manager)
    bound = manager.bound_to(DANA)
    walked: set[str] = set()
    for name in public_methods(MemoryManager):
        if name in CONSTRUCTORS:
            continue
        method = getattr(bound, name)
        if name in HELPERS:
            helper = method()
            helper_type = type(getattr(manager, name)())
            guarded = [
                m for m in public_methods(helper_type) if owner_parameters(getattr(helper_type, m))
            ]
            assert guarded, f"{name}() hands out a helper with no owner-taking method"
            for helper_method in guarded:
                for stranger in STRANGERS:
                    with pytest.raises(MemoryScopeError):
                        await invoke(getattr(helper, helper_method), stranger)
                walked.add(f"{name}().{helper_method}")
        elif owner_parameters(method):
            for stranger in STRANGERS:
                with pytest.raises(MemoryScopeError):
                    await invoke(method, stranger)
            walked.add(name)
        elif "tenant_id" in inspect.signature(method).parameters:
            continue  # governance: the next test
        else:
            assert name in NO_OWNER, (
                f"MemoryManager.{name} takes no owner: guard it or list it in NO_OWNER"
            )
    assert {
        "append",
        "recent",
        "recall",
        "search",
        "snapshot",
        "save",
        "inject_memory",
        "recaller().recall_scored",
        "context_builder().build",
        "background_summarizer().maybe_summarise",
    } <= walked
    await eve_intact(manager)


async def test_bound_manager_serves_its_own_caller_on_every_public_method(
    database: Database,
) -> None:
    """The guard refuses strangers only: the bound caller passes every check."""
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    bound = manager.bound_to(DANA)
    for name in public_methods(MemoryManager):
        if name in CONSTRUCTORS or name in NO_OWNER:
            continue
        method = getattr(bound, name)
        targets = (
            [
                getattr(method(), m)
                for m in public_methods(type(getattr(manager, name)()))
                if owner_parameters(getattr(type(getattr(manager, name)()), m))
            ]
            if name in HELPERS
            else [method]
            if owner_parameters(method)
            else []
        )
        for target in targets:
            try:
                await invoke(target, DANA)
            except MemoryScopeError as exc:  # pragma: no cover - the failure being tested
                pytest.fail(f"{name}: the bound caller was refused: {exc}")
            except Exception:
                pass  # e.g. extraction without a model: not the guard's business
    await bound.drain()


async def test_bound_manager_governance_refuses_other_subjects(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await eve_fill(manager)
    bound = manager.bound_to(DANA)
    with pytest.raises(MemoryScopeError):
        await bound.erase("t1", user_id="eve")
    with pytest.raises(MemoryScopeError):
        await bound.erase("t2", user_id="dana")
    with pytest.raises(MemoryScopeError):
        await bound.erase("t1", principal_id="eve")
    with pytest.raises(MemoryScopeError):
        await bound.erase("t1", user_id="dana", session_id="s9")
    with pytest.raises(MemoryScopeError):
        await bound.erase_agent_memories("t1", "eve")
    with pytest.raises(MemoryScopeError):
        await bound.apply_retention("t2", max_age_seconds=0)
    await eve_intact(manager)
    # its own subject is served
    receipt = await bound.erase("t1", user_id="dana")
    assert receipt.total == 0
