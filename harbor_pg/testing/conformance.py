"""One behavioural suite for every store implementation.

harbor-pg runs it against the in-process stores and the PostgreSQL stores;
run it against yours to prove it behaves the same. Subclass it in your own
tests and say how to build a manager on your stores::

    from harbor_pg import MemoryManager
    from harbor_pg.testing import MemoryStoreConformance

    class TestMyStores(MemoryStoreConformance):
        async def make_manager(self) -> MemoryManager:
            return MemoryManager(short_term=MyTurns(), working=MyScratch(), long_term=MyMemories())

Nothing else is needed: no pytest-asyncio, no ``asyncio_mode``, no plugin.
Each check is a plain (synchronous) pytest test that runs its coroutine in a
fresh event loop with :func:`asyncio.run`: :meth:`make_manager` is awaited
inside that loop (so database pools it opens belong to it) and
:meth:`close_manager` afterwards. ``self.request`` is the pytest request, for
a ``make_manager`` that needs your fixtures (``self.request.getfixturevalue``).

Erasure and retention reach a store of your own through these methods, when
it has them (sync or async, as the in-process stores define them):
``erase(tenant_id, user_id=, session_id=, principal_id=)`` on each store (the
short-term one returns the erased turn ids, which the long-term one receives as
``turn_ids=``), ``purge_expired_of(tenant_id)`` on the working store and
``apply_retention(tenant_id, max_age_seconds, scope=, min_sensitivity=,
include_summaries=)`` and ``expire_memories_of(tenant_id)`` (close the tenant's
memories past their expiry, returning how many) on the long-term store.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError, MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.tiers.base import ConsolidatingStore, ObservationStore, ProfileStore

__all__ = ["MemoryStoreConformance"]

ALICE = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1", run_id="r1"
)
ALICE_S2 = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="alice", session_id="s2", run_id="r1"
)
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1", run_id="r1")
OTHER_TENANT = MemoryOwner(
    tenant_id="t2", project_id="p1", principal_id="alice", session_id="s1", run_id="r1"
)

_DAY = timedelta(days=1)


class _Observer:
    """A scripted model for observations: one sentence naming how many facts it read."""

    async def generate_text(self, system: str, user: str) -> str:
        return f"The harbour is a busy place ({user.count('- ')} facts)"

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise NotImplementedError


class MemoryStoreConformance:
    """Behaviour every store must show; override :meth:`make_manager`."""

    request: pytest.FixtureRequest

    @pytest.fixture(autouse=True)
    def _harbor_request(self, request: pytest.FixtureRequest) -> None:
        self.request = request

    async def make_manager(self) -> MemoryManager:
        """The manager under test, built on your stores (awaited in the test's event loop)."""
        raise NotImplementedError(
            f"{type(self).__name__} must override make_manager() to build a MemoryManager "
            "on the stores under test"
        )

    async def close_manager(self, manager: MemoryManager) -> None:
        """Called after each check (default: ``await manager.close()``)."""
        await manager.close()

    def _run(self, check: Callable[[Any, MemoryManager], Awaitable[None]]) -> None:
        async def main() -> None:
            manager = await self.make_manager()
            try:
                await check(self, manager)
            finally:
                await self.close_manager(manager)

        asyncio.run(main())

    # -- short-term --

    async def test_append_and_recent_in_order(self, manager: MemoryManager) -> None:
        for i in range(5):
            await manager.append(ALICE, ConversationMessage(role="user", content=f"turn {i}"))
        got = await manager.recent(ALICE, limit=3)
        assert [m.content for m in got] == ["turn 2", "turn 3", "turn 4"]
        assert all(m.id is not None and m.created_at is not None for m in got)

    async def test_turn_fields_round_trip(self, manager: MemoryManager) -> None:
        call = {"id": "c1", "name": "lookup", "args": {"q": "x"}}
        await manager.append(
            ALICE,
            ConversationMessage(role="assistant", content="", tool_calls=[call], metadata={"k": 1}),
        )
        await manager.append(
            ALICE,
            ConversationMessage(role="tool", content="result", tool_call_id="c1", name="lookup"),
        )
        a, t = await manager.recent(ALICE, limit=2)
        assert a.tool_calls == [call] and a.metadata == {"k": 1}
        assert t.tool_call_id == "c1" and t.name == "lookup" and t.role == "tool"

    async def test_sessions_and_users_are_isolated(self, manager: MemoryManager) -> None:
        await manager.append(ALICE, ConversationMessage(role="user", content="alice s1"))
        assert await manager.recent(ALICE_S2) == []
        assert await manager.recent(BOB) == []
        assert await manager.recent(OTHER_TENANT) == []

    async def test_recent_is_capped_at_max_session_turns(self, manager: MemoryManager) -> None:
        cap = manager.policy.max_session_turns
        for i in range(cap + 5):
            await manager.append(ALICE, ConversationMessage(role="user", content=f"t{i}"))
        got = await manager.recent(ALICE, limit=cap + 100)
        assert len(got) == cap
        assert got[-1].content == f"t{cap + 4}"

    async def test_clear_removes_only_that_session(self, manager: MemoryManager) -> None:
        await manager.append(ALICE, ConversationMessage(role="user", content="a"))
        await manager.append(ALICE_S2, ConversationMessage(role="user", content="b"))
        assert await manager.clear(ALICE) == 1
        assert await manager.recent(ALICE) == []
        assert [m.content for m in await manager.recent(ALICE_S2)] == ["b"]

    async def test_bad_turns_are_rejected(self, manager: MemoryManager) -> None:
        with pytest.raises(MemoryValidationError):
            await manager.append(ALICE, {"role": "wizard", "content": "x"})
        with pytest.raises(MemoryValidationError):
            await manager.append(
                ALICE,
                ConversationMessage(
                    role="user", content="x" * (manager.config.max_content_chars + 1)
                ),
            )
        assert await manager.recent(ALICE) == []

    # -- working --

    async def test_update_merges_keys(self, manager: MemoryManager) -> None:
        await manager.update(ALICE, {"step": "retrieval", "n": 1})
        merged = await manager.update(ALICE, {"n": 2, "extra": [1, 2]})
        assert merged == {"step": "retrieval", "n": 2, "extra": [1, 2]}
        assert await manager.scratch(ALICE) == merged

    async def test_working_state_is_per_run(self, manager: MemoryManager) -> None:
        await manager.update(ALICE, {"x": 1})
        other_run = ALICE.model_copy(update={"run_id": "r2"})
        assert await manager.scratch(other_run) == {}
        assert await manager.scratch(BOB) == {}

    async def test_expired_state_is_invisible_at_once(self, manager: MemoryManager) -> None:
        await manager.update(ALICE, {"x": 1}, ttl_seconds=0.3)
        assert await manager.scratch(ALICE) == {"x": 1}
        await asyncio.sleep(0.45)
        assert await manager.scratch(ALICE) == {}
        # a write after expiry starts from an empty state
        assert await manager.update(ALICE, {"y": 2}) == {"y": 2}

    async def test_clear_working(self, manager: MemoryManager) -> None:
        await manager.update(ALICE, {"x": 1})
        await manager.clear_working(ALICE)
        assert await manager.scratch(ALICE) == {}

    async def test_bad_working_state_is_rejected(self, manager: MemoryManager) -> None:
        with pytest.raises(MemoryValidationError):
            await manager.update(ALICE, {"x": object()})
        with pytest.raises(MemoryValidationError):
            await manager.update(ALICE, {"x": float("nan")})
        with pytest.raises(MemoryValidationError):
            await manager.update(ALICE, {"x": 1}, ttl_seconds=-1)
        assert await manager.scratch(ALICE) == {}

    async def test_working_needs_a_run(self, manager: MemoryManager) -> None:
        with pytest.raises(MemoryScopeError):
            await manager.scratch(
                MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
            )

    # -- long-term --

    async def test_save_get_search_delete(self, manager: MemoryManager) -> None:
        saved = await manager.save(
            ALICE, Memory(content="Alice prefers green tea", scope=MemoryScope.USER)
        )
        assert saved.created and saved.memory.id
        got = await manager.get(ALICE, saved.memory.id)
        assert got is not None and got.content == "Alice prefers green tea"
        assert got.user_id == "alice" and got.scope is MemoryScope.USER
        hits = await manager.search(ALICE, "what tea does she like")
        assert [m.id for m in hits] == [saved.memory.id]
        assert await manager.delete(ALICE, saved.memory.id)
        assert await manager.get(ALICE, saved.memory.id) is None

    async def test_recall_ranks_as_the_python_rules_do(self, manager: MemoryManager) -> None:
        """Every signal of a recall, recomputed from its columns by
        harbor_pg.ranking, gives the same relevance, recency, score and
        order: the database's ranking and the Python one agree on the same rows."""
        from datetime import UTC, datetime, timedelta

        import harbor_pg.ranking as ranking
        from harbor_pg.context.recall import MemoryRecall
        from harbor_pg.embedders.hashing import HashingEmbedder

        embedded = MemoryManager(
            short_term=manager.short_term,
            working=manager.working,
            long_term=manager.long_term,
            embedder=HashingEmbedder(),
        )
        now = datetime.now(UTC)
        texts = [
            "the harbor ledger lists every ship",
            "a ledger of tea shipments",
            "harbor fees rose in May",
            "green tea at the harbor office",
            "nothing to do with the question",
            "ledger, harbor, tea: all three words",
        ]
        for n, text in enumerate(texts):
            await embedded.save(
                ALICE,
                Memory(
                    content=text,
                    importance=0.1 * n,
                    # each turn with the one before it as its context: neighbours
                    context=texts[n - 1] if n else None,
                    valid_from=now - timedelta(days=3 * n + 1),
                ),
            )
        month = (now - timedelta(days=4)).strftime("%B")
        for fusion, query in (
            ("rrf", "harbor ledger tea"),
            ("weighted", "harbor ledger tea"),
            ("rrf", f"harbor ledger tea in {month}"),
        ):
            policy = manager.policy.with_changes(
                recall_top_k=50, recall_fusion=fusion, relevance_threshold=0.0
            )
            recaller = MemoryRecall(
                policy=policy, memories=manager.long_term, embedder=embedded.embedder
            )
            items = await recaller.recall_scored(ALICE, query, as_of=now, token_budget=10**6)
            assert len(items) >= 3, fusion
            parts = ranking.fused_relevance(
                items,
                fusion=fusion,
                rrf_k=policy.rrf_k,
                dense_weight=0.75,
                lexical_weight=1.0,
                neighbour_weight=0.75,
                date_weight=2.0,
                query=query,
            )
            assert any(i.neighbour > 0 for i in items), fusion
            if month in query:
                assert any(i.date_match == 1 for i in items), query
            for item, part in zip(items, parts, strict=True):
                rel = part.relevance
                rec = ranking.recency(item.memory, now, policy.recency_half_life_hours)
                assert item.relevance == pytest.approx(rel, rel=1e-9, abs=1e-12), fusion
                # the parts are the recall's own neighbour and date_match columns
                assert item.neighbour == pytest.approx(part.neighbour, rel=1e-9, abs=1e-12)
                assert item.date_match == part.date_match, fusion
                assert item.recency == pytest.approx(rec, rel=1e-9, abs=1e-12), fusion
                score = ranking.final_score(
                    rel, rec, item.memory.importance, item.entity, item.type_boost
                )
                assert item.score == pytest.approx(score, rel=1e-6), fusion
            assert [i.memory.id for i in items] == [
                i.memory.id for i in sorted(items, key=ranking.order_key)
            ], fusion

    async def test_same_content_twice_is_a_noop(self, manager: MemoryManager) -> None:
        first = await manager.save(ALICE, Memory(content="The deploy runs on Fridays"))
        again = await manager.save(ALICE, Memory(content="  the DEPLOY runs on   fridays "))
        assert first.created and not again.created
        assert again.memory.id == first.memory.id

    async def test_concurrent_duplicate_saves_leave_one(self, manager: MemoryManager) -> None:
        results = await asyncio.gather(
            *[manager.save(ALICE, Memory(content="Concurrent fact")) for _ in range(6)]
        )
        assert len({r.memory.id for r in results}) == 1
        assert sum(r.created for r in results) == 1

    async def test_profile_sections_and_isolation(self, manager: MemoryManager) -> None:
        # (a store that keeps no profile says so; ProfileStore is the protocol to offer one)
        if not isinstance(manager.long_term, ProfileStore):
            with pytest.raises(MemoryConfigurationError):
                await manager.profile(ALICE)
            return
        now = datetime.now(UTC)
        await manager.save_many(
            ALICE,
            [
                Memory(content="Alice is vegetarian", importance=0.9, valid_from=now - _DAY * 200),
                Memory(content="Alice plays the cello", importance=0.7, valid_from=now - _DAY * 90),
                Memory(content="Alice started a new job", valid_from=now - _DAY * 2),
                Memory(content="Alice's summary", memory_type=MemoryType.SUMMARY),
            ],
        )
        await manager.save(BOB, Memory(content="Bob is vegetarian", valid_from=now - _DAY * 100))
        await manager.save(OTHER_TENANT, Memory(content="Alice of t2 likes tea"))
        got = await manager.profile(ALICE, token_budget=None)
        assert [e.memory.content for e in got.stable] == [
            "Alice is vegetarian",
            "Alice plays the cello",
        ]
        assert [e.memory.content for e in got.recent] == ["Alice started a new job"]
        assert [e.rank for e in got.stable] == [1, 2]
        bob = await manager.profile(BOB, token_budget=None)
        assert [m.content for m in bob.memories] == ["Bob is vegetarian"]
        # the first line alone fills a budget of its own size twice over: no later line
        first = got.stable[0].tokens
        assert [
            e.memory.content for e in (await manager.profile(ALICE, token_budget=2 * first)).stable
        ] == ["Alice is vegetarian"]

    async def test_profile_puts_the_more_often_recalled_first_among_equals(
        self, manager: MemoryManager
    ) -> None:
        # (a store that counts recall hits has record_hits, as both built-in stores do;
        # one that counts none orders equals by how long they were held)
        record = getattr(manager.long_term, "record_hits", None)
        if not isinstance(manager.long_term, ProfileStore) or record is None:
            return
        now = datetime.now(UTC)
        saved = await manager.save_many(
            ALICE,
            [
                Memory(content="Alice rows on the harbour", valid_from=now - _DAY * 90),
                Memory(content="Alice sails on weekends", valid_from=now - _DAY * 60),
                Memory(
                    content="Alice is allergic to nuts", importance=0.9, valid_from=now - _DAY * 40
                ),
            ],
        )
        rows, sails, nuts = (r.memory.id or "" for r in saved)

        async def stable() -> list[str]:
            profile = await manager.profile(ALICE, token_budget=None)
            return [e.memory.id or "" for e in profile.stable]

        # equally important: the longer held first, until the other is recalled more often
        assert await stable() == [nuts, rows, sails]
        for _ in range(2):
            assert await record(ALICE, [sails]) == 1
        await record(ALICE, [rows])
        assert await stable() == [nuts, sails, rows]
        # importance still comes first: hits only order the equally important
        await record(BOB, [rows])  # (BOB may not see it: nothing counted)
        for _ in range(3):
            await record(ALICE, [rows])
        assert await stable() == [nuts, rows, sails]

    async def test_an_observation_whose_facts_fall_away_is_closed(
        self, manager: MemoryManager
    ) -> None:
        # (a store that cannot close one says so; ObservationStore is the protocol)
        if not isinstance(manager.long_term, ObservationStore):
            with pytest.raises(MemoryConfigurationError):
                await manager.observe(ALICE, model=_Observer())
            return
        facts = ["The harbour opens at six", "The harbour has a ferry", "The harbour cafe"]
        saved = await manager.save_many(
            ALICE, [Memory(content=f, entity_ids=["place:harbour"]) for f in facts]
        )
        [observation] = await manager.observe(ALICE, model=_Observer())
        oid = observation.id or ""
        # nobody else closes it
        assert not await manager.long_term.close_memory(BOB, oid, MemoryScope.USER)
        assert not await manager.long_term.close_memory(OTHER_TENANT, oid, MemoryScope.USER)
        assert (await manager.get(ALICE, oid) or observation).invalid_at is None
        # a fact it read is deleted: two are left, fewer than min_facts
        assert await manager.delete(ALICE, saved[0].memory.id or "")
        assert await manager.observe(ALICE, model=_Observer()) == []
        closed = await manager.get(ALICE, oid)
        assert closed is not None and closed.invalid_at is not None
        assert closed.superseded_by is None
        # closed once: a closed memory is not closed again
        assert not await manager.long_term.close_memory(ALICE, oid, MemoryScope.USER)

    async def test_consolidation_merges_near_duplicates_add_only(
        self, manager: MemoryManager
    ) -> None:
        # (a store that cannot merge says so; ConsolidatingStore is the protocol to offer it)
        if not isinstance(manager.long_term, ConsolidatingStore):
            with pytest.raises(MemoryConfigurationError):
                await manager.consolidate(ALICE)
            return
        now = datetime.now(UTC)
        teas = [
            Memory(content="Alice likes tea.", importance=0.4, valid_from=now - _DAY * 3),
            Memory(content="alice likes TEA", importance=0.9, valid_from=now - _DAY * 2),
        ]
        saved = await manager.save_many(ALICE, teas)
        bob = await manager.save_many(BOB, teas)
        [merge] = (await manager.consolidate(ALICE)).merges
        assert merge.merged_ids == (saved[1].memory.id, saved[0].memory.id)
        assert merge.content == "alice likes TEA"
        current = await manager.current_memories(ALICE, ["user"])
        assert [m.id for m in current] == [merge.successor_id]
        old = await manager.get(ALICE, saved[0].memory.id or "")
        assert old is not None and old.superseded_by == merge.successor_id
        # another user's copies are theirs: untouched
        assert {m.id for m in await manager.current_memories(BOB, ["user"])} == {
            r.memory.id for r in bob
        }

    async def test_scope_visibility(self, manager: MemoryManager) -> None:
        user = await manager.save(ALICE, Memory(content="alice user fact", scope=MemoryScope.USER))
        sess = await manager.save(
            ALICE, Memory(content="alice session fact", scope=MemoryScope.SESSION)
        )
        proj = await manager.save(ALICE, Memory(content="project fact", scope=MemoryScope.PROJECT))
        ids = (user.memory.id or "", sess.memory.id or "", proj.memory.id or "")
        assert await manager.get(ALICE_S2, ids[0]) is not None
        assert await manager.get(ALICE_S2, ids[1]) is None
        assert await manager.get(BOB, ids[0]) is None
        assert await manager.get(BOB, ids[2]) is not None
        assert await manager.get(OTHER_TENANT, ids[2]) is None
        assert not await manager.delete(BOB, ids[0])

    async def test_invalid_memories_are_rejected(self, manager: MemoryManager) -> None:
        with pytest.raises(MemoryValidationError):
            await manager.inject_memory(ALICE, "x", source="made-up")
        with pytest.raises(MemoryValidationError):
            await manager.inject_memory(ALICE, "x", sensitivity="secret")
        with pytest.raises(MemoryValidationError):
            await manager.inject_memory(ALICE, "   ")
        with pytest.raises(MemoryValidationError):
            await manager.inject_memory(ALICE, "y" * (manager.config.max_content_chars + 1))
        assert await manager.search(ALICE, "x") == []

    async def test_inject_memory_records_governance_fields(self, manager: MemoryManager) -> None:
        res = await manager.inject_memory(
            ALICE, "Alice's badge number is 42", source="tool:hr_lookup", sensitivity="pii"
        )
        assert res.memory.source == "tool:hr_lookup"
        assert res.memory.sensitivity.value == "pii"

    async def test_scope_needs_owner_fields(self, manager: MemoryManager) -> None:
        no_project = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
        with pytest.raises(MemoryScopeError):
            await manager.save(no_project, Memory(content="x", scope=MemoryScope.PROJECT))

    # -- combined --

    async def test_snapshot(self, manager: MemoryManager) -> None:
        await manager.append(ALICE, ConversationMessage(role="user", content="hello"))
        await manager.update(ALICE, {"step": 1})
        await manager.save(ALICE, Memory(content="Alice works on the ingest pipeline"))
        snap = await manager.snapshot(ALICE, query="ingest pipeline")
        assert [m.content for m in snap.recent] == ["hello"]
        assert snap.working_state == {"step": 1}
        assert [m.content for m in snap.memories] == ["Alice works on the ingest pipeline"]

    async def test_snapshot_rejects_another_owner(self, manager: MemoryManager) -> None:
        bound = manager.bound_to(ALICE)
        with pytest.raises(MemoryScopeError):
            await bound.snapshot(BOB)
        with pytest.raises(MemoryScopeError):
            await bound.snapshot(OTHER_TENANT)
        assert (await bound.snapshot(ALICE)).recent == []

    async def test_snapshot_rejects_a_widened_owner(self, manager: MemoryManager) -> None:
        # a caller authenticated without a project must not reach a project by adding one
        caller = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
        p2 = caller.model_copy(update={"project_id": "p2"})
        await manager.save(p2, Memory(content="p2 roadmap is secret", scope=MemoryScope.PROJECT))
        await manager.append(caller, ConversationMessage(role="user", content="hello"))
        bound = manager.bound_to(caller)
        with pytest.raises(MemoryScopeError, match="project_id"):
            await bound.snapshot(p2, query="p2 roadmap secret")
        with pytest.raises(MemoryScopeError, match="run_id"):
            await bound.snapshot(caller.model_copy(update={"run_id": "r9"}))
        # narrowed owners are not the caller either
        with pytest.raises(MemoryScopeError):
            await manager.bound_to(ALICE).snapshot(ALICE.model_copy(update={"project_id": None}))
        own = await bound.snapshot(caller, query="p2 roadmap secret")
        assert [m.content for m in own.recent] == ["hello"]
        assert own.memories == []

    async def test_unconfigured_tier_raises(self, manager: MemoryManager) -> None:
        only_working = MemoryManager(working=manager.working)
        with pytest.raises(MemoryConfigurationError):
            await only_working.recent(ALICE)
        with pytest.raises(MemoryConfigurationError):
            await only_working.search(ALICE, "x")

    async def test_erase_user(self, manager: MemoryManager) -> None:
        await manager.append(ALICE, ConversationMessage(role="user", content="erase me"))
        await manager.update(ALICE, {"k": "erase me"})
        await manager.save(ALICE, Memory(content="erase me fact"))
        await manager.save(BOB, Memory(content="keep bob fact"))
        receipt = await manager.erase("t1", user_id="alice")
        assert receipt.short_term == 1 and receipt.working == 1 and receipt.long_term == 1
        assert await manager.recent(ALICE) == []
        assert await manager.scratch(ALICE) == {}
        assert await manager.search(ALICE, "erase") == []
        assert [m.content for m in await manager.search(BOB, "bob")] == ["keep bob fact"]

    async def test_erase_user_reaches_rows_written_in_wider_scopes(
        self, manager: MemoryManager
    ) -> None:
        # PROJECT rows store user_id '' and the author in principal_id
        # The owners of the erasure tests share one shape on purpose: each test states its own.
        dana = MemoryOwner(
            tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1", run_id="r1"
        )
        bot = MemoryOwner(
            tenant_id="t1",
            project_id="p1",
            principal_id="helper-bot",
            user_id="dana",
            session_id="s1",
            run_id="bot-run",
        )
        turn = await manager.append(dana, ConversationMessage(role="user", content="dana here"))
        await manager.update(dana, {"k": "dana"})
        await manager.save(dana, Memory(content="Dana project note", scope=MemoryScope.PROJECT))
        await manager.save(dana, Memory(content="Dana user note"))
        # an agent's fact about the project, extracted from Dana's turn
        await manager.save(
            bot,
            Memory(
                content="Project note taken from Dana",
                scope=MemoryScope.PROJECT,
                source_session_id="s1",
                source_message_ids=[str(turn.id)],
            ),
        )
        await manager.save(BOB, Memory(content="Bob project note", scope=MemoryScope.PROJECT))
        receipt = await manager.erase("t1", user_id="dana")
        assert (receipt.short_term, receipt.working, receipt.long_term) == (1, 1, 3)
        assert [m.content for m in await manager.search(BOB, "project note")] == [
            "Bob project note"
        ]
        assert await manager.search(dana, "dana") == []
        assert await manager.recent(dana) == []

    async def test_erase_session_takes_memories_derived_from_it(
        self, manager: MemoryManager
    ) -> None:
        dana = MemoryOwner(
            tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1", run_id="r1"
        )
        dana_s2 = dana.model_copy(update={"session_id": "s2"})
        turn = await manager.append(dana, ConversationMessage(role="user", content="code 4711"))
        await manager.append(dana_s2, ConversationMessage(role="user", content="other session"))
        await manager.update(dana, {"s": 1})
        await manager.update(dana_s2, {"s": 2})
        await manager.save(
            dana,
            Memory(
                content="Dana's locker code is 4711",
                source_session_id="s1",
                source_message_ids=[str(turn.id)],
            ),
            allow_secrets=True,  # a stated code: the credential filter would refuse it
        )
        await manager.save(
            dana,
            Memory(
                content="Locker codes have four digits",
                scope=MemoryScope.PROJECT,
                source_session_id="s1",
            ),
        )
        await manager.save(dana, Memory(content="locker session note", scope=MemoryScope.SESSION))
        await manager.save(dana_s2, Memory(content="Dana likes locker tea", source_session_id="s2"))
        receipt = await manager.erase("t1", user_id="dana", session_id="s1")
        assert (receipt.short_term, receipt.working, receipt.long_term) == (1, 1, 3)
        assert [m.content for m in await manager.search(dana, "locker")] == [
            "Dana likes locker tea"
        ]
        assert [m.content for m in await manager.recent(dana_s2)] == ["other session"]
        assert await manager.scratch(dana_s2) == {"s": 2}
        assert await manager.scratch(dana) == {}

    async def test_erase_session_tells_users_sessions_of_the_same_name_apart(
        self, manager: MemoryManager
    ) -> None:
        """Provenance is qualified by the conversation's user: an agent writes PROJECT
        memories from Dana's session s1 and from Bob's session s1; erasing Dana's s1
        takes the first (whoever wrote it) and leaves the second."""
        dana = MemoryOwner(
            tenant_id="t1",
            project_id="p1",
            principal_id="notes-bot",
            user_id="dana",
            session_id="s1",
        )
        bob = dana.model_copy(update={"user_id": "bob"})
        await manager.append(dana, ConversationMessage(role="user", content="dana's turn"))
        await manager.append(bob, ConversationMessage(role="user", content="bob's turn"))
        for owner, text in (
            (dana, "Dana's parcel goes to dock 3"),
            (bob, "Bob's parcel goes to dock 5"),
        ):
            await manager.save(
                owner, Memory(content=text, scope=MemoryScope.PROJECT, source_session_id="s1")
            )
        receipt = await manager.erase("t1", user_id="dana", session_id="s1")
        assert (receipt.short_term, receipt.long_term) == (1, 1)
        assert [m.content for m in await manager.search(bob, "parcel dock")] == [
            "Bob's parcel goes to dock 5"
        ]
        assert [m.content for m in await manager.recent(bob)] == ["bob's turn"]

    async def test_erase_agent_clears_its_turns_and_working_state(
        self, manager: MemoryManager
    ) -> None:
        carol = MemoryOwner(
            tenant_id="t1", project_id="p1", principal_id="carol", session_id="s1", run_id="r1"
        )
        bot = carol.model_copy(
            update={"principal_id": "support-bot", "user_id": "carol", "run_id": "bot-run"}
        )
        bot_s2 = bot.model_copy(update={"session_id": "s2"})
        await manager.append(carol, ConversationMessage(role="user", content="hi bot"))
        await manager.append(bot, ConversationMessage(role="assistant", content="bot says 1"))
        await manager.append(bot_s2, ConversationMessage(role="assistant", content="bot says 2"))
        await manager.update(carol, {"mine": 1})
        await manager.update(bot, {"tool": "lookup"})
        await manager.update(bot_s2, {"tool": "other"})
        await manager.save(bot, Memory(content="carol's ticket is 99", scope=MemoryScope.SESSION))
        await manager.save(carol, Memory(content="carol's ticket colour is blue"))

        receipt = await manager.erase_agent_memories("t1", "support-bot", session_id="s1")
        assert (receipt.short_term, receipt.working, receipt.long_term) == (1, 1, 1)
        assert [m.content for m in await manager.recent(carol)] == ["hi bot"]
        assert await manager.scratch(bot) == {}
        assert await manager.scratch(carol) == {"mine": 1}
        assert [m.content for m in await manager.recent(bot_s2)] == ["bot says 2"]
        assert await manager.scratch(bot_s2) == {"tool": "other"}

        receipt = await manager.erase_agent_memories("t1", "support-bot")
        assert (receipt.short_term, receipt.working, receipt.long_term) == (1, 1, 0)
        assert await manager.recent(bot_s2) == []
        assert [m.content for m in await manager.search(carol, "ticket")] == [
            "carol's ticket colour is blue"
        ]

    async def test_every_store_can_erase(self, manager: MemoryManager) -> None:
        """Erasure is part of the store protocol: each configured store implements it
        (the PostgreSQL stores erase together, in harbor.erase)."""
        from harbor_pg.tiers.base import (
            ErasableLongTermStore,
            ErasableShortTermStore,
            ErasableWorkingStore,
        )
        from harbor_pg.tiers.long_term import PostgresLongTermStore
        from harbor_pg.tiers.short_term import PostgresShortTermStore
        from harbor_pg.tiers.working import PostgresWorkingStore

        for store, protocol, builtin in (
            (manager.short_term, ErasableShortTermStore, PostgresShortTermStore),
            (manager.working, ErasableWorkingStore, PostgresWorkingStore),
            (manager.long_term, ErasableLongTermStore, PostgresLongTermStore),
        ):
            if store is None:
                continue
            assert isinstance(store, protocol) or (
                isinstance(store, builtin) and manager.database is not None
            ), f"{type(store).__name__} does not implement erase()"
        turn = await manager.append(ALICE, ConversationMessage(role="user", content="forget me"))
        await manager.save(
            BOB,
            Memory(
                content="Bob noted what alice said",
                scope=MemoryScope.PROJECT,
                source_message_ids=[str(turn.id)],
            ),
        )
        receipt = await manager.erase("t1", user_id="alice")
        assert (receipt.short_term, receipt.long_term) == (1, 1)
        assert await manager.search(BOB, "alice said") == []

    # -- retention --

    async def test_retention_purges_expired_state_and_ages_out_memories(
        self, manager: MemoryManager
    ) -> None:
        await manager.update(ALICE, {"x": 1}, ttl_seconds=0.05)
        await manager.update(ALICE_S2, {"y": 2})
        await manager.inject_memory(ALICE, "aged pii fact", sensitivity="pii")
        await manager.inject_memory(ALICE, "aged plain fact", scope=MemoryScope.SESSION)
        await asyncio.sleep(0.1)
        first = await manager.apply_retention("t1")
        assert (first.working, first.long_term) == (1, 0)
        assert await manager.scratch(ALICE_S2) == {"y": 2}
        kept = await manager.apply_retention("t1", max_age_seconds=3600)
        assert (kept.working, kept.long_term) == (0, 0)
        pii = await manager.apply_retention("t1", max_age_seconds=0, min_sensitivity="pii")
        assert (pii.working, pii.long_term) == (0, 1)
        assert [m.content for m in await manager.search(ALICE, "aged fact")] == ["aged plain fact"]
        user_only = await manager.apply_retention("t1", max_age_seconds=0, scope="user")
        assert user_only.long_term == 0  # the remaining one is a SESSION memory
        every = await manager.apply_retention("t1", max_age_seconds=0)
        assert every.long_term == 1
        assert await manager.search(ALICE, "aged fact") == []

    # -- expiry --

    async def test_an_expired_memory_is_closed_not_deleted(self, manager: MemoryManager) -> None:
        saved = await manager.save(
            ALICE, Memory(content="Visitor badge colour is blue"), ttl_seconds=0.4
        )
        kept = await manager.save(ALICE, Memory(content="Visitor parking is on level two"))
        expires_at = saved.memory.expires_at
        assert expires_at is not None and kept.memory.expires_at is None
        assert [m.id for m in await manager.search(ALICE, "badge colour")] == [saved.memory.id]
        before = expires_at - timedelta(seconds=0.2)
        await asyncio.sleep(0.6)
        # gone from every current read, at once (no sweep has run yet)
        assert [m.id for m in await manager.search(ALICE, "badge colour")] == []
        recalled = await manager.recall(ALICE, "visitor badge colour parking", top_k=5)
        assert saved.memory.id not in {m.id for m in recalled}
        assert kept.memory.id in {m.id for m in recalled}
        if isinstance(manager.long_term, ProfileStore):
            profile = await manager.profile(ALICE, token_budget=None)
            ids = {m.id for m in profile.memories}
            assert saved.memory.id not in ids and kept.memory.id in ids
        # and present as of before its expiry
        assert [m.id for m in await manager.search(ALICE, "badge colour", as_of=before)] == [
            saved.memory.id
        ]
        as_of = await manager.recall(ALICE, "visitor badge colour", top_k=5, as_of=before)
        assert saved.memory.id in {m.id for m in as_of}
        # the same content saved again is a new memory; the expired one is closed at its
        # expiry and kept
        again = await manager.save(ALICE, Memory(content="Visitor badge colour is blue"))
        assert again.created and again.memory.id != saved.memory.id
        old = await manager.get(ALICE, saved.memory.id or "")
        assert old is not None and old.invalid_at == expires_at

    async def test_retention_closes_expired_memories(self, manager: MemoryManager) -> None:
        saved = await manager.save(
            ALICE, Memory(content="Door code rotates weekly"), ttl_seconds=0.2
        )
        other = await manager.save(
            OTHER_TENANT, Memory(content="Door code rotates weekly"), ttl_seconds=0.2
        )
        await asyncio.sleep(0.4)
        receipt = await manager.apply_retention("t1")
        assert receipt.expired == 1 and receipt.long_term == 0
        old = await manager.get(ALICE, saved.memory.id or "")
        assert old is not None and old.invalid_at == saved.memory.expires_at
        # another tenant's expired memory is left to its own tenant's sweep
        theirs = await manager.get(OTHER_TENANT, other.memory.id or "")
        assert theirs is not None and theirs.invalid_at is None
        assert (await manager.apply_retention("t1")).expired == 0

    async def test_bad_expiries_are_rejected(self, manager: MemoryManager) -> None:
        start = datetime(2026, 1, 1, tzinfo=UTC)
        for memory, ttl in (
            (Memory(content="x1"), 0),
            (Memory(content="x2"), -5),
            (Memory(content="x3"), float("nan")),
            (Memory(content="x4", expires_at=start + _DAY), 60),
            (Memory(content="x5", valid_from=start, expires_at=start), None),
            (Memory(content="x6", expires_at=datetime(2026, 1, 1)), None),
        ):
            with pytest.raises(MemoryValidationError):
                await manager.save(ALICE, memory, ttl_seconds=ttl)


def _synchronous(check: Callable[[Any, MemoryManager], Awaitable[None]]) -> Callable[[Any], None]:
    """A plain pytest test running the coroutine ``check`` in its own event loop."""

    def test(self: MemoryStoreConformance) -> None:
        self._run(check)

    # not functools.wraps: pytest would follow __wrapped__ to the coroutine's signature
    test.__name__ = check.__name__
    test.__qualname__ = check.__qualname__
    test.__doc__ = check.__doc__
    return test


for _name, _check in list(vars(MemoryStoreConformance).items()):
    if _name.startswith("test_") and inspect.iscoroutinefunction(_check):
        setattr(MemoryStoreConformance, _name, _synchronous(_check))
del _name, _check
