"""Checks of caller input at the public API, before anything reaches the driver.

Each raises :class:`~harbor_pg.errors.MemoryValidationError` with one line
naming what was wrong, so bad input is never reported as a database failure
and never escapes as a raw ``TypeError``, ``UnicodeEncodeError``,
``OverflowError`` or ``RecursionError``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from harbor_pg.errors import MemoryValidationError

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_TTL_SECONDS",
    "MIN_TTL_SECONDS",
    "check_as_of",
    "check_content",
    "check_count",
    "check_json",
    "check_seconds",
    "check_text",
    "check_ttl",
    "first_error",
    "json_problem",
    "text_problem",
]

#: Deepest nesting accepted in metadata and working state (PostgreSQL's jsonb
#: and Python's json module both give out a few thousand levels down).
MAX_JSON_DEPTH = 100
#: The shortest TTL: the database keeps microseconds, so anything shorter
#: expires the state as it is written.
MIN_TTL_SECONDS = 0.001
#: The longest TTL, 100 years: the expiry must stay a time Python can read back.
MAX_TTL_SECONDS = 100 * 365.25 * 86400
# Python writes at most 4300 digits of an integer (about 14,000 bits) by default
_MAX_INT_BITS = 4096


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as PostgreSQL text (None: it can): a NUL
    character, or a lone surrogate (not encodable as UTF-8)."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def check_text(value: object, what: str, *, optional: bool = False) -> None:
    """``value`` is a string PostgreSQL can store (or None when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise MemoryValidationError(f"{what} must be a string, got {type(value).__name__}")
    problem = text_problem(value)
    if problem is not None:
        raise MemoryValidationError(f"{what} {problem}")


def json_problem(value: object, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` cannot be stored as jsonb (None: it can), found without
    recursion: a non-JSON type, a non-finite number, a non-string key, a string
    with a NUL or a lone surrogate, or nesting deeper than ``max_depth``."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"is nested deeper than {max_depth} levels"
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"has a key of type {type(key).__name__} (keys must be strings)"
                problem = text_problem(key)
                if problem is not None:
                    return f"has a key that {problem}"
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"has a string that {problem}"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if item.bit_length() > _MAX_INT_BITS:
                return "has an integer too large to store"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "has a number that is NaN or infinite"
        else:
            return f"has a value of type {type(item).__name__} (not JSON)"
    return None


def check_content(value: object, what: str, max_chars: int) -> None:
    """``value`` is a string of at most ``max_chars`` characters PostgreSQL can store."""
    if not isinstance(value, str):
        raise MemoryValidationError(f"{what} must be a string")
    if len(value) > max_chars:
        raise MemoryValidationError(
            f"{what} is {len(value)} characters; the limit is "
            f"{max_chars} (MemoryManagerConfig.max_content_chars)"
        )
    check_text(value, what)


def check_json(value: object, what: str) -> None:
    """``value`` is a dict that can be stored as jsonb (see :func:`json_problem`)."""
    if not isinstance(value, dict):
        raise MemoryValidationError(f"{what} must be a dict, got {type(value).__name__}")
    problem = json_problem(value)
    if problem is not None:
        raise MemoryValidationError(f"{what} {problem}")


def check_as_of(value: object, what: str = "as_of") -> datetime | None:
    """``value`` is None or a ``datetime`` (a date alone, a string or a number is
    refused here, not by the database's cast); returned as it is."""
    if value is not None and not isinstance(value, datetime):
        raise MemoryValidationError(
            f"{what} must be a datetime or None, got {type(value).__name__}"
        )
    return value


def check_count(value: object, what: str) -> int:
    """``value`` is a whole number >= 0 (not a bool); returned as an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemoryValidationError(f"{what} must be an integer, got {type(value).__name__}")
    if value < 0:
        raise MemoryValidationError(f"{what} must be >= 0")
    return value


def check_seconds(
    value: object, what: str, *, minimum: float = 0.0, maximum: float = math.inf
) -> float:
    """``value`` is a finite number of seconds > 0, in [``minimum``, ``maximum``]
    (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MemoryValidationError(f"{what} must be a number, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        raise MemoryValidationError(f"{what} is too large") from None
    if not math.isfinite(seconds):
        raise MemoryValidationError(f"{what} must be finite")
    if seconds <= 0 or seconds < minimum:
        floor = f"at least {minimum} seconds" if minimum > 0 else "more than 0"
        raise MemoryValidationError(f"{what} must be a positive number, {floor}")
    if seconds > maximum:
        raise MemoryValidationError(f"{what} must be at most {maximum:.0f} seconds")
    return seconds


def check_ttl(value: Any) -> float:
    """A working-state TTL: a finite number of seconds between :data:`MIN_TTL_SECONDS`
    and :data:`MAX_TTL_SECONDS`."""
    return check_seconds(value, "ttl_seconds", minimum=MIN_TTL_SECONDS, maximum=MAX_TTL_SECONDS)


def first_error(exc: Exception) -> str:
    """The first problem a pydantic ``ValidationError`` reports (``field: message``),
    or the text of any other exception."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        err = errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))
    return str(exc)
