"""Load the SQL that ships with the package (``sql/`` at the top of the repo).

Queries live in ``sql/queries/*.sql`` under ``-- name: <name>`` headers, each
followed by a one-line description comment; they are parsed once and looked up
by name, so no SQL text is scattered through the Python code.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources
from importlib.abc import Traversable

__all__ = ["CITUS_FILES", "idempotent_files", "idempotent_sha256", "query", "read_sql", "sql_root"]

#: Re-runnable files applied after the schema on every install and upgrade, in order.
IDEMPOTENT_FILES: tuple[str, ...] = (
    "functions/identity.sql",
    "functions/guards.sql",
    "functions/maintenance.sql",
    "functions/tiers.sql",
    # recall (sql/functions/recall/): each file only calls what the ones before it define
    "functions/recall/owner_keys.sql",
    "functions/recall/tokens.sql",
    "functions/recall/context_hash.sql",
    "functions/recall/dense.sql",
    "functions/recall/lexical.sql",
    "functions/recall/ranking.sql",
    "functions/profile.sql",
    "functions/consolidate.sql",
    "functions/changes.sql",
    "policies/policies.sql",
    "policies/tokens.sql",
    "policies/locks.sql",
    "policies/jobs.sql",
    "functions/jobs.sql",
    "functions/views.sql",
    "functions/grants.sql",
)
#: The Citus forms (harbor_pg.db.citus applies them on a distributed database, after the
#: files above): part of the sha256 too, so that `harbor-pg migrate` re-applies them when
#: they change.
CITUS_FILES: tuple[str, ...] = (
    "citus/views.sql",
    "citus/successor.sql",
    "citus/global.sql",
    "citus/delegated.sql",
    "citus/append.sql",
    "citus/recall.sql",
    "citus/save.sql",
    "citus/search.sql",
    "citus/recent.sql",
    "citus/working.sql",
    "citus/summary.sql",
    "citus/get.sql",
    "citus/current.sql",
    "citus/profile.sql",
    "citus/delete.sql",
    "citus/clear.sql",
    "citus/summary_write.sql",
    "citus/consolidate.sql",
    "citus/history.sql",
    "citus/lease.sql",
    "citus/close.sql",
    "citus/turns.sql",
    "citus/expire.sql",
    "citus/fact.sql",
    "citus/erase.sql",
    "citus/hits.sql",
)

_NAME = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def sql_root() -> Traversable:
    """The directory holding the shipped SQL files."""
    return resources.files("harbor_pg._sql")


def read_sql(relative: str) -> str:
    """Return the text of one shipped SQL file, e.g. ``"schema.sql"``."""
    node = sql_root()
    for part in relative.split("/"):
        node = node.joinpath(part)
    return node.read_text(encoding="utf-8")


def idempotent_files() -> list[tuple[str, str]]:
    """(name, text) of every re-runnable file, in application order."""
    return [(name, read_sql(name)) for name in IDEMPOTENT_FILES]


def idempotent_sha256() -> str:
    """The sha256 of every re-runnable file and Citus form (names and texts, in order): a
    migration re-applies them only when the one recorded in the database differs."""
    digest = hashlib.sha256()
    for name, text in [*idempotent_files(), *((n, read_sql(n)) for n in CITUS_FILES)]:
        for part in (name, text):
            data = part.encode("utf-8")
            digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


@functools.cache
def _queries() -> dict[str, str]:
    out: dict[str, str] = {}
    folder = sql_root().joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda t: t.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in out:
                raise RuntimeError(f"duplicate query name {name!r} in {entry.name}")
            out[name] = body.strip()
    return out


def query(name: str) -> str:
    """The text of the named query (``KeyError`` names the missing query)."""
    try:
        return _queries()[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r} under sql/queries/") from None
