"""Owners and scopes: the isolation key every row is written under.

A :class:`MemoryOwner` is built from the authenticated request context. How much
of it is load-bearing depends on the :class:`MemoryScope` of the row:

======== =========================================================
Scope    Owner fields that must match
======== =========================================================
GLOBAL   none
TENANT   tenant_id
PROJECT  tenant_id, project_id
USER     tenant_id, user_id
SESSION  tenant_id, user_id, session_id
RUN      tenant_id, project_id, user_id, session_id, run_id
======== =========================================================

``user_id`` defaults to ``principal_id`` when omitted, so the same human is one
visibility key whether or not the caller spells out ``user_id``.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from harbor_pg.errors import MemoryScopeError

__all__ = [
    "MAX_ID_LENGTH",
    "SCOPE_OWNER_FIELDS",
    "MemoryOwner",
    "MemoryScope",
    "check_caller",
    "guarded",
    "narrow_owner",
    "scope_owner_fields",
]

MAX_ID_LENGTH = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class MemoryScope(enum.StrEnum):
    """How widely a memory is shared. Narrowest last in :data:`SCOPE_WIDTH` order."""

    GLOBAL = "global"
    TENANT = "tenant"
    PROJECT = "project"
    USER = "user"
    SESSION = "session"
    RUN = "run"

    @property
    def narrowness(self) -> int:
        """Higher is narrower; ties in recall break toward the narrower scope."""
        return _NARROWNESS[self]


_NARROWNESS = {
    MemoryScope.GLOBAL: 0,
    MemoryScope.TENANT: 1,
    MemoryScope.PROJECT: 2,
    MemoryScope.USER: 3,
    MemoryScope.SESSION: 4,
    MemoryScope.RUN: 5,
}

#: Which owner fields a scope keys on (the seed's scope table).
SCOPE_OWNER_FIELDS: dict[MemoryScope, tuple[str, ...]] = {
    MemoryScope.GLOBAL: (),
    MemoryScope.TENANT: ("tenant_id",),
    MemoryScope.PROJECT: ("tenant_id", "project_id"),
    MemoryScope.USER: ("tenant_id", "user_id"),
    MemoryScope.SESSION: ("tenant_id", "user_id", "session_id"),
    MemoryScope.RUN: ("tenant_id", "project_id", "user_id", "session_id", "run_id"),
}

#: Fields a scope cannot do without (RUN tolerates a missing project).
_REQUIRED_FIELDS: dict[MemoryScope, tuple[str, ...]] = {
    **SCOPE_OWNER_FIELDS,
    MemoryScope.RUN: ("tenant_id", "user_id", "session_id", "run_id"),
}


def scope_owner_fields(scope: MemoryScope | str) -> tuple[str, ...]:
    """Return the owner fields ``scope`` keys on."""
    return SCOPE_OWNER_FIELDS[MemoryScope(scope)]


class MemoryOwner(BaseModel):
    """The identity a row is written under, or a query is issued as.

    Build it from authenticated request context, never from user-supplied
    fields. Ids must be non-empty, at most ``MAX_ID_LENGTH`` characters, and free
    of control characters; violations raise :class:`MemoryScopeError` before any
    SQL runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str
    project_id: str | None = None
    principal_id: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    run_id: str | None = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except MemoryScopeError:
            raise
        except Exception as exc:  # pydantic ValidationError -> our error, one clear line
            raise MemoryScopeError(f"invalid MemoryOwner: {_first_error(exc)}") from None

    @field_validator(
        "tenant_id",
        "project_id",
        "principal_id",
        "user_id",
        "session_id",
        "run_id",
        mode="before",
    )
    @classmethod
    def _check_id(cls, value: object, info: Any) -> object:
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"{info.field_name} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise ValueError(f"{info.field_name} must not be empty")
        if len(value) > MAX_ID_LENGTH:
            raise ValueError(f"{info.field_name} is longer than {MAX_ID_LENGTH} characters")
        if _CONTROL.search(value):
            raise ValueError(f"{info.field_name} contains control characters")
        if _SURROGATE.search(value):
            raise ValueError(f"{info.field_name} is not valid Unicode (a lone surrogate)")
        return value

    @model_validator(mode="after")
    def _derive_user(self) -> MemoryOwner:
        if self.user_id is None and self.principal_id is not None:
            object.__setattr__(self, "user_id", self.principal_id)
        return self

    def require(self, *fields: str) -> None:
        """Raise :class:`MemoryScopeError` unless every named field is set."""
        missing = [f for f in fields if getattr(self, f) is None]
        if missing:
            raise MemoryScopeError(f"owner is missing {', '.join(missing)}")

    def can_address(self, scope: MemoryScope | str) -> bool:
        """True when this owner carries every field ``scope`` needs."""
        return all(getattr(self, f) is not None for f in _REQUIRED_FIELDS[MemoryScope(scope)])

    def require_scope(self, scope: MemoryScope | str) -> None:
        """Raise :class:`MemoryScopeError` unless this owner can address ``scope``."""
        scope = MemoryScope(scope)
        missing = [f for f in _REQUIRED_FIELDS[scope] if getattr(self, f) is None]
        if missing:
            raise MemoryScopeError(f"scope {scope.value!r} needs owner fields {', '.join(missing)}")

    def narrowed(self, scope: MemoryScope | str) -> MemoryOwner:
        """This owner reduced to exactly the fields ``scope`` keys on."""
        return narrow_owner(self, scope)

    def key(self, scope: MemoryScope | str) -> dict[str, str]:
        """The owner columns a row of ``scope`` is stored under ('' = not keyed)."""
        scope = MemoryScope(scope)
        self.require_scope(scope)
        fields = SCOPE_OWNER_FIELDS[scope]
        return {
            f: (getattr(self, f) or "") if f in fields else ""
            for f in ("tenant_id", "project_id", "user_id", "session_id", "run_id")
        }


