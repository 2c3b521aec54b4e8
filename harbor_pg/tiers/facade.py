"""What every part of the :class:`~harbor_pg.manager.MemoryManager` facade shares.

The facade is assembled from the modules of its features (long-term writes in
:mod:`harbor_pg.tiers.writer`, governance in :mod:`harbor_pg.governance`,
export and import in :mod:`harbor_pg.portability`, fact extraction in
:mod:`harbor_pg.extraction.extractor`), each a mixin of :class:`FacadeBase`:
the configured stores, the bound caller and the checks every call makes.
"""

from __future__ import annotations

from typing import Any, TypeVar

from harbor_pg.config import MemoryManagerConfig
from harbor_pg.db.connection import Database
from harbor_pg.embedders.base import Embedder
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryOwner, check_caller, guarded
from harbor_pg.policy import MemoryPolicy
from harbor_pg.tiers.base import LongTermStore, ShortTermStore, WorkingStore
from harbor_pg.tiers.replica import ReadReplica
from harbor_pg.tiers.session_ttl import LiveTurns
from harbor_pg.validation import check_content, check_count

__all__ = ["FacadeBase"]

_T = TypeVar("_T")


class FacadeBase:
    """The facade's state (set by ``MemoryManager.__init__``) and shared checks."""

    short_term: ShortTermStore | None
    working: WorkingStore | None
    long_term: LongTermStore | None
    config: MemoryManagerConfig
    caller: MemoryOwner | None
    database: Database | None
    embedder: Embedder | None
    policy: MemoryPolicy
    replica: ReadReplica | None
    #: extracts facts from each appended turn, as a job on the queue (None: off)
    extraction_model: Any = None
    _live: LiveTurns | None = None

    def _short(self) -> ShortTermStore:
        if self.short_term is None:
            raise MemoryConfigurationError("the short-term tier is not configured")
        return self.short_term

    def _working(self) -> WorkingStore:
        if self.working is None:
            raise MemoryConfigurationError("the working tier is not configured")
        return self.working

    def _long(self) -> LongTermStore:
        if self.long_term is None:
            raise MemoryConfigurationError("the long-term tier is not configured")
        return self.long_term

    def _check_content(self, content: str, what: str) -> None:
        check_content(content, what, self.config.max_content_chars)

    def _check_caller(self, owner: MemoryOwner) -> None:
        check_caller(self.caller, owner)

    def _guarded(self, helper: _T) -> _T:
        """``helper`` as a bound manager hands it out: checking every owner it is given."""
        return guarded(helper, self.caller)

    def _live_turns(self) -> Any:
        """The short-term store seen through the session TTL (what every recent read uses)."""
        store = self._short()
        live = self._live
        if live is None or live.store is not store:
            live = self._live = LiveTurns(store, self.config.session_ttl_seconds)
        return live

    def _reads_replica(self, owner: MemoryOwner) -> bool:
        """Whether ``owner``'s read goes to the standby (not right after its own write)."""
        return self.replica is not None and self.replica.serves(owner)

    def _wrote(self, owner: MemoryOwner) -> None:
        if self.replica is not None:
            self.replica.wrote(owner)

    def _recent_limit(self, limit: int | None) -> int:
        cap = self.policy.max_session_turns
        n = cap if limit is None else check_count(limit, "limit")
        return min(n, cap)
