"""The language-model seam: the :class:`MemoryModel` protocol and its error.

harbor-pg talks to a language model for three jobs only (the rolling summary,
the query rewrite and fact extraction), and always through two calls that take
plain ``system`` / ``user`` strings. Anything that implements them is a model:
the bundled OpenAI and LangChain adapters, or a few lines of your own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from harbor_pg.errors import MemoryError

__all__ = [
    "MemoryModel",
    "MemoryModelError",
    "StructuredOutputUnsupportedError",
    "redact_secrets",
    "supports_structured_output",
    "validation_problems",
]

T = TypeVar("T", bound=BaseModel)


class MemoryModelError(MemoryError):
    """A language-model call failed.

    Raised for every model failure: timeouts, transport and HTTP errors (429,
    5xx, ...), refusals, truncated or malformed output, and output that does not
    match the requested schema. The message says what went wrong and never
    contains credentials. ``status_code`` carries the HTTP status when there was
    one; ``raw_output`` the model's answer (cut to a bounded length) when it
    answered something that could not be read.
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, raw_output: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.raw_output = raw_output


class StructuredOutputUnsupportedError(MemoryModelError):
    """The model cannot produce structured output; use ``generate_text`` instead."""


@runtime_checkable
class MemoryModel(Protocol):
    """What harbor-pg needs from a language model.

    Implementations may also carry a boolean ``supports_structured`` attribute;
    when it is false, callers skip :meth:`generate_structured` and fall back to
    plain text (see :func:`supports_structured_output`). An object without the
    attribute is assumed to support structured output.
    """

    async def generate_text(self, system: str, user: str) -> str:
        """Return the model's plain-text answer to ``user`` under ``system``.

        Raises:
            MemoryModelError: on any failure.
        """
        ...

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        """Return the model's answer validated into ``schema``.

        Raises:
            StructuredOutputUnsupportedError: the model cannot do structured output.
            MemoryModelError: on any other failure, including output that does not
                validate against ``schema``.
        """
        ...


def supports_structured_output(model: object) -> bool:
    """True unless ``model`` says (``supports_structured = False``) that it cannot."""
    return bool(getattr(model, "supports_structured", True))


# Shapes of bearer credentials that providers echo back in error bodies.
_SECRET_SHAPES = re.compile(
    r"(?:sk|pk|rk|ak)-[A-Za-z0-9_\-*.]{6,}"  # OpenAI-style keys, incl. partially masked ones
    r"|(?i:bearer)\s+[A-Za-z0-9_\-.=]{8,}"  # Authorization header values
)


def redact_secrets(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Return ``text`` with ``secrets`` and key-shaped tokens replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return _SECRET_SHAPES.sub("***", text)


def validation_problems(exc: ValidationError, limit: int = 5) -> str:
    """The first ``limit`` problems of a model's output, as ``field.path: message; ...``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()[:limit]
    )
