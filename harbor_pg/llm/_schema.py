"""Turn a pydantic model into an OpenAI ``json_schema`` response format (private).

OpenAI's strict structured output accepts a subset of JSON Schema: every
object closes ``additionalProperties``, lists every property as required, and
``$ref`` stands alone. :func:`strict_schema` rewrites a pydantic schema into
that subset when the *shape* allows it, and drops the validation keywords the
subset does not promise to honour (lengths, unusual formats): the answer is
validated by pydantic afterwards anyway, so nothing is lost. A shape that
cannot be closed (an open ``dict``, an ``Any`` field) makes the schema
non-strict instead: the model is still shown the schema, just not held to it.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import BaseModel

__all__ = ["response_format_for", "schema_name", "strict_schema"]

# Keywords kept in strict mode (structure, composition, documentation).
_STRUCTURAL = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "description",
        "title",
    }
)
# Validation keywords strict mode is documented to honour.
_SUPPORTED_VALIDATION = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "pattern",
    }
)
_SUPPORTED_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)


class _NotStrict(Exception):
    """The schema's shape cannot be expressed in strict mode."""


def schema_name(schema: type[BaseModel]) -> str:
    """A response-format name OpenAI accepts (``^[A-Za-z0-9_-]{1,64}$``)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", schema.__name__)[:64]
    return name or "response"


def _resolve(ref: str, defs: dict[str, Any]) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise _NotStrict(f"unresolvable $ref {ref!r}")
    resolved: dict[str, Any] = defs[ref[len(prefix) :]]
    return resolved


def _strictify(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_strictify(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node and len(node) > 1:
        # strict mode wants $ref alone: inline the target and keep the siblings
        # (typically a field description)
        merged = {**_resolve(node["$ref"], defs), **{k: v for k, v in node.items() if k != "$ref"}}
        return _strictify(merged, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        merged = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        return _strictify(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "format":
            if value in _SUPPORTED_FORMATS:
                out[key] = value
        elif key in ("properties", "$defs"):
            out[key] = {name: _strictify(sub, defs) for name, sub in value.items()}
        elif key in _STRUCTURAL or key in _SUPPORTED_VALIDATION:
            out[key] = _strictify(value, defs)
        elif key in (
            "default",
            "examples",
            "minLength",
            "maxLength",
            "uniqueItems",
            "readOnly",
            "writeOnly",
            "deprecated",
        ):
            continue  # validation pydantic re-applies, or documentation only
        else:
            raise _NotStrict(f"keyword {key!r} is not allowed in strict mode")
    if not any(k in out for k in ("type", "$ref", "anyOf", "enum", "const")):
        raise _NotStrict("a value without a type (Any)")
    types = out.get("type")
    is_object = types == "object" or (isinstance(types, list) and "object" in types)
    if is_object:
        extra = node.get("additionalProperties", False)
        if extra not in (False, None) or "properties" not in out:
            raise _NotStrict("an open object (dict)")
        out["additionalProperties"] = False
        out["required"] = list(out["properties"])
    return out


def strict_schema(schema: type[BaseModel]) -> dict[str, Any] | None:
    """Return a strict-mode rewrite of ``schema``'s JSON schema, or None if impossible."""
    raw = copy.deepcopy(schema.model_json_schema())
    defs = raw.get("$defs", {})
    try:
        result: dict[str, Any] = _strictify(raw, defs)
    except _NotStrict:
        return None
    if result.get("type") != "object":
        return None  # strict mode needs an object at the root
    return result


def response_format_for(schema: type[BaseModel]) -> dict[str, Any]:
    """The ``response_format`` argument for ``schema``: strict when the shape allows."""
    strict = strict_schema(schema)
    return {
        "type": "json_schema",
        "json_schema": {
            "name": schema_name(schema),
            "schema": strict if strict is not None else schema.model_json_schema(),
            "strict": strict is not None,
        },
    }
