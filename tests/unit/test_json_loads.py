"""The pools' JSON loader: empty objects skip the parser, everything else parses."""

from __future__ import annotations

from harbor_pg.db.connection import _json_loads


def test_empty_objects_are_new_dicts_each_time() -> None:
    first, second = _json_loads(b"{}"), _json_loads(b"{}")
    assert first == {} and second == {}
    first["k"] = 1
    assert second == {} and _json_loads(b"{}") == {}


def test_everything_else_is_parsed() -> None:
    assert _json_loads(b'{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
    assert _json_loads(b"[]") == [] and _json_loads(b'"{}"') == "{}"
    assert _json_loads(b" {} ") == {} and _json_loads("{}") == {}


def test_empty_lists_are_new_lists_each_time() -> None:
    first, second = _json_loads(b"[]"), _json_loads("[]")
    assert first == [] and second == [] and type(first) is list
    first.append(1)
    assert second == [] and _json_loads(b"[]") == []
    assert _json_loads(b"[ ]") == [] and _json_loads(b"[[]]") == [[]]
