"""Long-term tier: durable, add-only memories in PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from harbor_pg.consolidation import ConsolidationReport, ConsolidationRequest, Merge
from harbor_pg.db.connection import Connection, Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.db.vectors import BinaryArray, PgVector, PgVectorArray
from harbor_pg.errors import MemoryScopeError, MemoryValidationError
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.profile import ProfileEntry, ProfileRequest, UserProfile
from harbor_pg.ranking import RecalledMemory, RecallRequest
from harbor_pg.records import Memory, MemoryType, content_hash
from harbor_pg.tiers.base import FactResult, NearestMemory, SaveResult
from harbor_pg.tiers.rows import (
    ELEVATED_SCOPES,
    _stored_memory,
    current_memories_params,
    memory_from_row,
    memory_params,
    profile_params,
    recall_in_one_round_trip,
)
from harbor_pg.validation import check_text

log = logging.getLogger("harbor_pg")

__all__ = [
    "ELEVATED_SCOPES",
    "PostgresLongTermStore",
    "current_memories_params",
    "memory_from_row",
    "memory_params",
    "vector_literal",
]


def _in_search_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in a search's order (search_memories' ORDER BY): the rank, the importance
    and the start of validity, each highest first, then the id in C collation (by its
    bytes). Two stable sorts, the last key first: each key compared as it is, no key
    turned into a number to negate it."""
    rows = sorted(rows, key=lambda r: r["id"].encode())
    return sorted(rows, key=lambda r: (r["rank"], r["importance"], r["valid_from"]), reverse=True)


async def _note_global_memories(conn: Connection) -> None:
    """Set the flag that global memories may exist (a distributed database's, read by its
    searches: sql/citus/global.sql), in ``conn``'s transaction, before it writes one; read
    first, on the coordinator's copy: set, as it stays once a global memory was written,
    it is not written again (a write of the reference table reaches every node)."""
    row = await (await conn.execute(query("global_memories_noted"))).fetchone()
    if row is None or not row["may_exist"]:
        await conn.execute(query("note_global_memories"))


def _summary_params(owner: MemoryOwner, memory: Memory, memory_id: str) -> dict[str, Any]:
    if memory.memory_type is not MemoryType.SUMMARY or memory.scope is not MemoryScope.SESSION:
        raise MemoryValidationError("a session summary must have scope SESSION and type SUMMARY")
    key = owner.key(MemoryScope.SESSION)
    return {
        "tenant_id": key["tenant_id"],
        "user_id": key["user_id"],
        "session_id": key["session_id"],
        "principal_id": owner.principal_id or "",
        "id": memory_id,
        "importance": memory.importance,
        "content": memory.content,
        "content_hash": content_hash(MemoryScope.SESSION, memory.content),
        "source_message_ids": list(memory.source_message_ids),
        "metadata": Jsonb(memory.metadata),
    }


#: The largest magnitude a pgvector component (a float32) holds.
_FLOAT32_MAX = 3.4028234663852886e38


def check_vector(embedding: Sequence[float]) -> list[float]:
    try:
        values = list(map(float, embedding))
    except (TypeError, ValueError, OverflowError) as exc:
        raise MemoryValidationError(f"embedding must be a sequence of numbers ({exc})") from None
    if not values:
        raise MemoryValidationError("embedding is empty")
    # a NaN or an infinity anywhere makes the sum NaN or infinite (so does an overflow
    # of finite components, which the float32 check below then refuses): one pass in C
    if not math.isfinite(sum(values)) and not all(math.isfinite(x) for x in values):
        raise MemoryValidationError("embedding contains NaN or infinity")
    if max(map(abs, values)) > _FLOAT32_MAX:
        raise MemoryValidationError("embedding has a component beyond the float32 range")
    return values


def vector_literal(vector: Sequence[float]) -> str:
    """A vector as pgvector's text form, for a ``%s::public.vector`` parameter."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


@dataclass(frozen=True)
class _Vector:
    """A checked embedding, as the parameters the extraction queries take."""

    model_id: str
    dims: int
    param: PgVector

    @classmethod
    def of(cls, embedding: Sequence[float] | None, model_id: str | None) -> _Vector | None:
        if embedding is None:
            return None
        values = check_vector(embedding)
        return cls(_checked_model_id(model_id), len(values), PgVector(values))


def _checked_model_id(model_id: str | None) -> str:
    """The model id an embedding names: a non-empty string PostgreSQL can store
    (a NUL in it is the caller's input, not a failure of the store)."""
    if not model_id:
        raise MemoryValidationError("an embedding needs the model_id that produced it")
    check_text(model_id, "model_id")
    return model_id


def _vector_params(vector: _Vector | None) -> dict[str, Any]:
    if vector is None:
        return {"model_id": None, "dims": None, "embedding": None}
    return {"model_id": vector.model_id, "dims": vector.dims, "embedding": vector.param}


def _restatement(row: dict[str, Any]) -> FactResult:
    """The gate's verdict: the fact restates ``restatement_of``; nothing was written."""
    nearest = NearestMemory(str(row["restatement_of"]), float(row["restatement_similarity"]))
    return FactResult(memory=None, created=False, restatement_of=nearest)


def job_write_guards(owner: MemoryOwner, turn_id: int) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The statements a queued job's write sends first, in its transaction: the lock of
    ``owner``'s session (``job_write_lock``; harbor.erase takes it before deleting
    anything), then, in a statement of its own and so seeing whatever an erasure that
    held the lock committed, that the turn ``turn_id`` is still there
    (``job_turn_present``: no_data_found, and nothing written, when it is not)."""
    key = {"tenant_id": owner.tenant_id, "user_id": owner.user_id, "session_id": owner.session_id}
    return (
        (query("job_write_lock"), key),
        (query("job_turn_present"), {"turn_id": turn_id}),
    )


def observation_write_guards(
    owner: MemoryOwner, read_ids: Sequence[str]
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The statements an observation's write sends first, in its transaction: the lock of
    ``owner``'s user (``job_user_lock``; harbor.erase of the user takes it before deleting
    anything), then, in a statement of its own and so seeing whatever an erasure that
    held the lock committed, that the memories it was written from are all still stored
    (``job_memories_present``: no_data_found, and nothing written, when one is not)."""
    return (
        (query("job_user_lock"), {"tenant_id": owner.tenant_id, "user_id": owner.user_id}),
        (query("job_memories_present"), {"ids": list(read_ids)}),
    )


