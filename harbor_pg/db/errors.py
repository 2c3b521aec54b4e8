"""The one map from database errors to the package's exceptions.

Every database failure a user sees passes through here, whichever path met it
(the pools, a migration, the server checks, the command line), so bad input,
a refused permission and an outage read the same everywhere:

* :func:`harbor_error` for a statement that failed, keyed on its SQLSTATE class;
* :func:`connect_error` for a connection that could not be opened at all (a
  bad URL, bad credentials, no server: a configuration to fix);
* :func:`migration_error` for a failed migration step, which adds the hints a
  migration needs (the extensions to create, the role to migrate as).

What they say never carries a password: the URLs a caller names are scrubbed
(:func:`scrub`), and so is anything in the driver's text shaped like one.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import NoReturn
from urllib.parse import unquote

import psycopg

from harbor_pg.errors import (
    MemoryConcurrencyError,
    MemoryConfigurationError,
    MemoryDatabaseError,
    MemoryError,
    MemoryNotFoundError,
    MemoryScopeError,
    MemoryValidationError,
)

__all__ = [
    "connect_error",
    "connect_errors",
    "describe_connect_error",
    "driver_errors",
    "first_line",
    "harbor_error",
    "migration_error",
    "raise_harbor_error",
    "redact",
    "scrub",
    "wrap_db_errors",
    "wrap_sync",
]


# -- passwords out of what the user sees ----------------------------------------


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (URL or key=value form)."""
    return _KV_PASSWORD.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", url))


_KV_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)
# scheme://user:password@ -- the password runs to the last '@' of the token, so
# one with an unencoded '/', ':' or '@' in it is covered too (urllib would split
# it at the '/' and report only the part before it)
_URL_USERINFO = re.compile(r"([A-Za-z][\w+.-]*://[^\s:/@]*:)(\S*)@")
# user:password@ in anything that looks like a URL's user part (driver messages)
_USERINFO = re.compile(r"((?:^|[\s\"'/])[^\s\"'/:@]*:)[^\s\"'/@]*@")


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    for m in _URL_USERINFO.finditer(url):
        found += [m.group(2), unquote(m.group(2))]
    for m in _KV_PASSWORD.finditer(url):
        found.append(m.group(2).strip("'"))
    return [p for p in found if p]


def scrub(text: str, *urls: str | None) -> str:
    """``text`` (say, a driver's message) with the passwords of ``urls`` and
    any ``user:password@`` or ``password=...`` in it replaced by ``***``."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, redact(url))
        for password in _passwords(url):
            text = text.replace(password, "***")
    return _KV_PASSWORD.sub(r"\1***", _USERINFO.sub(r"\1***@", _URL_USERINFO.sub(r"\1***@", text)))


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s text (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- a statement that failed -----------------------------------------------------

#: SQLSTATE classes (the first two characters) of errors caused by the input:
#: data exceptions (22: bad value, out of range, bad encoding...), integrity
#: violations (23: check, not null, unique, exclusion), program limits (54: too
#: deep, too large).
_INPUT_CLASSES = frozenset({"22", "23", "54"})
#: ... except a division by zero: a fault of the SQL, not of the input
_NOT_INPUT = frozenset({"22012"})
#: transaction rollbacks: serialization failure (40001), deadlock (40P01)
_CONFLICT_CLASS = "40"
#: the server is not there, or going away: connection exceptions (08),
#: insufficient resources (53), operator intervention (57: shutdown, crash)
_UNAVAILABLE_CLASSES = frozenset({"08", "53", "57"})


#: Citus, when the shard a statement was planned against was replaced (a shard move
#: or a tenant isolation committed between its planning and its execution): the
#: statement, and its transaction, did nothing, and run again they find the new shard
_SHARD_MOVED = re.compile(r"could not find valid entry for shard \d+")


class ShardMovedError(MemoryConcurrencyError):
    """A statement met a shard that a move or an isolation had just replaced; nothing
    of its transaction was written, and run again it finds the new shard (the one-round
    -trip calls do so themselves, :meth:`Database.retrying` too)."""


def is_shard_moved(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is Citus's error for a statement planned against a shard that a
    move or an isolation replaced before it ran."""
    return (exc.sqlstate or "") == "XX000" and bool(_SHARD_MOVED.search(str(exc)))


def harbor_error(exc: psycopg.Error, *urls: str | None, context: str = "") -> MemoryError:
    """The harbor error for the driver error ``exc``, keyed on its SQLSTATE
    class (psycopg's own classes do not follow them: a class-22 error is a
    ``psycopg.DataError``, a deadlock an ``OperationalError``).

    ``urls``: connection strings the text may quote, whose passwords are
    scrubbed from it. ``context``: what was being done, put before the
    wording (``"migrating ... failed: "``).
    """
    state = exc.sqlstate or ""
    text = first_line(exc)
    if urls:
        text = scrub(text, *urls)
    if state == "42501":
        return MemoryScopeError(f"{context}not permitted: {text}")
    if state == "P0002":  # no_data_found, as harbor.require_turn raises it
        return MemoryNotFoundError(f"{context}{text}")
    if state[:2] in _INPUT_CLASSES and state not in _NOT_INPUT:
        return MemoryValidationError(f"{context}rejected by the database: {text}")
    if state[:2] == _CONFLICT_CLASS:
        return MemoryConcurrencyError(f"{context}conflicting concurrent transaction: {text}")
    if is_shard_moved(exc):
        return ShardMovedError(f"{context}the tenant's shard moved while the statement ran: {text}")
    if is_outage(exc):
        return MemoryDatabaseError(f"{context}database unavailable: {redact(text)}")
    return MemoryDatabaseError(f"{context}database error: {text}")


