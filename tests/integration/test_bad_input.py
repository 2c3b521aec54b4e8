"""Bad input gets a clear error of the package's own, never a raw one, and
nothing is half-written.

First the inputs a reliability run found escaping as raw Python errors or as
"database unavailable"; then a property test (hypothesis) of the public API:
every input either succeeds and reads back exactly, or raises a harbor error
with a message and leaves the database as it was.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import date
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harbor_pg import MemoryManager, MemoryOwner
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryDatabaseError, MemoryError, MemoryValidationError
from harbor_pg.records import Memory
from tests.conftest import PgDatabase, PgServer, _drop_database, _new_database

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1", run_id="r1")
T = TypeVar("T")


class Harness:
    """A manager on a database of its own, driven from synchronous tests on an
    event loop of its own (hypothesis runs examples synchronously)."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self.loop = asyncio.new_event_loop()
        self.database = Database(db.app_url, db.admin_url, min_size=1, max_size=2)
        self.run(self.database.open())
        self.manager = MemoryManager.from_database(self.database)
        self.su = psycopg.connect(db.superuser_url)

    def run(self, work: Awaitable[T]) -> T:
        return self.loop.run_until_complete(work)

    def rows(self) -> tuple[int, ...]:
        """Rows in every table: what a failed call must leave as it was."""
        with self.su.transaction():
            row = self.su.execute(
                "select (select count(*) from harbor.messages),"
                " (select count(*) from harbor.working_state),"
                " (select count(*) from harbor.memories),"
                " (select count(*) from harbor.memory_embeddings)"
            ).fetchone()
        assert row is not None
        return tuple(row)

    def outcome(self, call: Callable[[], Awaitable[T]]) -> T | MemoryError:
        """The call's result, or the harbor error it raised (anything else fails
        the test), with nothing written when it failed."""
        before = self.rows()
        try:
            return self.run(call())
        except MemoryError as exc:
            assert str(exc).strip(), f"{type(exc).__name__} without a message"
            assert not (isinstance(exc, MemoryDatabaseError) and "unavailable" in str(exc)), (
                f"bad input reported as an outage: {exc}"
            )
            assert self.rows() == before, f"half-written after {exc!r}"
            return exc

    def close(self) -> None:
        self.su.close()
        self.run(self.database.close())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(pg_server: PgServer) -> Iterator[Harness]:
    db = _new_database(pg_server)
    h = Harness(db)
    yield h
    h.close()
    _drop_database(pg_server, db.name)


deep: dict[str, Any] = {}
_node = deep
for _ in range(5000):
    _node["x"] = {}
    _node = _node["x"]

CASES: list[tuple[str, Callable[[MemoryManager], Awaitable[Any]]]] = [
    ("recent with a string limit", lambda m: m.recent(OWNER, "5")),  # type: ignore[arg-type]
    ("source None", lambda m: m.inject_memory(OWNER, "x", source=None)),  # type: ignore[arg-type]
    ("embedding 5", lambda m: m.save(OWNER, Memory(content="x"), embedding=5, model_id="m")),  # type: ignore[arg-type]
    ("surrogate in a turn", lambda m: m.append(OWNER, {"role": "user", "content": "a\ud800"})),
    ("surrogate in a query", lambda m: m.search(OWNER, "b\udfff")),
    ("surrogate in a snapshot", lambda m: m.snapshot(OWNER, query="\ud800")),
    ("surrogate in an erase", lambda m: m.erase("t1", user_id="\ud800")),
    ("surrogate in a memory", lambda m: m.inject_memory(OWNER, "\udc00 x")),
    ("ttl 10**400", lambda m: m.update(OWNER, {"a": 1}, ttl_seconds=10**400)),
    (
        "vector beyond float32",
        lambda m: m.save(OWNER, Memory(content="y"), embedding=[1e39, 0.0], model_id="m"),
    ),
    ("metadata 5000 deep", lambda m: m.inject_memory(OWNER, "z", metadata=deep)),
    ("working state 5000 deep", lambda m: m.update(OWNER, deep)),
    ("recall top_k nan", lambda m: m.recall(OWNER, "q", top_k=float("nan"))),  # type: ignore[arg-type]
    ("ttl 1e12", lambda m: m.update(OWNER, {"a": 1}, ttl_seconds=1e12)),
    ("NUL in a key", lambda m: m.update(OWNER, {"a\x00": 1})),
    ("importance 5e-324", lambda m: m.inject_memory(OWNER, "w", importance=5e-324)),
    ("ttl 1e-9", lambda m: m.update(OWNER, {"a": 1}, ttl_seconds=1e-9)),
    ("search limit -1", lambda m: m.search(OWNER, "q", limit=-1)),
    (
        "NUL in a model id",
        lambda m: m.save(OWNER, Memory(content="v"), embedding=[1.0, 0.0], model_id="m\x00"),
    ),
    ("retention age 10**400", lambda m: m.apply_retention("t1", max_age_seconds=10**400)),
    ("retention age -10**400", lambda m: m.apply_retention("t1", max_age_seconds=-(10**400))),
    ("NUL in a recall query", lambda m: m.recall(OWNER, "a\x00b")),
    ("NUL in a recall anchor", lambda m: m.recall(OWNER, "q", anchor_entity_ids=["e\x00"])),
    ("surrogate in a recall anchor", lambda m: m.recall(OWNER, "q", anchor_entity_ids=["\ud800"])),
    ("recall as_of a string", lambda m: m.recall(OWNER, "q", as_of="yesterday")),  # type: ignore[arg-type]
    ("recall as_of a number", lambda m: m.recall(OWNER, "q", as_of=12345)),  # type: ignore[arg-type]
    ("search as_of a date", lambda m: m.search(OWNER, "q", as_of=date(2024, 1, 1))),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_harbor_error(
    harness: Harness, name: str, call: Callable[[MemoryManager], Awaitable[Any]]
) -> None:
    result = harness.outcome(lambda: call(harness.manager))
    if name == "importance 5e-324" and not isinstance(result, MemoryError):
        return  # stored (as 0) is fine too
    assert isinstance(result, MemoryError), f"{name}: accepted {result!r}"
    if name in _INPUT_ERRORS:
        assert isinstance(result, MemoryValidationError), f"{name}: {result!r}"


#: the cases whose error must say the input was bad (not that the store failed)
_INPUT_ERRORS = {
    "NUL in a model id",
    "retention age 10**400",
    "retention age -10**400",
    "NUL in a recall query",
    "NUL in a recall anchor",
    "surrogate in a recall anchor",
    "recall as_of a string",
    "recall as_of a number",
    "search as_of a date",
}


# -- the property test -------------------------------------------------------------

#: any code point, lone surrogates and NUL included
_chars = st.characters(codec=None, exclude_categories=())
texts = st.one_of(
    st.text(_chars, max_size=40),
    st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "é" * 3, "x" * 20_001]),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([1e-9, 1e12, 5e-324, 0.5, 1, 3600]),
)
counts = st.one_of(
    st.integers(min_value=-3, max_value=60), st.floats(), st.sampled_from(["5", None, True])
)

