"""A snapshot: recent turns, working state and recalled memories, read together.

Over the PostgreSQL stores it is one statement (``sql/queries/snapshot.sql``)
sent with the caller's identity in one round trip; the facade falls back to
three calls over other stores, and on Citus, which cannot plan ``recall()``
inside that statement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from harbor_pg.context.recall import MemoryRecall, RecallRequest
from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.rows import recall_params, recalled_from_row
from harbor_pg.tiers.short_term import message_from_row

__all__ = ["MemorySnapshot", "snapshot_in_one_round_trip"]

log = logging.getLogger("harbor_pg")

#: Parameters of a snapshot that recalls nothing.
_NO_RECALL = RecallRequest(query="", scopes=(), top_k=0)


@dataclass(frozen=True)
class MemorySnapshot:
    """Recent turns, working state and recalled memories, read together."""

    recent: list[ConversationMessage] = field(default_factory=list)
    working_state: dict[str, Any] = field(default_factory=dict)
    memories: list[Memory] = field(default_factory=list)


async def snapshot_in_one_round_trip(
    database: Database,
    owner: MemoryOwner,
    text: str,
    *,
    recent_limit: int,
    ttl_seconds: float | None,
    recaller: MemoryRecall | None,
    top_k: int,
    with_working: bool = True,
) -> MemorySnapshot:
    """The snapshot of ``owner`` in one statement: the newest ``recent_limit`` live
    turns, the run's working state, and ``top_k`` memories recalled for ``text`` by
    ``recaller`` (None: no long-term tier). A failing dense leg falls back to lexical
    recall, so an index failure never costs the turn its history."""
    owner.require_scope(MemoryScope.SESSION)
    request = await recaller.prepare(owner, text, top_k=top_k) if recaller is not None else None
    params = {
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "session_id": owner.session_id,
        "run_id": owner.run_id or "",
        "project_id": owner.project_id or "",
        "recent_limit": recent_limit,
        "ttl_seconds": ttl_seconds,
        "recall": request is not None,
        **recall_params(request or _NO_RECALL),
    }
    # the identity and the statement in one flight and one transaction: one round trip
    try:
        [row] = await database.fetch_in_one_round_trip(owner, query("snapshot"), params)
    except Exception as exc:
        if request is None or request.embedding is None:
            raise
        log.warning("snapshot: dense recall failed, falling back to lexical recall: %s", exc)
        request = replace(request, embedding=None, model_id=None, min_similarity=None)
        params.update(recall_params(request))
        [row] = await database.fetch_in_one_round_trip(owner, query("snapshot"), params)
    memories: list[Memory] = []
    if recaller is not None and request is not None:
        ranked = [recalled_from_row(m, typed=False) for m in row["memories"]]
        memories = [item.memory for item in recaller.finish(ranked, request)]
    return MemorySnapshot(
        recent=[message_from_row(r) for r in row["recent"]],
        working_state=dict(row["working"] or {}) if with_working else {},
        memories=memories,
    )
