"""The inspector's reads: every one as one identity, under row-level security.

Each read is one read-only transaction on the application pool that first sets
the identity with ``harbor.set_identity(..., is_local => true)`` (SET LOCAL on
Citus), so the policies decide what comes back; a login bound with
``harbor.bind_role`` is refused an identity its binding contradicts. The one
read that does not run as the page's identity is the list of identities a
tenant holds (ids and counts, never content), which runs as the elevated
role in that tenant when an admin URL is configured.

The statements are in ``sql/queries/inspect.sql``; "why this ranking" runs
``harbor.recall()`` through the package's own ``recall`` query.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from harbor_pg.context.recall import RecallRequest
from harbor_pg.context.summarizer import FRONTIER_KEY
from harbor_pg.db.connection import Connection, identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryError
from harbor_pg.owner import MemoryOwner
from harbor_pg.ranking import RecalledMemory
from harbor_pg.tiers.rows import recall_params, recalled_from_row

if TYPE_CHECKING:
    from harbor_pg.manager import MemoryManager

__all__ = ["Binding", "IdentityRow", "RankingView", "Reader"]

log = logging.getLogger("harbor_pg.inspect")

#: the filters of the memories page and the values each may take
SCOPES = ("global", "tenant", "project", "user", "session", "run")
TYPES = ("fact", "preference", "decision", "episode", "summary")
SENSITIVITIES = ("none", "low", "pii", "sensitive")


@dataclass(frozen=True)
class Binding:
    """The application login's role binding (``bound`` False: none)."""

    bound: bool
    tenant_id: str | None = None
    project_id: str | None = None
    user_id: str | None = None


@dataclass(frozen=True)
class IdentityRow:
    """One identity a tenant's rows are keyed on, with what it holds."""

    owner: MemoryOwner
    turns: int = 0
    memories: int = 0
    states: int = 0
    last_seen: datetime | None = None


@dataclass(frozen=True)
class RankedRow:
    """One candidate of a recall and what became of it."""

    item: RecalledMemory
    #: "returned" (in the recalled block), "budget" (within top_k, cut by the token
    #: budget) or "lost" (ranked below top_k)
    fate: str
    #: tokens of the block up to and including this memory
    cumulative: int


@dataclass
class RankingView:
    """Everything the "why this ranking" page shows for one question."""

    question: str
    request: RecallRequest | None
    rows: list[RankedRow] = field(default_factory=list)
    returned: int = 0
    examined: int = 0
    dense: bool = False
    notes: list[str] = field(default_factory=list)