_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _same_json(a: Any, b: Any) -> bool:
    # jsonb keeps a number as the decimal json.dumps wrote: a float comes back as
    # the same double, as an int when that decimal is whole (4.2e+16 -> 42000000000000000)
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and float(a) == float(b)
        )
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same_json, a, b))
    return bool(a == b) and type(a) is type(b)


@_SETTINGS
@given(content=texts, metadata=json_objects)
def test_append_reads_back_or_fails_cleanly(
    harness: Harness, content: str, metadata: dict[str, Any]
) -> None:
    m = harness.manager
    result = harness.outcome(
        lambda: m.append(OWNER, {"role": "user", "content": content, "metadata": metadata})
    )
    if isinstance(result, MemoryError):
        return
    [last] = harness.run(m.recent(OWNER, 1))
    assert last.content == content
    assert _same_json(last.metadata, metadata)


@_SETTINGS
@given(state=json_objects, ttl=st.one_of(st.none(), numbers))
def test_update_reads_back_or_fails_cleanly(
    harness: Harness, state: dict[str, Any], ttl: Any
) -> None:
    m = harness.manager
    before = harness.run(m.scratch(OWNER))
    result = harness.outcome(lambda: m.update(OWNER, state, ttl_seconds=ttl))
    after = harness.run(m.scratch(OWNER))
    if isinstance(result, MemoryError):
        assert after == before
        return
    assert _same_json(result, {**before, **state})
    if ttl is None or ttl > 5:  # a short TTL may have expired by the read
        assert _same_json(after, {**before, **state})


@_SETTINGS
# 0.63 has no exact float32: its shortest decimal and its exact double both read back as it
@example(content="a fact", importance=0.63, metadata={}, entity_ids=[], context=None)
@given(
    content=texts,
    importance=numbers,
    metadata=json_objects,
    entity_ids=st.lists(texts, max_size=2),
    context=st.one_of(st.none(), texts),
)
def test_inject_memory_reads_back_or_fails_cleanly(
    harness: Harness,
    content: str,
    importance: Any,
    metadata: dict[str, Any],
    entity_ids: list[str],
    context: str | None,
) -> None:
    m = harness.manager
    # an owner of its own per example: an earlier example's memory with the same text
    # (the dedup key) must not stand in for this one
    owner = OWNER.model_copy(update={"principal_id": f"p{uuid.uuid4().hex}"})
    result = harness.outcome(
        lambda: m.inject_memory(
            owner,
            content,
            importance=importance,
            metadata=metadata,
            entity_ids=entity_ids,
            context=context,
        )
    )
    if isinstance(result, MemoryError):
        return
    stored = harness.run(m.get(owner, str(result.memory.id)))
    assert stored is not None
    if result.created:
        assert stored.content == content
        assert stored.context == context
        assert stored.entity_ids == entity_ids
        assert _same_json(stored.metadata, metadata)
        # importance is a real (float32): it reads back as that float32, whether the driver
        # gives its shortest decimal (0.63) or its exact double (0.6299999952316284)
        assert _float32(stored.importance) == _float32(float(importance))


@_SETTINGS
@given(query=texts, limit=counts, top_k=counts)
def test_reads_return_or_fail_cleanly(harness: Harness, query: str, limit: Any, top_k: Any) -> None:
    m = harness.manager
    for call in (
        lambda: m.recent(OWNER, limit),
        lambda: m.search(OWNER, query, limit=limit),
        lambda: m.recall(OWNER, query, top_k=top_k),
        lambda: m.snapshot(OWNER, query=query, recent_limit=limit),
    ):
        harness.outcome(call)
