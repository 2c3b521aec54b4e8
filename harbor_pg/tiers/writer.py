"""Long-term memories in: validated, embedded and saved, one at a time or in batches.

Every memory is checked before anything is written (length, storable text, a
scope the caller can address, no credential unless allowed). When the store
keeps vectors (PostgreSQL) and an embedder is configured, a memory gets a
vector of its content and, with a context, one of context and content (see
:func:`~harbor_pg.records.embedding_texts`), all in one embedder call per batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from harbor_pg.credentials import secret_kind
from harbor_pg.embedders.base import Embedder, normalize_vector
from harbor_pg.errors import MemoryValidationError
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import (
    Memory,
    MemoryType,
    Sensitivity,
    embedding_texts,
    validate_source,
)
from harbor_pg.telemetry import traced
from harbor_pg.tiers.base import LongTermStore, SaveResult
from harbor_pg.tiers.facade import FacadeBase
from harbor_pg.tiers.long_term import ELEVATED_SCOPES, MemoryVectors, PostgresLongTermStore
from harbor_pg.validation import check_content, first_error

__all__ = ["LongTermWrites", "embed_memories"]

log = logging.getLogger("harbor_pg")


def with_expiry(memory: Memory, ttl_seconds: float | None) -> Memory:
    """``memory`` expiring ``ttl_seconds`` after it starts to hold (its ``valid_from``,
    else now); unchanged without a TTL. Refuses a TTL that is not a positive number, a
    TTL beside an ``expires_at``, and an expiry not after ``valid_from``."""
    if ttl_seconds is not None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
            raise MemoryValidationError("ttl_seconds must be a number of seconds")
        if not math.isfinite(ttl_seconds) or ttl_seconds <= 0:
            raise MemoryValidationError("ttl_seconds must be a positive, finite number")
        if memory.expires_at is not None:
            raise MemoryValidationError("give a memory expires_at or a ttl_seconds, not both")
        try:
            start = memory.valid_from or datetime.now(UTC)
            memory = memory.model_copy(
                update={"expires_at": start + timedelta(seconds=ttl_seconds)}
            )
        except OverflowError:
            raise MemoryValidationError("ttl_seconds is too large") from None
    if memory.expires_at is not None:
        if memory.expires_at.tzinfo is None:
            raise MemoryValidationError("expires_at must carry a time zone")
        if memory.valid_from is not None and memory.expires_at <= memory.valid_from:
            raise MemoryValidationError("expires_at must be after valid_from")
    return memory


async def embed_memories(
    embedder: Embedder, memories: Sequence[Memory]
) -> list[MemoryVectors] | None:
    """Vectors of ``memories`` (content, and context + content where there is a
    context) in one embedder call, or None with a WARNING on failure."""
    pairs = [embedding_texts(m) for m in memories]
    texts = [content for content, _ in pairs]
    texts += [with_context for _, with_context in pairs if with_context is not None]
    try:
        raw = await embedder.embed(texts)
        vectors = [
            normalize_vector(v, dimensions=embedder.dimensions, model_id=embedder.model_id)
            for v in raw
        ]
    except Exception as exc:
        log.warning(
            "embedding %d memories failed, saving them without vectors (lexical recall "
            "still finds them): %s",
            len(memories),
            exc,
        )
        return None
    extra = iter(vectors[len(pairs) :])
    return [
        MemoryVectors(vectors[i], next(extra) if with_context is not None else None)
        for i, (_, with_context) in enumerate(pairs)
    ]


class LongTermWrites(FacadeBase):
    """The facade's long-term writes (a mixin of :class:`~harbor_pg.manager.MemoryManager`)."""

    @traced(
        "harbor_pg.save",
        attributes=lambda self, caller, memory, **kw: {
            "harbor.memory.scope": memory.scope.value,
            "harbor.memory.type": memory.memory_type.value,
        },
        result=lambda r: {"harbor.memory.created": r.created},
    )
    async def save(
        self,
        caller: MemoryOwner,
        memory: Memory,
        *,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
        allow_secrets: bool = False,
        ttl_seconds: float | None = None,
    ) -> SaveResult:
        """Store a memory under ``caller`` narrowed to the memory's scope.

        Saving the same content twice in the same scope is a no-op that
        reports the existing memory (``created=False``). Content or context
        that looks like a credential (an API key, a stated password or PIN,
        ...; see :mod:`harbor_pg.extraction.secrets`) is refused with
        :class:`MemoryValidationError` naming the kind, unless
        ``allow_secrets=True``.

        A memory may expire: ``memory.expires_at``, or ``ttl_seconds`` after it
        starts to hold. From then on recall, search, the profile and the snapshot
        leave it out, as-of reads before its expiry still find it, and the store
        closes its interval at the expiry (kept as history, not deleted); saving
        the same content again after that saves it afresh. None (the default):
        it never expires.
        """
        self._check_caller(caller)
        self._wrote(caller)
        store = self._long()
        memory = with_expiry(memory, ttl_seconds)
        self._check_memory(caller, memory, allow_secrets=allow_secrets)
        embedder = self._vector_embedder(store)
        if embedding is None and embedder is not None:
            vectors = await embed_memories(embedder, [memory])
            if vectors is not None:
                assert isinstance(store, PostgresLongTermStore)
                # (normalized, so checked: not checked again)
                return await store.save_embedded(caller, memory, vectors[0], embedder.model_id)
        return await store.save(caller, memory, embedding, model_id)

    @traced(
        "harbor_pg.save_many",
        attributes=lambda self, caller, memories, **kw: {"harbor.save.count": len(memories)},
        result=lambda rs: {"harbor.save.created": sum(r.created for r in rs)},
    )
    async def save_many(
        self,
        caller: MemoryOwner,
        memories: Sequence[Memory],
        *,
        batch_size: int = 64,
        progress: Callable[[int, int], None] | None = None,
        allow_secrets: bool = False,
        ttl_seconds: float | None = None,
    ) -> list[SaveResult]:
        """Save many memories: embedded in batches, each batch one transaction.

        Every memory is validated before anything is written, so bad input
        writes nothing. On PostgreSQL a batch commits as a whole: a failure
        leaves the earlier batches saved and none of the failing one.
        ``progress(saved, total)`` is called after each batch. A memory that
        looks like a credential is refused as in :meth:`save` (``allow_secrets``);
        ``ttl_seconds`` gives each memory an expiry as in :meth:`save`.
        """
        self._check_caller(caller)
        self._wrote(caller)
        if batch_size < 1:
            raise MemoryValidationError("batch_size must be >= 1")
        store = self._long()
        memories = [with_expiry(m, ttl_seconds) for m in memories]
        for memory in memories:
            self._check_memory(caller, memory, allow_secrets=allow_secrets)
        embedder = self._vector_embedder(store)
        results: list[SaveResult] = []
        total = len(memories)
        for start in range(0, total, batch_size):
            batch = list(memories[start : start + batch_size])
            vectors = await embed_memories(embedder, batch) if embedder is not None else None
            model_id = embedder.model_id if vectors is not None and embedder else None
            one_role = len({m.scope in ELEVATED_SCOPES for m in batch}) == 1
            if isinstance(store, PostgresLongTermStore):
                # (normalized, so checked: not checked again, as in save)
                if one_role:
                    results.extend(await store.save_many_embedded(caller, batch, vectors, model_id))
                else:
                    for i, memory in enumerate(batch):
                        results.append(
                            await store.save_embedded(
                                caller, memory, vectors[i] if vectors else None, model_id
                            )
                        )
            else:
                for memory in batch:
                    results.append(await store.save(caller, memory))
            if progress is not None:
                progress(len(results), total)
        return results

    def _check_memory(
        self, caller: MemoryOwner, memory: Memory, *, allow_secrets: bool = False
    ) -> None:
        """Raise :class:`MemoryValidationError` (or MemoryScopeError) before a bad write."""
        check_content(memory.content, "memory content", self.config.max_content_chars)
        if not memory.content.strip():
            raise MemoryValidationError("memory content is blank")
        caller.require_scope(memory.scope)
        if not allow_secrets:
            for what, text in (("content", memory.content), ("context", memory.context)):
                kind = secret_kind(text) if text else None
                if kind is not None:
                    raise MemoryValidationError(
                        f"memory {what} looks like it holds a secret ({kind}); long-term "
                        "memory is read back into later prompts, so it is not stored "
                        "(pass allow_secrets=True if you mean to store it)"
                    )

    def _vector_embedder(self, store: LongTermStore) -> Embedder | None:
        """The embedder, when ``store`` keeps vectors."""
        return self.embedder if isinstance(store, PostgresLongTermStore) else None

    async def inject_memory(
        self,
        owner: MemoryOwner,
        content: str,
        *,
        scope: MemoryScope | str = MemoryScope.USER,
        memory_type: MemoryType | str = MemoryType.FACT,
        importance: float = 0.5,
        source: str = "injected",
        sensitivity: Sensitivity | str = Sensitivity.NONE,
        entity_ids: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        context: str | None = None,
        allow_secrets: bool = False,
    ) -> SaveResult:
        """Store a fact you know directly (source ``injected`` by default).

        Refuses a credential as :meth:`save` does, unless ``allow_secrets=True``.
        """
        self._check_caller(owner)
        self._wrote(owner)
        try:
            memory = Memory(
                content=content,
                scope=MemoryScope(scope),
                memory_type=MemoryType(memory_type),
                importance=importance,
                source=validate_source(source),
                sensitivity=Sensitivity(sensitivity),
                entity_ids=list(entity_ids),
                metadata=metadata or {},
                context=context,
            )
        except (ValidationError, ValueError, TypeError) as exc:
            raise MemoryValidationError(f"invalid memory: {first_error(exc)}") from None
        return await self.save(owner, memory, allow_secrets=allow_secrets)
