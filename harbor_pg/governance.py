"""Governance over the tiers: erasure of a user, session or agent, and retention.

On PostgreSQL each operation is one transaction as the elevated role, running
the named statements of ``sql/queries/admin.sql``; over other stores it goes
through their own ``erase`` / ``purge_expired_of`` / ``apply_retention``. A
facade bound to a caller acts on that caller's own tenant and rows only
(:func:`check_subject`). :class:`Governance` holds the facade's public methods;
:class:`~harbor_pg.manager.MemoryManager` has them.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any, NamedTuple

import psycopg

from harbor_pg.config import RetentionRule
from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import (
    MemoryConfigurationError,
    MemoryDatabaseError,
    MemoryScopeError,
    MemoryValidationError,
)
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Sensitivity
from harbor_pg.telemetry import traced
from harbor_pg.tiers.base import (
    ErasableLongTermStore,
    ErasableShortTermStore,
    ErasableWorkingStore,
    EraseReceipt,
    ErasureSubject,
    LongTermStore,
    RetentionReceipt,
    ShortTermStore,
    WorkingStore,
)
from harbor_pg.tiers.facade import FacadeBase
from harbor_pg.tiers.postgres import all_postgres, any_postgres

log = logging.getLogger("harbor_pg")

__all__ = [
    "Governance",
    "Tiers",
    "check_subject",
    "erase_in_tiers",
    "purge_expired_state",
    "retention_in_tiers",
]


class Tiers(NamedTuple):
    """The configured stores of a facade (None: that tier is not configured)."""

    short_term: ShortTermStore | None
    working: WorkingStore | None
    long_term: LongTermStore | None


def check_subject(
    caller: MemoryOwner | None,
    tenant_id: str,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    principal_id: str | None = None,
) -> None:
    """For a bound ``caller``, governance acts on the caller's own tenant and rows only."""
    if caller is None:
        return
    named = {"user_id": user_id, "session_id": session_id, "principal_id": principal_id}
    if tenant_id != caller.tenant_id:
        raise MemoryScopeError("tenant_id does not match the authenticated caller")
    for name, value in named.items():
        if value is not None and value != getattr(caller, name):
            raise MemoryScopeError(
                f"{name} does not match the authenticated caller ({name} differs)"
            )


async def erase_in_tiers(
    tiers: Tiers,
    database: Database | None,
    subject: ErasureSubject,
    *,
    caller: MemoryOwner | None = None,
) -> EraseReceipt:
    """Delete every row of ``subject`` in every tier (see :meth:`Governance.erase`);
    a bound ``caller`` may erase only its own tenant and rows."""
    if subject.user_id is None and subject.principal_id is None:
        raise MemoryValidationError("erase needs a user_id or a principal_id (agent)")
    check_subject(
        caller,
        subject.tenant_id,
        user_id=subject.user_id,
        session_id=subject.session_id,
        principal_id=subject.principal_id,
    )
    if database is not None and any_postgres(*tiers):
        if not all_postgres(*tiers):
            raise MemoryConfigurationError(
                "erasure over PostgreSQL stores mixed with other stores is not "
                "supported: the erasure must be one transaction"
            )
        owner = MemoryOwner(tenant_id=subject.tenant_id)
        if database.set_local:
            # a distributed database: one call on the tenant's worker, unless something of
            # the subject may lie off the tenant's shards (then harbor.erase, below)
            delegated = await _erase_delegated(database, subject, owner)
            if delegated is not None:
                return delegated
        async with database.transaction(owner, admin=True) as conn:
            rows = await (
                await conn.execute(
                    query("erase"),
                    {
                        "user_id": subject.user_id,
                        "session_id": subject.session_id,
                        "principal_id": subject.principal_id,
                    },
                )
            ).fetchall()
        return _receipt(rows)
    return await _erase_in_stores(tiers, subject)


def _receipt(rows: list[dict[str, Any]]) -> EraseReceipt:
    """The receipt of harbor.erase's rows (one a tier, with the count deleted)."""
    counts = {r["tier"]: int(r["deleted"]) for r in rows}
    return EraseReceipt(
        short_term=counts.get("short_term", 0),
        working=counts.get("working", 0),
        long_term=counts.get("long_term", 0),
        embeddings=counts.get("embeddings", 0),
        role_bindings=counts.get("role_bindings", 0),
    )