def narrow_owner(owner: MemoryOwner, scope: MemoryScope | str) -> MemoryOwner:
    """Return ``owner`` with only the fields ``scope`` keys on (plus tenant)."""
    scope = MemoryScope(scope)
    owner.require_scope(scope)
    keep = set(SCOPE_OWNER_FIELDS[scope]) | {"tenant_id"}
    data = {f: getattr(owner, f) for f in keep if getattr(owner, f) is not None}
    if "user_id" in keep and owner.principal_id is not None:
        data["principal_id"] = owner.principal_id
    return MemoryOwner(**data)


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            msg = str(first.get("msg", exc)).removeprefix("Value error, ")
            return f"{loc}: {msg}" if loc and loc not in msg else msg
        except Exception:  # pragma: no cover - defensive
            pass
    return str(exc)


# -- the caller a facade is bound to ---------------------------------------------------

_T = TypeVar("_T")


def check_caller(caller: MemoryOwner | None, owner: MemoryOwner) -> None:
    """Reject ``owner`` unless it is exactly ``caller`` (nothing to check without one).

    Every identity field must be equal, unset ones included: an owner that adds
    a field the caller does not carry (a ``project_id``, a ``run_id``) would
    widen what a call reads or writes beyond the authenticated caller.
    """
    if caller is None:
        return
    if not isinstance(owner, MemoryOwner):
        raise MemoryScopeError(f"owner must be a MemoryOwner, got {type(owner).__name__}")
    for name in MemoryOwner.model_fields:
        if getattr(owner, name) != getattr(caller, name):
            raise MemoryScopeError(
                f"owner does not match the authenticated caller ({name} differs)"
            )


def guarded(helper: _T, caller: MemoryOwner | None) -> _T:
    """``helper`` as a facade bound to ``caller`` hands it out: each method call that
    passes a :class:`MemoryOwner` is checked with :func:`check_caller` first."""
    if caller is None:
        return helper
    return cast(_T, _CallerGuard(helper, functools.partial(check_caller, caller)))


class _CallerGuard:
    """A helper handed out by a bound facade: each method call that passes a
    :class:`MemoryOwner` (positionally or by keyword) is checked against the
    bound caller first; everything else is the helper's own."""

    def __init__(self, target: Any, check: Callable[[MemoryOwner], None]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_check", check)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        check = self._check

        @functools.wraps(value)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, MemoryOwner):
                    check(arg)
            return value(*args, **kwargs)

        return guarded

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"<bound {self._target!r}>"