def _observed_ids(memory: Memory) -> list[str] | None:
    """The ids an observation was written from (``metadata["observed_ids"]``), else None."""
    read = memory.metadata.get("observed_ids")
    if memory.memory_type is not MemoryType.OBSERVATION or not isinstance(read, list):
        return None
    return [str(i) for i in read]


def _fact_params(owner: MemoryOwner, memory: Memory) -> dict[str, Any]:
    """``memory_params`` for the extraction writes, which only touch the caller's own scopes."""
    if memory.scope in ELEVATED_SCOPES:
        raise MemoryScopeError("extraction writes only the caller's own scopes")
    return memory_params(owner, memory)


def _distinct_id_runs(params: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """``params`` cut into runs (start, end) in which no given memory id repeats: one
    ``save_memories`` call matches its inserted rows to its input by id."""
    runs: list[tuple[int, int]] = []
    start, seen = 0, set[tuple[str, str]]()
    for k, p in enumerate(params):
        key = (p["tenant_id"], p["id"])
        if p["id"] is not None and key in seen:
            runs.append((start, k))
            start, seen = k, set()
        if p["id"] is not None:
            seen.add(key)
    runs.append((start, len(params)))
    return runs


def _batch_params(
    params: Sequence[dict[str, Any]],
    vectors: Sequence[MemoryVectors | None],
    model_id: str | None,
) -> dict[str, Any]:
    """The array parameters of ``save_memories`` (one element per memory): the text
    and jsonb arrays, and the starts of validity when all carry a time zone, in binary
    form (:class:`~harbor_pg.db.vectors.BinaryArray`; the enum, real and small jsonb
    arrays cost no more as text)."""

    def column(name: str) -> list[Any]:
        return [p[name] for p in params]

    def binary(name: str) -> BinaryArray:
        return BinaryArray([p[name] for p in params])

    return {
        "tenant_ids": binary("tenant_id"),
        "ids": binary("id"),
        "scopes": column("scope"),
        "project_ids": binary("project_id"),
        "user_ids": binary("user_id"),
        "session_ids": binary("session_id"),
        "run_ids": binary("run_id"),
        "principal_ids": binary("principal_id"),
        "memory_types": column("memory_type"),
        "importances": column("importance"),
        "contents": binary("content"),
        "content_hashes": binary("content_hash"),
        "contexts": binary("context"),
        "entity_ids": [Jsonb(p["entity_ids"]) for p in params],
        "sources": binary("source"),
        "sensitivities": column("sensitivity"),
        "source_session_ids": binary("source_session_id"),
        "source_message_ids": [Jsonb(p["source_message_ids"]) for p in params],
        "metadata": binary("metadata"),
        "valid_froms": _starts(column("valid_from")),
        "expires_ats": column("expires_at"),
        "embeddings": PgVectorArray([v.content if v else None for v in vectors]),
        "context_embeddings": PgVectorArray([v.with_context if v else None for v in vectors]),
        "model_id": model_id or "",
    }


def _starts(starts: list[datetime | None]) -> list[Any]:
    """A batch's starts of validity as the ``timestamptz[]`` parameter: in binary form
    when all carry a time zone; else each as its ISO text, which the server reads with
    its offset, or without one in the session's time zone. (psycopg dumps a list's
    elements by its first one's dumper: a start with a time zone after a naive one
    lost its offset.)"""
    if all(v is None or v.utcoffset() is not None for v in starts):
        return BinaryArray(starts)
    return [None if v is None else v.isoformat() for v in starts]


def _one_params(
    params: dict[str, Any], vectors: MemoryVectors | None, model_id: str | None
) -> dict[str, Any]:
    """The parameters of ``save_memory``: ``memory_params`` and the memory's vectors."""
    return {
        **params,
        "embedding": PgVector(vectors.content) if vectors else None,
        "context_embedding": (
            PgVector(vectors.with_context) if vectors and vectors.with_context else None
        ),
        "model_id": model_id or "",
    }


def _delegated_save_params(
    owner: MemoryOwner,
    params: dict[str, Any],
    vectors: MemoryVectors | None,
    model_id: str | None,
) -> dict[str, Any]:
    """The parameters of ``save_memory_delegated``: ``save_memory``'s, and the caller's
    identity, which the call carries (the worker checks it against the caller's)."""
    return {**_one_params(params, vectors, model_id), **carried_identity(owner, "caller_")}


def _save_results(rows: Sequence[dict[str, Any]]) -> list[SaveResult]:
    """The results of a save from its rows: each the stored memory's columns (typed by
    the database, which checked them on the way in: not validated again, 15 us a save)
    and whether this call created it."""
    return [SaveResult(memory=_stored_memory(r), created=bool(r["created"])) for r in rows]


def _dedup_key(params: dict[str, Any]) -> tuple[str, ...]:
    """What the unique index on current duplicates compares (owner key and content
    hash) of a memory's ``memory_params``: the order a batch locks its rows in."""
    return tuple(
        str(params[name] or "")
        for name in (
            "tenant_id",
            "scope",
            "project_id",
            "user_id",
            "session_id",
            "run_id",
            "content_hash",
        )
    )


class MemoryVectors(NamedTuple):
    """The vectors of one memory for one model: of its content, and of its
    context followed by its content (only for a memory with a context)."""

    content: list[float]
    with_context: list[float] | None = None


def _checked_vectors(
    memory: Memory,
    embedding: Sequence[float] | None,
    context_embedding: Sequence[float] | None,
    model_id: str | None,
) -> MemoryVectors | None:
    if embedding is None:
        if context_embedding is not None:
            raise MemoryValidationError("a context embedding needs the content embedding too")
        return None
    _checked_model_id(model_id)
    content = check_vector(embedding)
    if context_embedding is None:
        return MemoryVectors(content)
    if not (memory.context and memory.context.strip()):
        raise MemoryValidationError("a context embedding was given for a memory without context")
    with_context = check_vector(context_embedding)
    if len(with_context) != len(content):
        raise MemoryValidationError(
            f"the context embedding has {len(with_context)} dimensions,"
            f" the content embedding {len(content)}"
        )
    return MemoryVectors(content, with_context)


# Its methods repeat the signatures of tiers/base.py's protocols on purpose (as the
# in-process store does): each store implements them.
class PostgresLongTermStore:
    """Memories in ``harbor.memories`` (+ ``harbor.memory_embeddings``)."""

    #: the SQL function that answers :meth:`recall` (recall's telemetry names it)
    recall_procedure = "harbor.recall"

    def __init__(self, db: Database) -> None:
        self.db = db
        # the hit counts being written after their recalls returned (drain_hits waits)
        self._hit_writes: set[asyncio.Task[None]] = set()
        # on a distributed database: a search or a read by id found that global memories
        # may exist (the delegated call's marker row, sql/citus/global.sql)
        self._global_memories = False

    async def recall(self, owner: MemoryOwner, request: RecallRequest) -> list[RecalledMemory]:
        """``harbor.recall()`` as ``owner``: hybrid candidates, fused and ranked in
        SQL with every signal, in one round trip. With importance decay on, the hits
        are counted afterwards, in a transaction of their own that the caller does not
        wait for (``harbor.record_hits()``): recall itself writes nothing."""
        found = await recall_in_one_round_trip(self.db, owner, request)
        if request.importance_half_life_hours is not None and found:
            task = asyncio.create_task(self._write_hits(owner, [r.memory.id or "" for r in found]))
            self._hit_writes.add(task)
            task.add_done_callback(self._hit_writes.discard)
        return found

    async def _write_hits(self, owner: MemoryOwner, memory_ids: list[str]) -> None:
        try:
            await self.record_hits(owner, memory_ids)
        except Exception as exc:  # a lost count only ages a memory sooner: never fatal
            log.warning("recall: counting %d hits failed: %s", len(memory_ids), exc)

    async def record_hits(self, owner: MemoryOwner, memory_ids: Sequence[str]) -> int:
        """Count one recall hit for each memory of ``memory_ids`` the owner may see
        (``harbor.record_hits()``); returns how many."""
        ids = list(memory_ids)
        if self.db.set_local and owner.tenant_id:
            # a distributed database: one call that Citus delegates to the tenant's worker
            # (the identity as its arguments), counting the tenant's memories; the ids it
            # did not count, only while GLOBAL memories may exist (their shard may be
            # another worker's), are counted in the coordinator's transaction
            [row] = await self.db.fetch_delegated(
                query("record_hits_delegated"), {**carried_identity(owner), "ids": ids}
            )
            counted = int(row["counted"])
            if row["uncounted"]:
                rest = await self.db.fetch_in_one_round_trip(
                    owner, query("record_hits"), {"ids": list(row["uncounted"])}
                )
                counted += int(rest[0]["counted"])
            return counted
        rows = await self.db.fetch_in_one_round_trip(owner, query("record_hits"), {"ids": ids})
        return int(rows[0]["counted"])

    async def drain_hits(self) -> None:
        """Wait until the hit counts of the recalls so far are written."""
        while self._hit_writes:
            await asyncio.gather(*list(self._hit_writes), return_exceptions=True)

    async def save(
        self,
        owner: MemoryOwner,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
        *,
        context_embedding: Sequence[float] | None = None,
    ) -> SaveResult:
        """Save ``memory`` with the vector of its content (``embedding``) and,
        for a memory with a ``context``, the vector of the context followed by
        the content (``context_embedding``), both of ``model_id``."""
        vectors = _checked_vectors(memory, embedding, context_embedding, model_id)
        return await self.save_embedded(owner, memory, vectors, model_id)

    async def save_embedded(
        self,
        owner: MemoryOwner,
        memory: Memory,
        vectors: MemoryVectors | None,
        model_id: str | None,
    ) -> SaveResult:
        """:meth:`save` with the memory's vectors already checked (finite numbers, the
        context's only for a memory with a context, of one length): an embedder's
        output after :func:`~harbor_pg.embedders.base.normalize_vector`. The model id
        is checked here."""
        if vectors is not None:
            _checked_model_id(model_id)
        admin = memory.scope in ELEVATED_SCOPES
        read = _observed_ids(memory)
        with_context = vectors is not None and vectors.with_context is not None
        if read is not None and not admin and owner.user_id and not with_context:
            # an observation: written only while the facts it read are stored, fenced
            # against an erasure of its user (observation_write_guards)
            embedding = vectors.content if vectors is not None else None
            fact = await self.add_fact(owner, memory, embedding=embedding, model_id=model_id)
            assert fact.memory is not None
            return SaveResult(memory=fact.memory, created=fact.created)
        [result] = await self.db.retrying(
            lambda: self._save_batch(
                owner, [memory_params(owner, memory)], [vectors], model_id, admin=admin
            )
        )
        return result

    async def save_many(
        self,
        owner: MemoryOwner,
        memories: Sequence[Memory],
        vectors: Sequence[Sequence[float]] | None = None,
        model_id: str | None = None,
        *,
        context_vectors: Sequence[Sequence[float] | None] | None = None,
    ) -> list[SaveResult]:
        """Save ``memories`` (with their ``vectors``) in one transaction, all or nothing.

        ``vectors[i]`` is the vector of ``memories[i]``'s content and
        ``context_vectors[i]`` (optional) that of its context followed by its
        content. Memories of the elevated scopes (TENANT, GLOBAL) are written
        by the elevated role and the others by the application role, so one
        batch holds only one kind. The batch is one statement (``save_memories``),
        sent with the identity in one round trip.
        """
        for given in (vectors, context_vectors):
            if given is not None and len(given) != len(memories):
                raise MemoryValidationError(
                    f"{len(memories)} memories but {len(given)} vectors were given"
                )
        checked = [
            _checked_vectors(
                memory,
                vectors[i] if vectors is not None else None,
                context_vectors[i] if context_vectors is not None else None,
                model_id,
            )
            for i, memory in enumerate(memories)
        ]
        return await self.save_many_embedded(owner, memories, checked, model_id)

    async def save_many_embedded(
        self,
        owner: MemoryOwner,
        memories: Sequence[Memory],
        vectors: Sequence[MemoryVectors | None] | None,
        model_id: str | None,
    ) -> list[SaveResult]:
        """:meth:`save_many` with each memory's vectors already checked, as
        :meth:`save_embedded` takes them (``vectors[i]`` those of ``memories[i]``, None
        for none): an embedder's output after
        :func:`~harbor_pg.embedders.base.normalize_vector`, not checked again (23 us a
        vector). The model id is checked here."""
        checked: Sequence[MemoryVectors | None] = (
            [None] * len(memories) if vectors is None else vectors
        )
        if len(checked) != len(memories):
            raise MemoryValidationError(
                f"{len(memories)} memories but {len(checked)} vectors were given"
            )
        if any(v is not None for v in checked):
            _checked_model_id(model_id)
        kinds = {m.scope in ELEVATED_SCOPES for m in memories}
        if len(kinds) > 1:
            raise MemoryValidationError(
                "a batch cannot mix TENANT/GLOBAL memories with narrower ones"
            )
        if not memories:
            return []
        admin = kinds == {True}
        # rows are locked in one order, that of the dedup key, so two batches of the
        # same facts in different orders cannot deadlock; a deadlock or serialization
        # failure that still happens rolls the batch back and it runs again
        # (each memory's parameters made once: they were made again for the statement,
        # 17 us a memory)
        params = [memory_params(owner, m) for m in memories]
        order = sorted(range(len(memories)), key=lambda i: _dedup_key(params[i]))
        saved = await self.db.retrying(
            lambda: self._save_batch(
                owner,
                [params[i] for i in order],
                [checked[i] for i in order],
                model_id,
                admin=admin,
            )
        )
        results: list[SaveResult | None] = [None] * len(memories)
        for i, result in zip(order, saved, strict=True):
            results[i] = result
        return [r for r in results if r is not None]

    async def _save_batch(
        self,
        owner: MemoryOwner,
        params: Sequence[dict[str, Any]],
        vectors: Sequence[MemoryVectors | None],
        model_id: str | None,
        *,
        admin: bool,
    ) -> list[SaveResult]:
        """Save the memories of ``params`` (their ``memory_params``, in the order given)
        in one transaction: ``save_memory`` for one memory, else ``save_memories`` once,
        or once per run of distinct ids when an id repeats; then look up, in a
        transaction of its own, any duplicate the statement could not see."""
        if self.db.set_local and len(params) == 1 and not admin:
            # one memory of the caller's own tenant: one call that Citus delegates to the
            # tenant's worker, the identity its arguments (sql/citus/save.sql)
            rows = await self.db.fetch_delegated(
                query("save_memory_delegated"),
                _delegated_save_params(owner, params[0], vectors[0], model_id),
            )
            return _save_results(rows)
        if self.db.set_local and not admin:
            # a batch of the caller's own tenant: one call that Citus delegates to the
            # tenant's worker, which saves each memory as the call above does, in the
            # call's one transaction (sql/citus/save.sql)
            rows = await self.db.fetch_delegated(
                query("save_memories_delegated"),
                {
                    **_batch_params(params, vectors, model_id),
                    **carried_identity(owner, "caller_"),
                },
            )
            return _save_results(rows)
        if self.db.set_local and all(p["scope"] == MemoryScope.TENANT.value for p in params):
            # TENANT memories, the elevated role's, of the caller's tenant: one call that
            # Citus delegates to the tenant's worker, as the application role's batch
            # above (sql/citus/save.sql)
            rows = await self.db.fetch_delegated(
                query("save_tenant_memories_delegated"),
                {
                    **_batch_params(params, vectors, model_id),
                    **carried_identity(owner, "caller_"),
                },
                admin=True,
            )
            return _save_results(rows)
        if self.db.set_local:
            # Citus refuses save_memories (a correlated subquery over a CTE): on a
            # distributed database a batch with GLOBAL memories is saved by the per-row
            # statements, in a transaction that sets the flag that they may exist
            async with self.db.transaction(owner, admin=admin) as conn:
                if any(p["tenant_id"] == "" for p in params):
                    # a GLOBAL memory: the flag that they may exist set first, in this
                    # transaction, so that searches read them (sql/citus/global.sql)
                    await _note_global_memories(conn)
                return [
                    await self._save_one(conn, owner, p, v, model_id)
                    for p, v in zip(params, vectors, strict=True)
                ]
        chunks = _distinct_id_runs(params)
        if len(params) == 1 and not admin:
            # one memory: save_memories' rules with a parameter a value (save_memory),
            # under the generic plan as below (about 0.1 ms less server CPU and 0.1 ms
            # less client CPU a save than the arrays of a batch of one)
            rows = await self.db.fetch_in_one_round_trip(
                owner,
                query("save_memory"),
                _one_params(params[0], vectors[0], model_id),
                plan_cache_mode="force_generic_plan",
            )
        elif len(chunks) == 1 and not admin:
            # the generic plan, planned once a connection: for one memory the server
            # would otherwise plan the statement on every call (its custom plans look
            # cheaper than the generic one), half of a save's time; a batch of 1,000
            # ran no faster with a plan for its size (benchmarks/RESULTS.md, ingest)
            rows = await self.db.fetch_in_one_round_trip(
                owner,
                query("save_memories"),
                _batch_params(params, vectors, model_id),
                plan_cache_mode="force_generic_plan",
            )
        else:
            rows = []
            async with self.db.transaction(owner, admin=admin) as conn:
                for start, end in chunks:
                    cur = await conn.execute(
                        query("save_memories"),
                        _batch_params(params[start:end], vectors[start:end], model_id),
                    )
                    rows.extend(await cur.fetchall())
        unseen = [k for k, row in enumerate(rows) if row["id"] is None]
        if unseen and await self._close_expired(owner, [params[k] for k in unseen], admin=admin):
            # a duplicate past its expiry was in the way, closed now: those memories
            # are saved again (the rare path: a store that never sets an expiry pays
            # nothing for it)
            async with self.db.transaction(owner, admin=admin) as conn:
                cur = await conn.execute(
                    query("save_memories"),
                    _batch_params(
                        [params[k] for k in unseen], [vectors[k] for k in unseen], model_id
                    ),
                )
                for k, row in zip(unseen, await cur.fetchall(), strict=True):
                    rows[k] = row
            unseen = [k for k in unseen if rows[k]["id"] is None]
        if unseen:
            found = await self._duplicates(owner, [params[k] for k in unseen], admin=admin)
            for k, row in zip(unseen, found, strict=True):
                rows[k] = row
        return _save_results(rows)

    async def _save_one(
        self,
        conn: Connection,
        owner: MemoryOwner,
        params: dict[str, Any],
        vectors: MemoryVectors | None,
        model_id: str | None,
    ) -> SaveResult:
        """Save one memory with the per-row statements (the Citus path of save_many):
        each statement names the memory's tenant, so each goes whole to its worker
        (``sql/queries/citus.sql``)."""
        memory_id, created = await self.save_in(conn, params, distributed=True)
        if created and vectors is not None:
            tenant = str(params["tenant_id"])
            await self.insert_embedding(conn, tenant, memory_id, vectors.content, model_id or "")
            if vectors.with_context is not None:
                await self.insert_embedding(
                    conn, tenant, memory_id, vectors.with_context, model_id or "", True
                )
        cur = await conn.execute(
            query("get_memory_citus"), {"tenant_id": params["tenant_id"], "id": memory_id}
        )
        saved = await cur.fetchone()
        assert saved is not None
        return SaveResult(memory=memory_from_row(saved), created=created)

    async def _close_expired(
        self, owner: MemoryOwner, params: Sequence[dict[str, Any]], *, admin: bool
    ) -> int:
        """Close the current duplicates of these memories that are past their expiry
        (``close_expired_duplicates``); how many it closed."""

        def column(name: str) -> list[Any]:
            return [p[name] for p in params]

        async with self.db.transaction(owner, admin=admin) as conn:
            cur = await conn.execute(
                query("close_expired_duplicates"),
                {
                    "tenant_ids": column("tenant_id"),
                    "scopes": column("scope"),
                    "project_ids": column("project_id"),
                    "user_ids": column("user_id"),
                    "session_ids": column("session_id"),
                    "run_ids": column("run_id"),
                    "content_hashes": column("content_hash"),
                },
            )
            return len(await cur.fetchall())

    async def _duplicates(
        self, owner: MemoryOwner, params: Sequence[dict[str, Any]], *, admin: bool
    ) -> list[dict[str, Any]]:
        """The currently valid rows that blocked these inserts, read in a new snapshot
        (a concurrent writer's, committed after the insert's statement began)."""
        found = []
        async with self.db.transaction(owner, admin=admin) as conn:
            for p in params:
                dup = await (await conn.execute(query("find_current_duplicate"), p)).fetchone()
                if dup is None:  # the conflict was with a row this caller cannot see
                    raise MemoryValidationError(
                        "a conflicting memory exists that this caller cannot see"
                    )
                cur = await conn.execute(
                    query("get_memory"), {"tenant_id": owner.tenant_id, "id": dup["id"]}
                )
                row = await cur.fetchone()
                assert row is not None
                found.append({**row, "created": False})
        return found

    @staticmethod
    async def save_in(
        conn: Connection, params: dict[str, Any], *, distributed: bool = False
    ) -> tuple[str, bool]:
        """Insert, or find the currently valid duplicate: (id, created).

        ``distributed``: the statements of a distributed database (``sql/queries/citus.sql``),
        each naming the memory's tenant so that it goes whole to its worker: the insert,
        and only when a duplicate is in the way, the close of one past its expiry and the
        insert again (a store that never sets an expiry never takes that path)."""
        insert = query("insert_memory_citus" if distributed else "insert_memory")
        row = await (await conn.execute(insert, params)).fetchone()
        if row is None and distributed:
            closed = await conn.execute(query("close_expired_duplicate_citus"), params)
            if closed.rowcount:
                row = await (await conn.execute(insert, params)).fetchone()
        if row is not None:
            return str(row["id"]), True
        dup = await (await conn.execute(query("find_current_duplicate"), params)).fetchone()
        if dup is None:  # pragma: no cover - the conflict was with a row we cannot see
            raise MemoryValidationError("a conflicting memory exists that this caller cannot see")
        return str(dup["id"]), False

    @staticmethod
    async def insert_embedding(
        conn: Connection,
        tenant_id: str,
        memory_id: str,
        vector: list[float],
        model_id: str,
        with_context: bool = False,
    ) -> None:
        await conn.execute(
            query("insert_embedding"),
            {
                "tenant_id": tenant_id,
                "memory_id": memory_id,
                "model_id": model_id,
                "dims": len(vector),
                "embedding": PgVector(vector),
                "with_context": with_context,
            },
        )

    async def expire_memories(self, owner: MemoryOwner) -> int:
        """Close the memories past their expiry that ``owner`` may write
        (``harbor.expire_memories()`` as the application role); returns how many."""
        if self.db.set_local and owner.tenant_id:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/expire.sql)
            rows = await self.db.fetch_delegated(
                query("expire_memories_delegated"), carried_identity(owner)
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("expire_memories"), {})
        return int(rows[0]["closed"])

    async def expire_every_tenant(self) -> int:
        """Close every tenant's memories past their expiry (the periodic upkeep: the
        elevated role with no identity, policy ``memories_admin_expire``)."""
        async with self.db.transaction(None, admin=True) as conn:
            row = await (await conn.execute(query("expire_memories"))).fetchone()
        return int(row["closed"]) if row else 0

    async def get(self, owner: MemoryOwner, memory_id: str) -> Memory | None:
        if self.db.set_local:
            # one call delegated to the tenant's worker, then, only when that finds
            # nothing and says that global memories may exist (its marker row,
            # sql/citus/get.sql), the global memories' shard (get_memory reads both
            # tenants at once, a statement Citus sends to two shards, often on two workers)
            rows, may_exist = await self._get_delegated(owner, [memory_id])
            if not rows and may_exist:
                rows = await self._get_global([memory_id])
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("get_memory"), {"tenant_id": owner.tenant_id, "id": memory_id}
            )
        return memory_from_row(rows[0]) if rows else None

    async def get_many(self, owner: MemoryOwner, memory_ids: Sequence[str]) -> list[Memory]:
        """The memories of ``memory_ids`` that ``owner`` may see, in no particular order,
        in one statement (on a distributed database, the tenant's in one delegated call,
        then the global ones in one routed statement only when that call says some may
        exist; once told so, the store sends the two at once)."""
        if not memory_ids:
            return []
        ids = list(memory_ids)
        if self.db.set_local:
            # as a search does (below): the global memories read only when the delegated
            # call's marker row says they may exist, and, once a call said so, at once
            # with it, on two connections (the flag stays set once one was written; were
            # it unset, the second statement would only find none)
            if self._global_memories or not owner.tenant_id:
                (own, _may_exist), shared = await asyncio.gather(
                    self._get_delegated(owner, ids), self._get_global(ids)
                )
            else:
                own, may_exist = await self._get_delegated(owner, ids)
                shared = await self._get_global(ids) if may_exist else []
            rows = own + shared
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("get_memories"), {"tenant_id": owner.tenant_id, "ids": ids}
            )
        return [memory_from_row(r) for r in rows]

    async def _get_delegated(
        self, owner: MemoryOwner, ids: list[str]
    ) -> tuple[list[dict[str, Any]], bool]:
        """The caller's tenant's memories of ``ids`` on a distributed database: one call
        Citus delegates to the tenant's worker, the identity its arguments
        (sql/citus/get.sql); and whether global memories may exist (its marker row, left
        out of the rows). With no tenant, no call: only global memories can answer."""
        if not owner.tenant_id:
            return [], True
        rows = await self.db.fetch_delegated(
            query("get_memories_delegated"), {**carried_identity(owner), "ids": ids}
        )
        own = [r for r in rows if r["id"] is not None]
        if len(own) < len(rows):
            self._global_memories = True
            return own, True
        return own, False

    async def _get_global(self, ids: list[str]) -> list[dict[str, Any]]:
        """The global memories of ``ids`` on a distributed database: one statement routed
        to their shard, which any caller may read."""
        return await self.db.fetch_delegated(query("get_global_memories"), {"ids": ids})

    async def search(
        self,
        owner: MemoryOwner,
        query_text: str,
        *,
        limit: int = 10,
        as_of: datetime | None = None,
    ) -> list[Memory]:
        if not query_text.strip():
            return []
        params = {
            "tenant_id": owner.tenant_id,
            "query": query_text[:20000],
            "as_of": as_of,
            "limit": limit,
        }
        if self.db.set_local:
            # on a distributed database: the tenant's memories in one call that Citus
            # delegates to the tenant's worker (the identity as its arguments), and the
            # global ones from their shard's node only when that call says some may exist
            # (its marker row, sql/citus/search.sql); merged in the one server's order.
            # Once a search was told so, the store's later ones send the two at once, on
            # two connections, as before the flag (it stays set once a global memory was
            # written; were it unset, the second statement would only find none).
            delegated = self.db.fetch_delegated(
                query("search_delegated"), {**params, **carried_identity(owner)}
            )
            if self._global_memories:
                own, shared = await asyncio.gather(
                    delegated, self.db.fetch_delegated(query("search_global"), params)
                )
            else:
                own = await delegated
                shared = []
                if any(r["id"] is None for r in own):
                    self._global_memories = True
                    shared = await self.db.fetch_delegated(query("search_global"), params)
            own = [r for r in own if r["id"] is not None]
            rows = _in_search_order(own + shared)[:limit]
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("search_memories"), params)
        return [memory_from_row(r) for r in rows]

    # -- extraction (ExtractionStore) ------------------------------------------------

    async def consolidate(
        self, owner: MemoryOwner, request: ConsolidationRequest
    ) -> ConsolidationReport:
        """Merge the owner's near-duplicates (``harbor.consolidate_memories()``, one round
        trip and one transaction; ConsolidatingStore)."""
        scopes = [s.value for s in request.scopes if owner.can_address(s)]
        if not scopes:
            return ConsolidationReport()
        params = {
            "scopes": scopes,
            "min_similarity": request.min_similarity,
            "model_id": request.model_id,
            "max_merges": request.max_merges,
            "dry_run": request.dry_run,
            "since": request.since,
            "merged": None
            if request.merged is None
            else Jsonb(
                {
                    head: {
                        "content": text.content,
                        "content_hash": text.content_hash,
                        **(
                            {"embedding": vector_literal(check_vector(text.embedding))}
                            if text.embedding is not None
                            else {}
                        ),
                    }
                    for head, text in request.merged.items()
                }
            ),
        }
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/consolidate.sql)
            rows = await self.db.fetch_delegated(
                query("consolidate_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("consolidate"), params)
        written = request.merged or {}
        return ConsolidationReport(
            merges=tuple(
                Merge(
                    successor_id=r["successor_id"],
                    merged_ids=tuple(r["merged_ids"]),
                    matched_by=r["matched_by"],
                    content=r["content"],
                    written=r["successor_id"] is not None
                    and r["merged_ids"][0] in written
                    and written[r["merged_ids"][0]].content == r["content"],
                )
                for r in rows
            )
        )

    async def profile(self, owner: MemoryOwner, request: ProfileRequest) -> UserProfile:
        """The owner's profile (``harbor.profile()``, one round trip; ProfileStore)."""
        scopes = [s for s in request.scopes if owner.can_address(s)]
        if not scopes:
            return UserProfile()
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/profile.sql)
            rows = await self.db.fetch_delegated(
                query("profile_delegated"),
                {**profile_params(request, scopes), **carried_identity(owner)},
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("profile"), profile_params(request, scopes)
            )
        sections: dict[str, list[ProfileEntry]] = {"stable": [], "recent": []}
        for row in rows:
            sections[row["section"]].append(
                ProfileEntry(memory=memory_from_row(row), rank=row["rank"], tokens=row["tokens"])
            )
        return UserProfile(stable=tuple(sections["stable"]), recent=tuple(sections["recent"]))

    async def current_memories(
        self, owner: MemoryOwner, scopes: Sequence[MemoryScope], *, limit: int
    ) -> list[Memory]:
        """The owner's currently valid memories in ``scopes``, newest first (ExtractionStore)."""
        params = current_memories_params(owner, scopes, limit)
        if params is None:
            return []
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/current.sql)
            rows = await self.db.fetch_delegated(
                query("current_memories_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("extraction_current_memories"), params
            )
        return [memory_from_row(r) for r in rows]

    async def nearest_in_scope(
        self,
        owner: MemoryOwner,
        scope: MemoryScope,
        embedding: Sequence[float],
        model_id: str,
        *,
        exclude_ids: Sequence[str] = (),
    ) -> NearestMemory | None:
        """The owner's most similar currently valid memory of ``scope`` (ExtractionStore).

        Exact cosine similarity in SQL over the owner's own vectors of
        ``model_id``, read as the invoker under row-level security.
        """
        vector = _Vector.of(embedding, model_id)
        assert vector is not None
        scope = MemoryScope(scope)
        params = {
            **owner.key(scope),
            "scope": scope.value,
            **_vector_params(vector),
            "exclude_ids": list(exclude_ids),
        }
        rows = await self.db.fetch_in_one_round_trip(
            owner, query("extraction_nearest_memory"), params
        )
        if not rows:
            return None
        return NearestMemory(str(rows[0]["memory_id"]), float(rows[0]["similarity"]))

    async def supersede(
        self,
        owner: MemoryOwner,
        memory_id: str,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
    ) -> SaveResult | None:
        """Store ``memory`` as the successor of ``memory_id`` in one transaction (ExtractionStore).

        One statement locks the old row, inserts the new one with its vector
        and closes the old interval; see ``extraction_supersede_memory``. Only
        the caller's own scopes (PROJECT, USER, SESSION, RUN) can be superseded.
        """
        params = _fact_params(owner, memory)
        write = {
            **params,
            **_vector_params(_Vector.of(embedding, model_id)),
            "replaces": memory_id,
            "dedup_threshold": None,  # no similarity gate
            "exclude_ids": [],
        }
        read = _observed_ids(memory)
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the guards with it (sql/citus/fact.sql); None: not decided there
            delegated = await self._fact_delegated(
                owner, write, insert_if_gone=False, turn_id=None, read_ids=read
            )
            if delegated is not None:
                if not delegated["found"]:
                    return None
                return await self._delegated_saved(owner, params, delegated)
        [row] = await self.db.fetch_in_one_round_trip(
            owner,
            query("extraction_supersede_memory"),
            write,
            guards=observation_write_guards(owner, read) if read is not None else (),
        )
        return await self._superseded(owner, params, row)

    async def close_memory(self, owner: MemoryOwner, memory_id: str, scope: MemoryScope) -> bool:
        """End a current memory's validity now, with no successor (ObservationStore;
        ``close_memory``)."""
        if scope in ELEVATED_SCOPES:
            raise MemoryScopeError("close_memory closes only the caller's own scopes")
        key = owner.key(scope)
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/close.sql)
            rows = await self.db.fetch_delegated(
                query("close_memory_delegated"),
                {
                    **carried_identity(owner),
                    **{f"key_{f}": v for f, v in key.items() if f != "tenant_id"},
                    "scope": scope.value,
                    "id": memory_id,
                },
            )
            return bool(rows)
        params = {**key, "scope": scope.value, "id": memory_id}
        rows = await self.db.fetch_in_one_round_trip(owner, query("close_memory"), params)
        return bool(rows)

    async def add_fact(
        self,
        owner: MemoryOwner,
        memory: Memory,
        *,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
        dedup_threshold: float | None = None,
        replaces: str | None = None,
        for_turn: int | None = None,
    ) -> FactResult:
        """Similarity gate, then supersede or insert (ExtractionStore).

        The gate and the write are one statement, sent with the identity in one
        round trip and one transaction: one WAL flush per fact. Only a rare outcome
        costs a second trip: a fact whose content is already currently valid
        (the duplicate is read back), or a replaced memory that is gone (the fact
        is then inserted as new, gated again).

        ``for_turn``: the write is a queued job's, for the owner's turn of that id.
        Its transaction first takes the session's lock and then finds the turn still
        there (:func:`job_write_guards`); when the turn is gone (an erasure of its
        user, session or agent committed, which takes the same lock first) nothing is
        written and :class:`MemoryNotFoundError` is raised.
        """
        guards = job_write_guards(owner, for_turn) if for_turn is not None else ()
        read = _observed_ids(memory)
        if read is not None:
            guards = (*guards, *observation_write_guards(owner, read))
        params = _fact_params(owner, memory)
        vector = _Vector.of(embedding, model_id)
        gated = vector is not None and dedup_threshold is not None
        write = {
            **params,
            **_vector_params(vector),
            "dedup_threshold": dedup_threshold if gated else None,
            "exclude_ids": [replaces] if replaces else [],
        }
        if self.db.set_local:
            # a distributed database: the guards, the gate and the write in one call that
            # Citus delegates to the tenant's worker (sql/citus/fact.sql); None: not
            # decided there (an observation read a memory not on the tenant's shard)
            delegated = await self._fact_delegated(
                owner,
                {**write, "replaces": replaces},
                insert_if_gone=True,
                turn_id=for_turn,
                read_ids=read,
            )
            if delegated is not None:
                return await self._fact_result(owner, params, delegated, replaces)
        if replaces is not None:
            [row] = await self.db.fetch_in_one_round_trip(
                owner,
                query("extraction_supersede_memory"),
                {**write, "replaces": replaces},
                guards=guards,
            )
            if row["restatement_of"] is not None:
                return _restatement(row)
            result = await self._superseded(owner, params, row)
            if result is not None:
                return FactResult(
                    memory=result.memory,
                    created=result.created,
                    superseded=replaces if result.created else None,
                )
        [row] = await self.db.fetch_in_one_round_trip(
            owner, query("extraction_insert_memory"), write, guards=guards
        )
        if row["restatement_of"] is not None:
            return _restatement(row)
        if row["id"] is not None:
            return FactResult(memory=memory_from_row(row), created=True)
        return FactResult(memory=await self._duplicate(owner, params), created=False)

    async def _fact_delegated(
        self,
        owner: MemoryOwner,
        write: dict[str, Any],
        *,
        insert_if_gone: bool,
        turn_id: int | None,
        read_ids: list[str] | None,
    ) -> dict[str, Any] | None:
        """``add_fact_delegated``'s row for ``write`` (the parameters of
        ``extraction_supersede_memory``), or None when the call wrote nothing because an
        observation read a memory that is not on the tenant's shard (a GLOBAL one, or
        one erased): the coordinator's transaction then writes it."""
        key = {f: write[f] for f in ("project_id", "user_id", "session_id", "run_id")}
        [row] = await self.db.fetch_delegated(
            query("add_fact_delegated"),
            {
                **write,
                **carried_identity(owner),
                **{f"key_{f}": v for f, v in key.items()},
                "writer_id": write["principal_id"],
                "insert_if_gone": insert_if_gone,
                "turn_id": turn_id,
                "read_ids": read_ids,
            },
        )
        return None if row["global_read"] else row

    async def _fact_result(
        self, owner: MemoryOwner, params: dict[str, Any], row: dict[str, Any], replaces: str | None
    ) -> FactResult:
        """``add_fact``'s answer from ``add_fact_delegated``'s row, as the coordinator's
        statements give it."""
        if row["restatement_of"] is not None:
            return _restatement(row)
        saved = await self._delegated_saved(owner, params, row)
        superseded = replaces is not None and row["found"] and saved.created
        return FactResult(
            memory=saved.memory, created=saved.created, superseded=replaces if superseded else None
        )

    async def _delegated_saved(
        self, owner: MemoryOwner, params: dict[str, Any], row: dict[str, Any]
    ) -> SaveResult:
        """The memory ``add_fact_delegated`` wrote, or the currently valid duplicate that took
        its place (read back here when the call could not see it: as the coordinator's
        statements, :meth:`_duplicate` then raises)."""
        if row["id"] is None:
            return SaveResult(memory=await self._duplicate(owner, params), created=False)
        return SaveResult(memory=memory_from_row(row), created=bool(row["created"]))

    async def _superseded(
        self, owner: MemoryOwner, params: dict[str, Any], row: dict[str, Any]
    ) -> SaveResult | None:
        """What ``extraction_supersede_memory`` did: None when the replaced memory was
        not there to supersede; otherwise the successor, or the currently valid row
        with the same content when the successor was a duplicate."""
        if not row["found"]:
            return None
        if row["id"] is not None:
            return SaveResult(memory=memory_from_row(row), created=True)
        return SaveResult(memory=await self._duplicate(owner, params), created=False)

    async def _duplicate(self, owner: MemoryOwner, params: dict[str, Any]) -> Memory:
        """The currently valid row an insert collided with (same owner key and hash)."""
        async with self.db.transaction(owner) as conn:
            dup = await (await conn.execute(query("find_current_duplicate"), params)).fetchone()
            if dup is None:  # pragma: no cover - the conflict was with a row we cannot see
                raise MemoryValidationError(
                    "a conflicting memory exists that this caller cannot see"
                )
            row = await (
                await conn.execute(
                    query("get_memory"), {"tenant_id": params["tenant_id"], "id": dup["id"]}
                )
            ).fetchone()
        assert row is not None
        return memory_from_row(row)

    async def delete(self, owner: MemoryOwner, memory_id: str) -> bool:
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/delete.sql)
            rows = await self.db.fetch_delegated(
                query("delete_memory_delegated"), {**carried_identity(owner), "id": memory_id}
            )
            return bool(rows)
        async with self.db.transaction(owner) as conn:
            cur = await conn.execute(
                query("delete_memory"), {"tenant_id": owner.tenant_id, "id": memory_id}
            )
            return cur.rowcount > 0

    async def history(self, owner: MemoryOwner, memory_id: str) -> list[Memory]:
        """``memory_id``'s supersession chain as far as ``owner`` may see it, oldest first
        (empty when the memory is not visible)."""
        if self.db.set_local:
            # Citus plans its recursive CTEs only with one value of the distribution
            # column: the caller's tenant's chain, in one call delegated to the tenant's
            # worker (sql/citus/history.sql), else the global memories', which any caller
            # may read, in one statement routed to their shard
            rows = []
            if owner.tenant_id:
                rows = await self.db.fetch_delegated(
                    query("memory_history_delegated"),
                    {**carried_identity(owner), "id": memory_id},
                )
            if not rows:
                rows = await self.db.fetch_delegated(
                    query("memory_history"), {"tenants": [""], "id": memory_id}
                )
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner,
                query("memory_history"),
                {"tenants": ["", owner.tenant_id], "id": memory_id},
            )
        return [memory_from_row(r) for r in rows]

    async def load_summary(self, owner: MemoryOwner) -> Memory | None:
        """The newest valid SESSION/SUMMARY memory of ``owner``'s session (see SummaryStore)."""
        key = owner.key(MemoryScope.SESSION)
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/summary.sql)
            rows = await self.db.fetch_delegated(
                query("session_summary_delegated"), carried_identity(owner)
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("context_load_summary"), key)
        return memory_from_row(rows[0]) if rows else None

    async def save_summary(
        self, owner: MemoryOwner, memory: Memory, *, expected_frontier: int | None
    ) -> Memory | None:
        """Insert or refresh the session summary, compare-and-set on the frontier.

        Fenced by the newest turn it folded (``source_message_ids``), as a queued job's
        write is (:func:`job_write_guards`): a fold whose session was erased while its
        model answered saves nothing and raises :class:`MemoryNotFoundError`.
        """
        if memory.id is None:
            raise MemoryValidationError("a session summary needs its deterministic id")
        params = _summary_params(owner, memory, memory.id)
        expected = "" if expected_frontier is None else str(expected_frontier)
        folded = [int(i) for i in memory.source_message_ids if str(i).isdigit()]
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments, the same steps in its one transaction
            # (sql/citus/summary_write.sql)
            rows = await self.db.fetch_delegated(
                query("save_summary_delegated"),
                {
                    **params,
                    **carried_identity(owner),
                    "expected_frontier": expected,
                    "create": expected_frontier is None,
                    "turn_id": max(folded) if folded and owner.session_id is not None else None,
                },
            )
            return memory_from_row(rows[0]) if rows else None
        async with self.db.transaction(owner) as conn:
            if folded and owner.session_id is not None:
                for guard, guard_params in job_write_guards(owner, max(folded)):
                    await conn.execute(guard, guard_params)
            row = await (
                await conn.execute(
                    query("context_refresh_summary"), {**params, "expected_frontier": expected}
                )
            ).fetchone()
            if row is None and expected_frontier is None:
                # the database gives the row the id of its owner (harbor.summary_id), so a
                # conflict is this session's own summary, created by a concurrent writer
                row = await (await conn.execute(query("context_insert_summary"), params)).fetchone()
            if row is None:
                return None  # another writer refreshed (or created) it first
            stored = await (
                await conn.execute(
                    query("get_memory"), {"tenant_id": owner.tenant_id, "id": row["id"]}
                )
            ).fetchone()
        return memory_from_row(stored) if stored else None