#: what harbor.erase_delegated says when the subject may have rows off the tenant's shards
#: (GLOBAL memories, role bindings, access tokens: sql/citus/erase.sql)
_NEEDS_FULL_ERASURE = "harbor.erase_delegated:"


async def _erase_delegated(
    database: Database, subject: ErasureSubject, owner: MemoryOwner
) -> EraseReceipt | None:
    """The erasure on a distributed database as one call that Citus delegates to the
    tenant's worker (harbor.erase_delegated), in the transaction that also deletes the
    subject's jobs from the coordinator's queue, in one round trip; None, with nothing
    done, when the worker says the subject may have rows elsewhere (a GLOBAL memory may
    exist, or the user has role bindings or access tokens): it reads that in the call's
    own transaction, so a flag set since any earlier look is seen."""
    params = {
        **carried_identity(owner),
        "erase_user_id": subject.user_id,
        "erase_session_id": subject.session_id,
        "erase_principal_id": subject.principal_id,
    }
    try:
        rows, _jobs = await database.fetch_each_delegated_in_transaction(
            [(query("erase_delegated"), params), (query("erase_jobs_citus"), params)],
            admin=True,
        )
    except MemoryDatabaseError as exc:
        cause = exc.__cause__
        if (
            isinstance(cause, psycopg.Error)
            and cause.sqlstate == "55000"
            and str(cause).startswith(_NEEDS_FULL_ERASURE)
        ):
            return None
        raise
    return _receipt(rows)


async def _erase_in_stores(tiers: Tiers, subject: ErasureSubject) -> EraseReceipt:
    """Erasure through the stores' own ``erase`` (the Erasable* protocols).

    Every configured store must implement it: one that cannot is refused
    before anything is deleted, so a receipt never reports an erasure that
    did not happen.
    """
    short, working, long = tiers
    protocols: list[tuple[str, object, type]] = [
        ("short-term", short, ErasableShortTermStore),
        ("working", working, ErasableWorkingStore),
        ("long-term", long, ErasableLongTermStore),
    ]
    cannot = [
        f"the {name} store ({type(store).__name__})"
        for name, store, protocol in protocols
        if store is not None and not isinstance(store, protocol)
    ]
    if cannot:
        raise MemoryConfigurationError(
            f"erasure: {', '.join(cannot)} cannot erase; implement erase() "
            "(harbor_pg.tiers.base.ErasableShortTermStore, ErasableWorkingStore, "
            "ErasableLongTermStore) so that nothing is left behind"
        )
    turn_ids: list[int] = (
        await short.erase(subject) if isinstance(short, ErasableShortTermStore) else []
    )
    runs = await working.erase(subject) if isinstance(working, ErasableWorkingStore) else 0
    memories, vectors = (
        await long.erase(subject, turn_ids=turn_ids)
        if isinstance(long, ErasableLongTermStore)
        else (0, 0)
    )
    return EraseReceipt(
        short_term=len(turn_ids), working=runs, long_term=memories, embeddings=vectors
    )


