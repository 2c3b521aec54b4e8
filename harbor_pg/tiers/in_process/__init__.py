"""In-process stores for applications' own unit tests (no database).

They follow the same contracts as the PostgreSQL stores, including scope
visibility, dedup by content hash and TTL expiry, and pass the same
conformance suite (``harbor_pg.testing``). Process-local; nothing survives a
restart. One module per tier, as for the PostgreSQL stores: :mod:`.short_term`,
:mod:`.working` and :mod:`.long_term`.
"""

from __future__ import annotations

from harbor_pg.tiers.in_process.long_term import InMemoryLongTermStore
from harbor_pg.tiers.in_process.short_term import InMemoryShortTermStore
from harbor_pg.tiers.in_process.working import InMemoryWorkingStore

__all__ = ["InMemoryLongTermStore", "InMemoryShortTermStore", "InMemoryWorkingStore"]
