"""Every public entry point carries its documentation.

The names ``harbor_pg`` exports, and the public methods and properties their
classes define, each have a docstring (help() and IDEs show it). Protocol
implementations document their own methods rather than relying on the
protocol's text, which help() on the concrete class does not show.
"""

from __future__ import annotations

import inspect
from typing import Any

import harbor_pg


def _own_members(cls: type) -> list[tuple[str, Any]]:
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, classmethod | staticmethod):
            value = value.__func__
        if isinstance(value, property) or inspect.isfunction(value):
            members.append((name, value))
    return members


def test_every_exported_name_is_documented() -> None:
    missing = [name for name in harbor_pg.__all__ if not inspect.getdoc(getattr(harbor_pg, name))]
    assert missing == []


def test_every_public_method_of_an_exported_class_is_documented() -> None:
    missing = []
    for name in harbor_pg.__all__:
        obj = getattr(harbor_pg, name)
        if not inspect.isclass(obj):
            continue
        for member, value in _own_members(obj):
            if not (value.__doc__ or "").strip():
                missing.append(f"{name}.{member}")
    assert missing == []


def test_every_error_class_is_exported_from_the_package() -> None:
    """A caller catches what the package raises without importing its modules
    (harbor_pg.MemoryNotFoundError was raised by revoke_access_token but not exported)."""
    from harbor_pg import errors

    missing = [name for name in errors.__all__ if name not in harbor_pg.__all__]
    assert missing == []
    assert harbor_pg.MemoryNotFoundError is errors.MemoryNotFoundError