def _retention_age(value: object) -> float:
    """``max_age_seconds`` as a float: a finite number >= 0 (an integer beyond a
    float's range is refused here, not as an ``OverflowError``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MemoryValidationError("max_age_seconds must be a finite number >= 0")
    try:
        age = float(value)
    except OverflowError:
        raise MemoryValidationError("max_age_seconds is beyond a float's range") from None
    if not math.isfinite(age) or age < 0:
        raise MemoryValidationError("max_age_seconds must be a finite number >= 0")
    return age


async def retention_in_tiers(
    tiers: Tiers,
    database: Database | None,
    tenant_id: str,
    *,
    session_ttl_seconds: float | None,
    caller: MemoryOwner | None = None,
    max_age_seconds: float | None = None,
    scope: MemoryScope | str | None = None,
    min_sensitivity: Sensitivity | str | None = None,
    include_summaries: bool = False,
) -> RetentionReceipt:
    """Apply retention to one tenant (see :meth:`Governance.apply_retention`);
    ``session_ttl_seconds``: the turns older than that are deleted (None: none); a
    bound ``caller`` may act on its own tenant only."""
    check_subject(caller, tenant_id)
    if max_age_seconds is not None:
        max_age_seconds = _retention_age(max_age_seconds)
    if max_age_seconds is None and (scope is not None or min_sensitivity is not None):
        raise MemoryValidationError("a retention scope or sensitivity needs max_age_seconds")
    try:
        only_scope = MemoryScope(scope) if scope is not None else None
        floor = Sensitivity(min_sensitivity) if min_sensitivity is not None else None
    except ValueError as exc:
        raise MemoryValidationError(str(exc)) from None
    ttl = session_ttl_seconds
    if database is None:
        short, working, long_term = tiers
        if (working is not None and not hasattr(working, "purge_expired_of")) or (
            long_term is not None and not hasattr(long_term, "apply_retention")
        ):
            raise MemoryConfigurationError(
                "retention needs the PostgreSQL stores, or stores with purge_expired_of "
                "(working) and apply_retention (long-term) as the in-process ones have"
            )
        turns = (
            await _call_optional(short, "purge_expired_turns", 0, tenant_id, ttl)
            if ttl is not None
            else 0
        )
        runs = await _call_optional(working, "purge_expired_of", 0, tenant_id)
        closed = await _call_optional(long_term, "expire_memories_of", 0, tenant_id)
        memories = (
            await _call_optional(
                long_term,
                "apply_retention",
                0,
                tenant_id,
                max_age_seconds,
                scope=only_scope,
                min_sensitivity=floor,
                include_summaries=include_summaries,
            )
            if max_age_seconds is not None
            else 0
        )
        return RetentionReceipt(
            short_term=int(turns),
            working=int(runs),
            long_term=int(memories),
            expired=int(closed),
        )
    async with database.transaction(MemoryOwner(tenant_id=tenant_id), admin=True) as conn:
        row = await (
            await conn.execute(
                query("apply_retention"),
                {
                    "max_age_seconds": max_age_seconds,
                    "scope": only_scope.value if only_scope else None,
                    "min_sensitivity": floor.value if floor else None,
                    "include_summaries": include_summaries,
                },
            )
        ).fetchone()
        turns = 0
        if ttl is not None:
            purged = await conn.execute(query("purge_expired_turns"), {"ttl_seconds": ttl})
            turns = purged.rowcount
    assert row is not None
    return RetentionReceipt(
        working=int(row["working_state"]),
        long_term=int(row["memories"]),
        short_term=turns,
        expired=int(row["expired"]),
    )


async def expire_every_tenant(long_term: object) -> int:
    """Close every tenant's expired memories (0 for a store that cannot)."""
    expire = getattr(long_term, "expire_every_tenant", None)
    return int(await expire()) if expire else 0


async def purge_expired_state(working: WorkingStore) -> int:
    """Reclaim the space of expired working state (0 for a store that cannot)."""
    purge = getattr(working, "purge_expired", None)
    return int(await purge()) if purge else 0


async def _call_optional(store: object, method: str, default: Any, *args: Any, **kw: Any) -> Any:
    """``store.method(*args, **kw)``, awaited when it is a coroutine; ``default`` without it."""
    found = getattr(store, method, None) if store is not None else None
    if found is None:
        return default
    result = found(*args, **kw)
    return await result if inspect.isawaitable(result) else result


