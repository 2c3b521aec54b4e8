"""What the in-process stores share (private): the clock and the erasure predicate."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["erased", "utc_now"]


def utc_now() -> datetime:
    return datetime.now(UTC)


def erased(
    row_user: str,
    row_principal: str,
    row_sessions: tuple[str | None, ...],
    user_id: str | None,
    session_id: str | None,
    principal_id: str | None,
) -> bool:
    """The erasure predicate of ``harbor.erase`` for one row.

    A user's rows are keyed to them or written by them as the principal; a
    session matches any of ``row_sessions`` (a memory's own session and the
    session it was derived from); an agent's rows are those it wrote.
    """
    return (
        (user_id is None or user_id in (row_user, row_principal))
        and (session_id is None or session_id in row_sessions)
        and (principal_id is None or row_principal == principal_id)
    )
