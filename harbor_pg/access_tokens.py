"""Bearer tokens that stand for one bound identity (used by the MCP server over HTTP).

A token is a random string shown once when it is created; the database keeps
only its SHA-256 (``harbor.access_tokens``) with the identity it stands for:
the tenant, and the project, principal, user, session and run it is bound to.
Whoever presents the token acts as exactly that identity, and row-level
security decides what it reads and writes. Only the elevated role creates,
lists and revokes tokens, each in the tenant it sets; the application role
can read a token's row only by naming the hash of the token it holds.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryNotFoundError, MemoryValidationError
from harbor_pg.owner import MemoryOwner

__all__ = ["AccessToken", "IssuedToken", "TokenStore", "hash_token"]

#: Every token starts with this, so a leaked one is easy to recognise and scan for.
TOKEN_PREFIX = "hpg_"
_MAX_TOKEN_CHARS = 200


def hash_token(token: str) -> str:
    """The SHA-256 (hex) under which ``token`` is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AccessToken:
    """One stored token (never its text): its id, name, identity and state."""

    id: str
    name: str
    owner: MemoryOwner
    is_admin: bool
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> AccessToken:
        """Build from a ``token_list`` / ``token_identity`` row."""
        owner = MemoryOwner(
            tenant_id=row["tenant_id"],
            project_id=row["project_id"],
            principal_id=row["principal_id"],
            user_id=row["user_id"],
            session_id=row["session_id"],
            run_id=row["run_id"],
        )
        return cls(
            id=row["id"],
            name=row["name"],
            owner=owner,
            is_admin=bool(row["is_admin"]),
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            revoked_at=row["revoked_at"],
        )


@dataclass(frozen=True)
class IssuedToken:
    """A token just created: ``token`` is its text, shown this once and stored nowhere."""

    token: str
    record: AccessToken


class TokenStore:
    """Create, list, revoke and check bearer tokens in one database.

    Args:
        database: an open :class:`~harbor_pg.db.connection.Database`; creating,
            listing and revoking need its elevated pool (an admin URL).
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    async def create(
        self,
        owner: MemoryOwner,
        *,
        name: str = "",
        is_admin: bool = False,
        expires_at: datetime | None = None,
    ) -> IssuedToken:
        """Issue a token that stands for ``owner`` (every field of it, as given).

        ``is_admin`` lets the token's holder erase rows of its tenant. Runs as
        the elevated role in ``owner``'s tenant.
        """
        if not isinstance(name, str) or len(name) > 200:
            raise MemoryValidationError("a token name is a string of at most 200 characters")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        params = {
            "tenant_id": owner.tenant_id,
            "token_hash": hash_token(token),
            "name": name,
            "project_id": owner.project_id,
            "principal_id": owner.principal_id,
            "user_id": owner.user_id,
            "session_id": owner.session_id,
            "run_id": owner.run_id,
            "is_admin": is_admin,
            "expires_at": expires_at,
        }
        async with self.database.transaction(
            MemoryOwner(tenant_id=owner.tenant_id), admin=True
        ) as conn:
            row = await (await conn.execute(query("token_insert"), params)).fetchone()
        assert row is not None
        record = AccessToken(
            id=row["id"],
            name=name,
            owner=owner,
            is_admin=is_admin,
            created_at=row["created_at"],
            expires_at=expires_at,
            revoked_at=None,
        )
        return IssuedToken(token=token, record=record)

    async def revoke(self, tenant_id: str, token_id: str) -> None:
        """Revoke one of ``tenant_id``'s tokens at once (elevated role).

        Raises:
            MemoryNotFoundError: the tenant has no live token with that id.
        """
        async with self.database.transaction(MemoryOwner(tenant_id=tenant_id), admin=True) as conn:
            row = await (
                await conn.execute(
                    query("token_revoke"), {"tenant_id": tenant_id, "token_id": token_id}
                )
            ).fetchone()
        if row is None:
            raise MemoryNotFoundError(
                f"tenant {tenant_id!r} has no live token with id {token_id!r}"
            )

    async def list(self, tenant_id: str) -> list[AccessToken]:
        """Every token of ``tenant_id``, revoked ones included, newest first."""
        async with self.database.transaction(MemoryOwner(tenant_id=tenant_id), admin=True) as conn:
            rows = await (
                await conn.execute(query("token_list"), {"tenant_id": tenant_id})
            ).fetchall()
        return [AccessToken.from_row(r) for r in rows]

    async def authenticate(self, token: str) -> AccessToken | None:
        """The live token ``token`` is, or None (unknown, revoked or expired).

        Reads one row as the application role and writes nothing.
        """
        if not isinstance(token, str) or not token or len(token) > _MAX_TOKEN_CHARS:
            return None
        digest = hash_token(token)
        async with self.database.transaction(None) as conn:
            await conn.execute(query("token_holder"), {"token_hash": digest})
            row = await (
                await conn.execute(query("token_identity"), {"token_hash": digest})
            ).fetchone()
        return AccessToken.from_row(row) if row is not None else None