def is_outage(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the server is not there or going away. With no
    SQLSTATE it is the driver's own error: only a connection failure is an
    outage (a value the driver cannot load, say, is not)."""
    state = exc.sqlstate or ""
    return (not state and isinstance(exc, psycopg.OperationalError)) or (
        state[:2] in _UNAVAILABLE_CLASSES
    )


def raise_harbor_error(exc: psycopg.Error, *urls: str | None, context: str = "") -> NoReturn:
    """Raise :func:`harbor_error` of ``exc``. An unclassified server error
    keeps its driver traceback; the rest need none (and an outage's could
    carry a connection string)."""
    error = harbor_error(exc, *urls, context=context)
    keep = type(error) is MemoryDatabaseError and not is_outage(exc) and not urls
    raise error from (exc if keep else None)


#: what the driver raises for a parameter it cannot send (a lone surrogate in a
#: string, a number beyond its type); the public API checks its input first, so
#: this is the backstop for values that slip past
ADAPTATION_ERRORS = (UnicodeEncodeError, OverflowError)


def raise_unsendable(exc: Exception) -> NoReturn:
    raise MemoryValidationError(f"a value cannot be sent to the database: {exc}") from None


# wrap_sync below is its synchronous twin, on purpose: one context manager cannot be both.
@contextlib.asynccontextmanager
async def wrap_db_errors() -> AsyncIterator[None]:
    """Turn driver errors into harbor errors, keyed on SQLSTATE and constraint."""
    try:
        yield
    except psycopg.Error as exc:
        raise_harbor_error(exc)
    except ADAPTATION_ERRORS as exc:
        raise_unsendable(exc)


# The synchronous twin of wrap_db_errors, on purpose: one context manager cannot be both.
@contextlib.contextmanager
def wrap_sync() -> Iterator[None]:
    """:func:`wrap_db_errors` for synchronous code."""
    try:
        yield
    except psycopg.Error as exc:
        raise_harbor_error(exc)
    except ADAPTATION_ERRORS as exc:
        raise_unsendable(exc)


@contextlib.contextmanager
def driver_errors(*urls: str | None, context: str = "") -> Iterator[None]:
    """Driver errors raised in the body come out as :func:`harbor_error`
    (``urls`` and ``context`` as for it); nothing else is touched."""
    try:
        yield
    except psycopg.Error as exc:
        raise_harbor_error(exc, *urls, context=context)


# -- a connection that could not be opened --------------------------------------


def describe_connect_error(url: str, exc: BaseException) -> str:
    """One line naming why a connection failed, without the password."""
    text = first_line(exc)
    low = str(exc).lower()
    where = redact(url)
    if "password authentication failed" in low or "authentication failed" in low:
        reason = "bad credentials (authentication failed)"
    elif "no password supplied" in low:
        reason = "bad credentials (the server wants a password)"
    elif "does not exist" in low and "database" in low:
        reason = "the database does not exist"
    elif "does not exist" in low and "role" in low:
        reason = "bad credentials (the role does not exist)"
    elif (
        "connection refused" in low
        or "could not connect" in low
        or "timeout" in low
        or "no such file" in low
        or "could not translate host name" in low
        or "name or service not known" in low
    ):
        reason = "the server is unreachable"
    else:
        reason = scrub(text, url)
    return f"cannot connect to PostgreSQL at {where}: {reason}"


def connect_error(url: str, exc: BaseException) -> MemoryConfigurationError:
    """The harbor error for a connection to ``url`` that could not be opened:
    the URL, the credentials or the server's whereabouts need fixing."""
    return MemoryConfigurationError(describe_connect_error(url, exc))


@contextlib.contextmanager
def connect_errors(url: str) -> Iterator[None]:
    """A driver error while opening a connection to ``url`` in the body comes
    out as :func:`connect_error`."""
    try:
        yield
    except psycopg.Error as exc:
        raise connect_error(url, exc) from None


# -- a migration step that failed -----------------------------------------------


def migration_error(url: str, revision: str, exc: BaseException) -> MemoryError:
    """The harbor error for a migration of ``url`` to ``revision`` that failed
    with ``exc`` (a driver error, or what SQLAlchemy wrapped one in).

    A connection that could not be opened is :func:`connect_error`; otherwise
    the wording is :func:`harbor_error`'s after ``migrating <url> to
    <revision> failed:``. A missing extension or a refused privilege is a
    :class:`MemoryConfigurationError` (the database or the login must change,
    not the input), the first with the statements that fix it.
    """
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        return connect_error(url, exc)
    context = f"migrating {redact(url)} to {revision} failed: "
    if isinstance(exc, psycopg.Error):
        error = harbor_error(exc, url, context=context)
    else:  # not from the driver: no SQLSTATE to go by
        error = MemoryDatabaseError(f"{context}database error: {scrub(first_line(exc), url)}")
    low = first_line(exc).lower()
    if 'access method "gist"' in low or 'type "vector"' in low or "extension" in low:
        return MemoryConfigurationError(
            f"{error}. The vector and btree_gist extensions must be installed in this "
            "database: as a superuser, run `create extension if not exists vector; "
            "create extension if not exists btree_gist;` in it"
        )
    if isinstance(error, MemoryScopeError):
        return MemoryConfigurationError(str(error))
    return error
