"""The exceptions harbor-pg raises.

Every error the package raises on purpose derives from :class:`MemoryError`
(which shadows the builtin only inside this module's namespace; import it as
``harbor_pg.MemoryError``).
"""

from __future__ import annotations

import builtins

__all__ = [
    "MemoryConcurrencyError",
    "MemoryConfigurationError",
    "MemoryDatabaseError",
    "MemoryError",
    "MemoryNotFoundError",
    "MemoryScopeError",
    "MemoryValidationError",
]


class MemoryError(Exception):
    """Base class of every error harbor-pg raises on purpose."""


class MemoryConfigurationError(MemoryError):
    """The library was wired incoherently: an unconfigured tier, a bad policy, a bad server."""


class MemoryScopeError(MemoryError):
    """An owner cannot address the requested scope, or is not the authenticated caller."""


class MemoryValidationError(MemoryError, ValueError):
    """Input was rejected before anything was written (content too long, bad role, ...)."""


class MemoryNotFoundError(MemoryError, LookupError):
    """The requested row does not exist or is not visible to the caller."""


class MemoryDatabaseError(MemoryError):
    """The database failed in a way the caller cannot fix by changing its input."""


class MemoryConcurrencyError(MemoryDatabaseError):
    """Concurrent transactions kept conflicting (deadlock or serialization failure)
    after the library's bounded retries; nothing of the failed call was written.
    Retrying later may succeed."""


# keep a handle on the builtin for modules that need both
BuiltinMemoryError = builtins.MemoryError
