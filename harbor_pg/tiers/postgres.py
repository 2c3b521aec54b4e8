"""Which stores are the PostgreSQL ones: the facade's operations that run as one
statement or one transaction across the tiers (snapshot, erasure, retention) take
that path only when every store they touch is backed by the database."""

from __future__ import annotations

from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from harbor_pg.tiers.working import PostgresWorkingStore

__all__ = ["all_postgres", "any_postgres", "is_postgres"]

_STORES = (PostgresShortTermStore, PostgresWorkingStore, PostgresLongTermStore)


def is_postgres(store: object) -> bool:
    """Whether ``store`` is one of the built-in PostgreSQL stores."""
    return isinstance(store, _STORES)


def any_postgres(*stores: object) -> bool:
    """Whether any of ``stores`` is a PostgreSQL store."""
    return any(is_postgres(s) for s in stores)


def all_postgres(*stores: object) -> bool:
    """Whether every configured (not None) store of ``stores`` is a PostgreSQL store."""
    return all(s is None or is_postgres(s) for s in stores)
