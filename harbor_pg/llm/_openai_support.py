"""Plumbing shared by the OpenAI model and the OpenAI embedder (private).

``openai`` is an optional extra, so it is imported only when a client is
actually built, and its exceptions are turned into one short, credential-free
sentence here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm.base import redact_secrets

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = [
    "ClientSetup",
    "OpenAIFailure",
    "build_client",
    "client_setup",
    "describe_openai_error",
    "import_openai",
]

_INSTALL_HINT = "pip install 'harbor-pg[openai]'"


def import_openai(feature: str) -> ModuleType:
    """Import ``openai`` or raise :class:`MemoryConfigurationError` naming the extra."""
    try:
        return importlib.import_module("openai")
    except ImportError:
        raise MemoryConfigurationError(
            f"{feature} needs the 'openai' package, which is not installed: {_INSTALL_HINT}"
        ) from None


def build_client(
    feature: str,
    *,
    api_key: str | None,
    base_url: str | None,
    timeout: float,
    max_retries: int,
) -> AsyncOpenAI:
    """Build an ``AsyncOpenAI`` client, mapping a missing key to a configuration error."""
    openai = import_openai(feature)
    if timeout <= 0:
        raise MemoryConfigurationError(f"{feature}: timeout must be positive, got {timeout!r}")
    if max_retries < 0:
        raise MemoryConfigurationError(f"{feature}: max_retries must be >= 0, got {max_retries!r}")
    kwargs: dict[str, Any] = {"timeout": timeout, "max_retries": max_retries}
    if api_key is not None:
        kwargs["api_key"] = api_key
    if base_url is not None:
        kwargs["base_url"] = base_url
    try:
        client: AsyncOpenAI = openai.AsyncOpenAI(**kwargs)
    except openai.OpenAIError as exc:
        raise MemoryConfigurationError(
            f"{feature}: could not build the OpenAI client "
            f"({redact_secrets(str(exc), [api_key])}); pass api_key=... or set OPENAI_API_KEY "
            "(any non-empty value for a local OpenAI-compatible server that needs no key)"
        ) from None
    return client


class ClientSetup(NamedTuple):
    """The client an adapter calls, whether it owns it (and so closes it), and the
    timeout its error messages name (None: a client passed in keeps its own)."""

    client: Any
    owns_client: bool
    timeout: float | None


def client_setup(
    feature: str,
    client: Any,
    *,
    api_key: str | None,
    base_url: str | None,
    timeout: float,
    max_retries: int,
) -> ClientSetup:
    """The passed ``client``, or one built with :func:`build_client` (shared by the
    OpenAI chat model and embedder)."""
    if client is None:
        built = build_client(
            feature, api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        return ClientSetup(built, True, timeout)
    import_openai(feature)
    return ClientSetup(client, False, None)


class OpenAIFailure:
    """A described OpenAI client failure: a safe message and the HTTP status, if any."""

    __slots__ = ("message", "status_code")

    def __init__(self, message: str, status_code: int | None) -> None:
        self.message = message
        self.status_code = status_code


def _error_text(body: object, fallback: str) -> str:
    """Pull ``error.message`` out of an OpenAI-style error body."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return fallback


def describe_openai_error(
    exc: BaseException, *, what: str, api_key: str | None, timeout: float | None
) -> OpenAIFailure:
    """Describe an exception raised by an ``openai`` client call.

    The text is redacted of ``api_key`` and anything key-shaped, and cut to a
    readable length: provider error bodies can be long and may echo input.
    An exception that is not the client's own is described by its type.
    """
    openai = importlib.import_module("openai")
    status: int | None = None
    if not isinstance(exc, openai.OpenAIError):
        text = f"{what} failed: {type(exc).__name__}: {exc}"
    elif isinstance(exc, openai.APITimeoutError):
        limit = f" after {timeout:g}s" if timeout is not None else ""
        text = f"{what} timed out{limit}"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"{what} failed: could not connect to the server ({type(exc).__name__})"
    elif isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = _error_text(exc.body, exc.message)
        if isinstance(exc, openai.RateLimitError):
            text = f"{what} was rate limited (HTTP {status}): {detail}"
        elif isinstance(exc, openai.AuthenticationError):
            text = f"{what} was not authorised (HTTP {status}): {detail}"
        else:
            text = f"{what} failed with HTTP {status}: {detail}"
    else:
        text = f"{what} failed: {type(exc).__name__}: {exc}"
    text = redact_secrets(text, [api_key])
    if len(text) > 500:
        text = text[:497] + "..."
    return OpenAIFailure(text, status)
