"""Who may use the inspector, and as which identity.

Two rules, checked on every request:

* **The token rule.** Bound to a loopback address (the default, 127.0.0.1),
  the inspector serves whoever can reach the port on this machine. Bound to
  any other address it answers nothing without a live access token (the MCP
  server's, ``harbor-pg token create``), presented as ``Authorization: Bearer
  <token>`` or through the login form, which keeps it in an HttpOnly cookie.
  The token is looked up on every request, so a revoked one stops working at
  once.
* **One identity at a time.** Every page reads as one :class:`MemoryOwner`,
  chosen on the identity page and kept in a cookie. What may be chosen is
  narrowed by a :class:`Gate`: a token that is not an administrator's fixes
  the identity to exactly the token's; an administrator's token fixes its
  tenant; a login bound with ``harbor.bind_role`` fixes what the binding names.
  Whatever is chosen, the database has the last word: each read sets the
  identity with ``harbor.set_identity`` and row-level security filters it.
"""

from __future__ import annotations

import base64
import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from harbor_pg.errors import MemoryScopeError
from harbor_pg.owner import MemoryOwner

__all__ = [
    "IDENTITY_COOKIE",
    "TOKEN_COOKIE",
    "Gate",
    "decode_identity",
    "encode_identity",
    "is_loopback",
]

#: the cookie holding the chosen identity (its fields, as base64 JSON)
IDENTITY_COOKIE = "harbor_inspect_as"
#: the cookie holding the access token given on the login form
TOKEN_COOKIE = "harbor_inspect_token"
_FIELDS = ("tenant_id", "project_id", "user_id", "session_id", "run_id")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from
    this machine. A name other than ``localhost`` counts as not loopback (it may
    resolve to anything), and so do the wildcard addresses (``0.0.0.0``, ``::``)."""
    text = host.strip().strip("[]").lower()
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def encode_identity(owner: MemoryOwner) -> str:
    """``owner``'s fields as the identity cookie's value."""
    data = {f: getattr(owner, f) for f in _FIELDS if getattr(owner, f) is not None}
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_identity(value: str | None) -> MemoryOwner | None:
    """The identity a cookie value names, or None when it names none (or is malformed)."""
    if not value or len(value) > 4096:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(value.encode("ascii")))
    except (ValueError, UnicodeError):
        return None
    if not isinstance(data, dict) or set(data) - set(_FIELDS):
        return None
    try:
        return MemoryOwner(**{k: v for k, v in data.items() if v})
    except MemoryScopeError:
        return None


def owner_from_fields(fields: dict[str, Any]) -> MemoryOwner:
    """An identity from form fields (blank ones left out); MemoryScopeError when invalid."""
    data = {}
    for name in _FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value.strip():
            data[name] = value.strip()
    if "tenant_id" not in data:
        raise MemoryScopeError("an identity needs a tenant")
    return MemoryOwner(**data)


@dataclass(frozen=True)
class Gate:
    """What one request may act as.

    ``tenant``: the only tenant allowed (None: any). ``exact``: the only
    identity allowed (a non-administrator's token). ``project`` and ``user``:
    the fields a role binding forces (None: free, unless ``bound`` forces
    them to stay unset).
    """

    tenant: str | None = None
    exact: MemoryOwner | None = None
    bound: bool = False
    project: str | None = None
    user: str | None = None
    why: str = ""

    @property
    def fixed(self) -> bool:
        """Whether there is nothing to choose."""
        return self.exact is not None

    def allows(self, owner: MemoryOwner) -> bool:
        """Whether a request through this gate may read as ``owner``."""
        if self.exact is not None:
            return _fields(owner) == _fields(self.exact)
        if self.tenant is not None and owner.tenant_id != self.tenant:
            return False
        if self.bound:
            if owner.project_id != self.project or owner.user_id != self.user:
                return False
            if self.user is None and (owner.session_id or owner.run_id):
                return False
        return True

    def default(self) -> MemoryOwner | None:
        """The identity to read as before one is chosen (None: ask)."""
        if self.exact is not None:
            return self.exact
        if self.bound and self.tenant is not None:
            return MemoryOwner(tenant_id=self.tenant, project_id=self.project, user_id=self.user)
        return None

    def narrow(self, owner: MemoryOwner | None) -> MemoryOwner | None:
        """``owner`` if this gate allows it, else the default."""
        if owner is not None and self.allows(owner):
            return owner
        return self.default()


def _fields(owner: MemoryOwner) -> tuple[str | None, ...]:
    return tuple(getattr(owner, f) for f in _FIELDS)


def with_fields(owner: MemoryOwner, **changes: str | None) -> MemoryOwner:
    """``owner`` with some fields replaced (None removes one)."""
    data = {f: getattr(owner, f) for f in _FIELDS}
    data.update(changes)
    return MemoryOwner(**{k: v for k, v in data.items() if v is not None})
