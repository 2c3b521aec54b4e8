"""Re-embedding after the embedding model changes: a backfill, and recall's switch.

Every vector is stored with the ``model_id`` of the model that made it, and every
dense search names one model, so two models' vectors never meet. When the
manager's ``embedder`` changes, the memories saved before keep only the old
model's vectors; a *backfill* writes the new model's beside them:

- :meth:`Reembedding.reembed` backfills one tenant in this process, and
  :meth:`Reembedding.queue_reembed` queues that as a job (``harbor.reembed_tenant``)
  for the workers. For each owner key of the tenant's memories (scope, project,
  user, session, run) that has memories with a content vector of another model and
  none of the new one, it reads a batch of them *as that owner* (row-level
  security, the application's role; TENANT memories as ``harbor_admin`` with the
  tenant's identity, whose policies hold it to that tenant), embeds their texts
  (content, and context + content where there is a context) and writes the vectors,
  one transaction a batch. The primary key makes a write of a vector written
  already do nothing, and each batch reads what is still missing, so a backfill that
  was stopped (a killed worker, a failed embedder call) continues where it stopped
  when it runs again, and writes nothing twice.
- Recall keeps searching the *previous* model (``previous_embedder``: the query is
  embedded by it too) for an owner until the backfill is complete for that owner:
  until every memory the owner can see (GLOBAL ones aside) that has a content
  vector of the previous model has one of the new model. Then it searches the new
  model's. The manager checks that with one query (``reembed_complete``) at most
  every :attr:`Reembedding.reembed_recheck_seconds` per owner while it is not
  complete, and never again once it is (memories saved from then on get the new
  model's vectors at their save).

Memories saved while the backfill runs get the new model's vectors only: until
the switch, the dense leg (the previous model's) does not see them; lexical recall
does. GLOBAL memories are not backfilled (no tenant's identity may write them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.base import Embedder, normalize_vector
from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError
from harbor_pg.owner import MemoryOwner
from harbor_pg.tiers.facade import FacadeBase
from harbor_pg.validation import check_text

__all__ = ["REEMBED_BATCH", "ReembedReport", "Reembedding"]

log = logging.getLogger("harbor_pg")

#: memories embedded and written a transaction (one embedder call)
REEMBED_BATCH = 64
#: owners whose switch to the new model is remembered at most (then forgotten, and
#: checked again)
_SWITCH_CACHE = 10_000


class ReembedReport(NamedTuple):
    """What a backfill wrote: memories given the new model's vectors, vectors written,
    and how many memories still lacked one when it started (``missing``)."""

    memories: int
    vectors: int
    missing: int


class OwnerKey(NamedTuple):
    scope: str
    project_id: str
    user_id: str
    session_id: str
    run_id: str
    principal_id: str


def _owner_of(tenant_id: str, key: OwnerKey) -> MemoryOwner | None:
    """The identity that may write ``key``'s vectors (None: a TENANT key, which the
    elevated role writes with the tenant's identity)."""
    if key.scope == "tenant":
        return None
    principal = key.user_id or key.principal_id or "harbor-reembed"
    return MemoryOwner(
        tenant_id=tenant_id,
        project_id=key.project_id or None,
        principal_id=principal,
        user_id=key.user_id or None,
        session_id=key.session_id or None,
        run_id=key.run_id or None,
    )


def _texts(batch: list[dict[str, Any]]) -> tuple[list[str], list[str], list[bool]]:
    """The memory ids, texts and kinds (with_context) of a batch's vectors: each memory's
    content, and context + content where it has a context (as at its save)."""
    ids: list[str] = []
    texts: list[str] = []
    contextual: list[bool] = []
    for row in batch:
        ids.append(row["id"])
        texts.append(row["content"])
        contextual.append(False)
        context = (row["context"] or "").strip()
        if context:
            ids.append(row["id"])
            texts.append(f"{context}\n{row['content']}")
            contextual.append(True)
    return ids, texts, contextual


async def _embed(embedder: Embedder, texts: list[str]) -> list[str]:
    """``texts``' vectors, checked and normalised, as pgvector's text form."""
    raw = await embedder.embed(texts)
    return [
        "["
        + ",".join(
            map(
                repr,
                normalize_vector(v, dimensions=embedder.dimensions, model_id=embedder.model_id),
            )
        )
        + "]"
        for v in raw
    ]