class Reader:
    """The inspector's reads over a manager's database (see the module docstring)."""

    def __init__(self, manager: MemoryManager) -> None:
        if manager.database is None:
            raise MemoryError("the inspector needs the PostgreSQL stores")
        self.manager = manager
        self.database = manager.database

    # -- plumbing ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def as_identity(self, owner: MemoryOwner) -> AsyncIterator[Connection]:
        """A read-only transaction whose identity is ``owner``, set by harbor.set_identity."""
        db = self.database
        if db.set_local:
            async with db.transaction(owner) as conn:
                yield conn
            return
        async with db.transaction(None) as conn:
            await conn.execute(query("inspect_read_only"))
            await conn.execute(query("set_identity_checked"), identity_params(owner))
            yield conn

    async def _rows(
        self, owner: MemoryOwner, name: str, params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        async with self.as_identity(owner) as conn:
            cur = await conn.execute(query(name), params)
            return list(await cur.fetchall())

    # -- identities --------------------------------------------------------------------

    async def binding(self) -> Binding:
        """The application login's role binding, read as that login."""
        async with self.database.transaction(None) as conn:
            row = await (await conn.execute(query("inspect_login"))).fetchone()
        if not row or not row["bound"]:
            return Binding(bound=False)
        return Binding(True, row["tenant_id"], row["project_id"], row["user_id"])

    async def identities(self, tenant_id: str, *, limit: int = 500) -> list[IdentityRow] | None:
        """The identities ``tenant_id``'s rows are keyed on (elevated role), users first;
        None when no admin URL is configured (or the elevated role may not read them)."""
        if self.database.admin_url is None:
            return None
        try:
            async with self.database.transaction(
                MemoryOwner(tenant_id=tenant_id), admin=True
            ) as conn:
                cur = await conn.execute(
                    query("inspect_identities"), {"tenant_id": tenant_id, "limit": limit}
                )
                rows = await cur.fetchall()
        except MemoryError as exc:
            log.warning("inspect: cannot list the identities of %r: %s", tenant_id, exc)
            return None
        return _identity_rows(tenant_id, rows)

    # -- memories ----------------------------------------------------------------------

    async def memories(
        self,
        owner: MemoryOwner,
        *,
        scope: str | None = None,
        memory_type: str | None = None,
        sensitivity: str | None = None,
        source: str | None = None,
        entity: str | None = None,
        as_of: datetime | None = None,
        all_versions: bool = False,
        q: str | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        """The memories ``owner`` sees that pass the filters, best text match first
        (with ``q``), else newest first."""
        return await self._rows(
            owner,
            "inspect_memories",
            {
                "tenant_id": owner.tenant_id,
                "scope": scope,
                "memory_type": memory_type,
                "sensitivity": sensitivity,
                "source": source,
                "entity": entity,
                "as_of": as_of,
                "all_versions": all_versions,
                "q": q,
                "limit": limit,
            },
        )

    async def facets(self, owner: MemoryOwner) -> dict[str, list[tuple[str, int]]]:
        """Per filter, the values ``owner``'s visible memories take, with counts."""
        rows = await self._rows(owner, "inspect_memory_facets", {"tenant_id": owner.tenant_id})
        out: dict[str, list[tuple[str, int]]] = {}
        for row in rows:
            out.setdefault(row["facet"], []).append((row["value"], int(row["n"])))
        return out

    async def memory(self, owner: MemoryOwner, memory_id: str) -> dict[str, Any] | None:
        """One memory ``owner`` sees, with its supersession chain and entity neighbours
        (``chain``, ``neighbours``), or None."""
        async with self.as_identity(owner) as conn:
            params = {"tenant_id": owner.tenant_id, "id": memory_id}
            row = await (await conn.execute(query("inspect_memory"), params)).fetchone()
            if row is None:
                return None
            chain = await (
                await conn.execute(
                    query("memory_history"),
                    {"tenants": ["", owner.tenant_id], "id": memory_id},
                )
            ).fetchall()
            neighbours: list[dict[str, Any]] = []
            if row["entity_ids"]:
                cur = await conn.execute(
                    query("inspect_entity_memories"),
                    {**params, "entity_ids": list(row["entity_ids"]), "limit": 20},
                )
                neighbours = list(await cur.fetchall())
        out = dict(row)
        out["chain"] = list(chain)
        out["neighbours"] = neighbours
        return out

    async def source_turns(
        self, owner: MemoryOwner, session_id: str, ids: Sequence[str]
    ) -> list[dict[str, Any]]:
        """The turns ``ids`` of ``session_id``, as ``owner`` in that session sees them."""
        numbers = sorted({int(i) for i in ids if isinstance(i, str) and i.isdigit()})[:500]
        if not numbers:
            return []
        return await self._rows(
            owner,
            "inspect_source_turns",
            {"tenant_id": owner.tenant_id, "session_id": session_id, "ids": numbers},
        )

    # -- a session ---------------------------------------------------------------------

    async def session(self, owner: MemoryOwner, *, limit: int = 500) -> dict[str, Any]:
        """``owner``'s session: its turns, its rolling summary (with the frontier it
        covers), its run's working state and its jobs on the queue that wait, run or
        failed. ``owner`` names a user and a session."""
        assert owner.user_id is not None and owner.session_id is not None
        params = {
            "tenant_id": owner.tenant_id,
            "user_id": owner.user_id,
            "session_id": owner.session_id,
            "run_id": owner.run_id or "",
            "limit": limit,
        }
        async with self.as_identity(owner) as conn:
            turns = await (await conn.execute(query("inspect_turns"), params)).fetchall()
            summary = await (await conn.execute(query("context_load_summary"), params)).fetchone()
            state = None
            if owner.run_id:
                cur = await conn.execute(query("inspect_working_state"), params)
                state = await cur.fetchone()
            jobs = await (await conn.execute(query("inspect_jobs"), params)).fetchall()
        frontier = None
        covered: set[str] = set()
        if summary is not None:
            raw = (summary.get("metadata") or {}).get(FRONTIER_KEY)
            frontier = int(raw) if isinstance(raw, str | int) and str(raw).isdigit() else None
            covered = {str(i) for i in summary.get("source_message_ids") or []}
        return {
            "turns": list(turns),
            "summary": summary,
            "frontier": frontier,
            "covered": covered,
            "state": state,
            "jobs": list(jobs),
        }

    # -- why this ranking --------------------------------------------------------------

    async def ranking(
        self,
        owner: MemoryOwner,
        question: str,
        *,
        top_k: int | None = None,
        token_budget: int | None = None,
        as_of: datetime | None = None,
    ) -> RankingView:
        """``harbor.recall()`` for ``question`` as ``owner``, with the candidates that lost.

        Two calls with the same candidate pool: the recall the application would
        make (``top_k``, the token budget), and one returning up to half the
        candidates per leg without a budget. Recall hands each leg
        max(candidates, 2 x top_k, 50) candidates, so the second call, asking
        for half as many rows as the pool per leg holds, ranks exactly the
        same pool the same way: its rows past ``top_k`` are the memories that
        lost, and those within it that the first call did not return were cut
        by the budget.
        """
        recall = self.manager.recaller()
        request = await recall.prepare(
            owner, question, top_k=top_k, token_budget=token_budget, as_of=as_of
        )
        view = RankingView(question=question, request=request)
        if request is None:
            view.notes.append("recall is off for this question (blank, top_k 0, or no scope)")
            return view
        pool = request.candidates_per_leg
        wide = dataclasses.replace(
            request, top_k=max(request.top_k, pool // 2), token_budget=None, candidates=pool
        )
        try:
            real, every = await self._recall_pair(owner, request, wide)
        except MemoryError as exc:
            if request.embedding is None:
                raise
            view.notes.append(f"the dense leg failed, lexical recall only: {exc}")
            request = _lexical(request)
            wide = _lexical(wide)
            view.request = request
            real, every = await self._recall_pair(owner, request, wide)
        view.dense = request.embedding is not None
        if not view.dense:
            view.notes.append(
                "no query embedding (no embedder, or it failed): the dense signals are empty"
            )
        shown = recall.finish(real, request)
        real_ids = [item.memory.id for item in real]
        if real_ids != [item.memory.id for item in every[: len(real_ids)]]:
            # the recall function ranked the wider call's pool differently: say so
            view.notes.append(
                "the wider call ranked a different candidate pool: the 'lost' rows are approximate"
            )
        returned_ids = {item.memory.id for item in shown}
        view.returned = len(shown)
        view.examined = len(every)
        used = 0
        for item in every:
            used += item.tokens
            if item.memory.id in returned_ids:
                fate = "returned"
            elif item.rank <= request.top_k:
                fate = "budget"
            else:
                fate = "lost"
            view.rows.append(RankedRow(item=item, fate=fate, cumulative=used))
        return view

    async def _recall_pair(
        self, owner: MemoryOwner, request: RecallRequest, wide: RecallRequest
    ) -> tuple[list[RecalledMemory], list[RecalledMemory]]:
        async with self.as_identity(owner) as conn:
            real = await (await conn.execute(query("recall"), recall_params(request))).fetchall()
            every = await (await conn.execute(query("recall"), recall_params(wide))).fetchall()
        return [recalled_from_row(r) for r in real], [recalled_from_row(r) for r in every]


def _lexical(request: RecallRequest) -> RecallRequest:
    return dataclasses.replace(request, embedding=None, model_id=None, min_similarity=None)


def _identity_rows(tenant_id: str, rows: Sequence[dict[str, Any]]) -> list[IdentityRow]:
    """Each user, then its sessions and runs, from the keys the rows are stored under."""
    users: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {}
    projects: set[str] = set()
    for row in rows:
        user = row["user_id"] or ""
        if row["project_id"]:
            projects.add(row["project_id"])
        if not user:
            continue
        key = (row["session_id"] or "", row["run_id"] or "", row["project_id"] or "")
        users.setdefault(user, {})[key] = row
    out: list[IdentityRow] = []
    for user, keys in users.items():
        total = _sum(keys.values())
        out.append(IdentityRow(MemoryOwner(tenant_id=tenant_id, user_id=user), **total))
        for (session, run, project), row in keys.items():
            if not session:
                continue
            owner = MemoryOwner(
                tenant_id=tenant_id,
                user_id=user,
                session_id=session,
                run_id=run or None,
                project_id=project or None,
            )
            out.append(IdentityRow(owner, **_sum([row])))
    for project in sorted(projects):
        out.append(IdentityRow(MemoryOwner(tenant_id=tenant_id, project_id=project)))
    return out


def _sum(rows: Any) -> dict[str, Any]:
    rows = list(rows)
    seen = [r["last_seen"] for r in rows if r["last_seen"] is not None]
    return {
        "turns": sum(int(r["turns"]) for r in rows),
        "memories": sum(int(r["memories"]) for r in rows),
        "states": sum(int(r["states"]) for r in rows),
        "last_seen": max(seen) if seen else None,
    }
