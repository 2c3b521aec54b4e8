"""OpenTelemetry spans, when the ``opentelemetry`` extra is installed.

With ``opentelemetry-api`` importable, recall, the per-turn build, extraction,
save, append and erase each run in a span (tracer ``harbor_pg``); what
happens inside them gets child spans: the query embedding and model calls
(GenAI semantic conventions: ``gen_ai.operation.name``,
``gen_ai.request.model``) and the recall statement (database conventions:
``db.system.name``, ``db.operation.name``, ``db.stored_procedure.name``,
never the statement's parameters). A tracer provider must be configured for
anything to be exported (the API alone records nothing).

Without the package nothing is imported and nothing is emitted: the check
runs once, on the first traced call, never at ``import harbor_pg``.

Spans never carry memory content, queries, prompts or identities: only
names, counts, kinds, scopes, model ids and flags. A failure sets the span's
status to ERROR with ``error.type`` (the exception's class), never its message.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["DB_SYSTEM", "chat_span", "enabled", "model_name", "note", "traced"]

P = ParamSpec("P")
R = TypeVar("R")

#: ``db.system.name`` of every database span.
DB_SYSTEM = "postgresql"
_TRACER_NAME = "harbor_pg"

_state: dict[str, Any] = {}


def _tracer() -> Any:
    """The ``harbor_pg`` tracer, or None when opentelemetry is not installed."""
    try:
        return _state["tracer"]
    except KeyError:
        pass
    tracer = None
    try:
        present = importlib.util.find_spec("opentelemetry") is not None
    except (ImportError, ValueError):
        present = False
    if present:
        try:
            from opentelemetry import trace

            tracer = trace.get_tracer(_TRACER_NAME)
            _state["kinds"] = {
                "internal": trace.SpanKind.INTERNAL,
                "client": trace.SpanKind.CLIENT,
            }
            _state["trace"] = trace
            _state["proxy"] = trace.ProxyTracerProvider
        except ImportError:  # a namespace package without the API
            tracer = None
    _state["tracer"] = tracer
    return tracer


def _recording() -> Any:
    """The tracer when spans would go somewhere: the API is installed and an
    application set a tracer provider. With none set, every span is a no-op
    that still costs two context switches a call (about 0.1 ms of client CPU for
    an append): the call then runs without one."""
    tracer = _tracer()
    if tracer is None or isinstance(_state["trace"].get_tracer_provider(), _state["proxy"]):
        return None
    return tracer


def enabled() -> bool:
    """Whether spans are created (the opentelemetry API is importable)."""
    return _tracer() is not None


def note(key: str, value: Any) -> None:
    """Set an attribute on the current span (nothing without opentelemetry)."""
    if _tracer() is None:
        return
    _state["trace"].get_current_span().set_attribute(key, value)


def traced(
    name: str | Callable[..., str],
    *,
    kind: str = "internal",
    attributes: Callable[..., dict[str, Any]] | dict[str, Any] | None = None,
    result: Callable[[Any], dict[str, Any]] | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Run an async function in a span.

    Args:
        name: the span's name, or a function of the call's arguments giving it.
        kind: ``"internal"`` or ``"client"`` (a call to the database or a model).
        attributes: the span's attributes, or a function of the call's arguments
            giving them (it must not return content).
        result: attributes to add from the return value (counts, flags).
    """

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            tracer = _recording()
            if tracer is None:
                return await fn(*args, **kwargs)
            attrs: dict[str, Any] = {}
            span_name = name if isinstance(name, str) else "harbor_pg"
            try:
                if not isinstance(name, str):
                    span_name = name(*args, **kwargs)
                if callable(attributes):
                    attrs = attributes(*args, **kwargs)
                elif attributes:
                    attrs = dict(attributes)
            except Exception:  # telemetry never breaks the call
                attrs = {}
            trace = _state["trace"]
            with tracer.start_as_current_span(
                span_name,
                kind=_state["kinds"][kind],
                attributes={k: v for k, v in attrs.items() if v is not None},
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    value = await fn(*args, **kwargs)
                except BaseException as exc:
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__qualname__))
                    raise
                if result is not None:
                    try:
                        extra = result(value)
                    except Exception:
                        extra = {}
                    for key, item in extra.items():
                        if item is not None:
                            span.set_attribute(key, item)
                return value

        return wrapper

    return decorate


def model_name(model: Any) -> str:
    """A model's name for ``gen_ai.request.model``: its ``model`` or ``model_name``
    attribute, else its class name."""
    for attr in ("model", "model_name", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def chat_span(purpose: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """A GenAI ``chat`` span around a method of an object whose ``model`` it calls."""

    def attrs(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model_name(self.model),
            "harbor.model.purpose": purpose,
        }

    return traced(
        lambda self, *a, **k: f"chat {model_name(self.model)}", kind="client", attributes=attrs
    )