class Governance(FacadeBase):
    """The facade's governance methods (a mixin of :class:`~harbor_pg.manager.MemoryManager`)."""

    def _tiers(self) -> Tiers:
        return Tiers(self.short_term, self.working, self.long_term)

    @traced(
        "harbor_pg.erase",
        result=lambda r: {
            "harbor.erase.short_term": r.short_term,
            "harbor.erase.working": r.working,
            "harbor.erase.long_term": r.long_term,
            "harbor.erase.embeddings": r.embeddings,
        },
    )
    async def erase(
        self,
        tenant_id: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        principal_id: str | None = None,
    ) -> EraseReceipt:
        """Delete every row of a user, a user's session, or an agent, in every tier.

        A user's rows are those keyed to the user and those the user wrote as
        the principal in a wider scope (a PROJECT memory stores the author in
        ``principal_id``); a session's memories include those derived from it
        (``source_session_id``), and any memory derived from an erased turn
        (``source_message_ids``) goes too. Embeddings go with their memories.

        One transaction on PostgreSQL (as the elevated role); returns counts
        per tier. Nothing of the erased text is written anywhere.
        """
        subject = ErasureSubject(
            tenant_id=tenant_id, user_id=user_id, session_id=session_id, principal_id=principal_id
        )
        return await erase_in_tiers(
            self._tiers(),
            self.database,
            subject,
            caller=self.caller,
        )

    async def erase_agent_memories(
        self, tenant_id: str, agent_id: str, session_id: str | None = None
    ) -> EraseReceipt:
        """Erase everything an agent (principal) wrote; with ``session_id``, only that session."""
        return await self.erase(tenant_id, principal_id=agent_id, session_id=session_id)

    async def apply_retention(
        self,
        tenant_id: str,
        *,
        max_age_seconds: float | None = None,
        scope: MemoryScope | str | None = None,
        min_sensitivity: Sensitivity | str | None = None,
        include_summaries: bool = False,
    ) -> RetentionReceipt:
        """Apply retention to one tenant: purge its expired working state, close its
        memories past their expiry (``expires_at``; kept as history) and, when
        ``max_age_seconds`` is given, delete its memories older than that (optionally
        only one ``scope`` and/or at or above ``min_sensitivity``; rolling summaries
        only with ``include_summaries``). It also deletes the turns the session
        TTL (``MemoryManagerConfig.session_ttl_hours``) has expired, keeping the
        summaries and memories derived from them. Returns the counts.

        One transaction on PostgreSQL, as the elevated role.
        """
        return await retention_in_tiers(
            self._tiers(),
            self.database,
            tenant_id,
            session_ttl_seconds=self.config.session_ttl_seconds,
            caller=self.caller,
            max_age_seconds=max_age_seconds,
            scope=scope,
            min_sensitivity=min_sensitivity,
            include_summaries=include_summaries,
        )

    async def apply_configured_retention(self) -> dict[str, list[RetentionReceipt]]:
        """Apply the retention this manager is configured with
        (``MemoryManagerConfig.retention``): for each tenant named there, one
        :meth:`apply_retention` per rule (an empty list: one with no age limit, which
        still reclaims expired working state, closes expired memories and deletes the
        turns past the session TTL). What the periodic retention job runs
        (:mod:`harbor_pg.jobs`); tenants not named are left alone. A tenant that fails
        does not stop the others; the first failure is raised once all have run (so
        the job is retried). Needs an unbound manager. Returns each tenant's receipts."""
        if self.caller is not None:
            raise MemoryScopeError("retention of the configured tenants needs an unbound manager")
        receipts: dict[str, list[RetentionReceipt]] = {}
        failure: Exception | None = None
        for tenant_id, rules in self.config.retention.items():
            try:
                for rule in rules or (RetentionRule(),):
                    receipt = await self.apply_retention(
                        tenant_id,
                        max_age_seconds=rule.max_age_seconds,
                        scope=rule.scope,
                        min_sensitivity=rule.min_sensitivity,
                        include_summaries=rule.include_summaries,
                    )
                    receipts.setdefault(tenant_id, []).append(receipt)
            except Exception as exc:
                log.warning("retention of tenant %r failed: %s", tenant_id, type(exc).__name__)
                failure = failure or exc
        if failure is not None:
            raise failure
        return receipts

    async def purge_working_state(self) -> int:
        """Reclaim the space of expired working state."""
        return await purge_expired_state(self._working())

    async def expire_memories(self) -> int:
        """Close every tenant's memories past their expiry (``expires_at``): each one's
        validity interval ends at its expiry, as a superseded memory's does, and nothing
        is deleted. Reads leave an expired memory out before this runs; the sweep keeps
        history exact and lets its content be saved afresh. The periodic upkeep job runs
        it (on PostgreSQL as the elevated role, ``harbor.expire_memories()``); a tenant's
        own sweep is part of :meth:`apply_retention`. Returns how many it closed."""
        if self.caller is not None:
            raise MemoryScopeError("the sweep of every tenant's memories needs an unbound manager")
        return await expire_every_tenant(self._long())