class Reembedding(FacadeBase):
    """The facade's re-embedding backfill (a mixin of :class:`~harbor_pg.manager.MemoryManager`)."""

    #: the model recall searched before ``embedder``'s (None: no model change under way)
    previous_embedder: Embedder | None = None
    #: how often, at most, recall checks again whether an owner's backfill is complete
    reembed_recheck_seconds: float = 5.0
    #: (owner, model) -> complete (True), or when it was last found incomplete
    _switched: dict[tuple[Any, ...], float | bool]

    async def reembed(
        self,
        tenant_id: str,
        *,
        batch_size: int = REEMBED_BATCH,
        progress: Callable[[int, int], None] | None = None,
    ) -> ReembedReport:
        """Write ``embedder``'s vectors for ``tenant_id``'s memories that have a vector of
        another model and none of it (see :mod:`harbor_pg.reembed`), a batch of
        ``batch_size`` a transaction, each owner key as its owner. ``progress`` is called
        with (memories done, memories missing at the start) after each batch. Needs the
        PostgreSQL stores, the elevated login (to list the tenant's owner keys) and an
        unbound manager. Resumable: run again, it writes only what is still missing."""
        if self.caller is not None:
            raise MemoryScopeError("a tenant's backfill runs as each of its owners: unbind")
        check_text(tenant_id, "tenant_id")
        embedder = self._reembed_embedder()
        database = self.database
        assert database is not None
        model_id = embedder.model_id
        tenant = MemoryOwner(tenant_id=tenant_id)
        async with database.transaction(tenant, admin=True) as conn:
            cur = await conn.execute(
                query("reembed_owner_keys"), {"tenant_id": tenant_id, "model_id": model_id}
            )
            rows = await cur.fetchall()
        keys = [
            (
                OwnerKey(
                    r["scope"],
                    r["project_id"],
                    r["user_id"],
                    r["session_id"],
                    r["run_id"],
                    r["principal_id"] or "",
                ),
                int(r["missing"]),
            )
            for r in rows
        ]
        missing = sum(n for _k, n in keys)
        done = vectors = 0
        if progress is not None:
            progress(0, missing)
        for key, _n in keys:
            owner = _owner_of(tenant_id, key)
            where = {
                "tenant_id": tenant_id,
                "model_id": model_id,
                "scope": key.scope,
                "project_id": key.project_id,
                "user_id": key.user_id,
                "session_id": key.session_id,
                "run_id": key.run_id,
            }
            while True:
                # read, embed, then write: no transaction stays open over the model call
                async with database.transaction(owner or tenant, admin=owner is None) as conn:
                    cur = await conn.execute(query("reembed_batch"), {**where, "limit": batch_size})
                    batch = await cur.fetchall()
                if not batch:
                    break
                ids, texts, contextual = _texts(batch)
                embedded = await _embed(embedder, texts)
                async with database.transaction(owner or tenant, admin=owner is None) as conn:
                    cur = await conn.execute(
                        query("reembed_insert"),
                        {**where, "ids": ids, "embeddings": embedded, "with_context": contextual},
                    )
                    written = int(cur.rowcount)
                if not written:  # nothing this identity could write: never read it again
                    log.warning("re-embedding %s: %s key left unwritten", tenant_id, key.scope)
                    break
                done += len(batch)
                vectors += written
                if progress is not None:
                    progress(min(done, missing), missing)
            await self._promote(owner or tenant, owner is None, where)
            log.info(
                "re-embedding %s: owner key %s done (%d of %d memories)",
                tenant_id,
                key.scope,
                done,
                missing,
            )
        return ReembedReport(memories=done, vectors=vectors, missing=missing)

    async def _promote(self, owner: MemoryOwner, admin: bool, where: dict[str, Any]) -> None:
        """Put a backfilled key's vectors in the HNSW graph once it has enough of them."""
        assert self.database is not None
        while True:
            async with self.database.transaction(owner, admin=admin) as conn:
                row = await (await conn.execute(query("reembed_promote"), where)).fetchone()
            if not row or not row["promoted"]:
                return

    def _reembed_embedder(self) -> Embedder:
        if self.database is None:
            raise MemoryConfigurationError("re-embedding needs the PostgreSQL stores")
        if self.embedder is None:
            raise MemoryConfigurationError("re-embedding needs the manager's (new) embedder")
        return self.embedder

    async def queue_reembed(self, tenant_id: str) -> int | None:
        """Queue :meth:`reembed` of ``tenant_id`` with this manager's embedder's model as a
        job (``harbor.reembed_tenant``) for the workers, whose embedder must be that
        model; one pending a tenant (None: one was pending already). Returns its id."""
        if self.caller is not None:
            raise MemoryScopeError("a tenant's backfill runs as each of its owners: unbind")
        check_text(tenant_id, "tenant_id")
        embedder = self._reembed_embedder()
        runner = self.job_runner()  # type: ignore[attr-defined]
        job_id: int | None = await runner.queue_reembed(tenant_id, embedder.model_id)
        return job_id

    async def run_reembed_job(self, tenant_id: str, model_id: str) -> None:
        """Run a queued backfill: :meth:`reembed` of ``tenant_id``, if this manager's
        embedder is ``model_id`` (else :class:`MemoryConfigurationError`: a worker with
        another model would write the wrong vectors)."""
        if self.caller is not None:
            raise MemoryScopeError("a tenant's backfill runs as each of its owners: unbind")
        embedder = self._reembed_embedder()
        if embedder.model_id != model_id:
            raise MemoryConfigurationError(
                f"this backfill is of {model_id}; this worker's embedder is {embedder.model_id}"
            )
        await self.reembed(tenant_id)

    async def query_embedder(self, owner: MemoryOwner) -> Embedder | None:
        """The embedder whose vectors ``owner``'s recall searches: ``embedder`` once the
        backfill to its model is complete for ``owner`` (or when there is no
        ``previous_embedder``), else ``previous_embedder``."""
        self._check_caller(owner)
        new, old = self.embedder, self.previous_embedder
        if new is None or old is None or old.model_id == new.model_id or self.database is None:
            return new
        key = (
            owner.tenant_id,
            owner.project_id,
            owner.user_id,
            owner.session_id,
            owner.run_id,
            new.model_id,
            old.model_id,
        )
        seen = self._switched.get(key)
        if seen is True:
            return new
        now = time.monotonic()
        if isinstance(seen, float) and now - seen < self.reembed_recheck_seconds:
            return old
        rows = await self.database.fetch_in_one_round_trip(
            owner,
            query("reembed_complete"),
            {
                "tenant_id": owner.tenant_id,
                "model_id": new.model_id,
                "previous_model_id": old.model_id,
            },
        )
        complete = bool(rows and rows[0]["complete"])
        if len(self._switched) >= _SWITCH_CACHE:
            self._switched.clear()
        self._switched[key] = True if complete else now
        return new if complete else old
