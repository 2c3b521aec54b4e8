"""OpenAI (and OpenAI-compatible) chat models as a :class:`MemoryModel`."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm._openai_support import client_setup, describe_openai_error
from harbor_pg.llm._schema import response_format_for
from harbor_pg.llm.base import (
    MemoryModelError,
    StructuredOutputUnsupportedError,
    redact_secrets,
    validation_problems,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OpenAIModel"]

T = TypeVar("T", bound=BaseModel)

StructuredMode = Literal["json_schema", "json_object", "off"]
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class OpenAIModel:
    """A chat-completions model reached through the ``openai`` client.

    Works with OpenAI itself and with any server that speaks the same protocol
    (pass ``base_url``, e.g. ``http://localhost:11434/v1``). Every failure,
    including timeouts, HTTP 429/5xx, refusals and output that does not fit the
    schema, is raised as :class:`MemoryModelError`.

    Args:
        model: the model name sent with each request.
        api_key: the key; defaults to the ``OPENAI_API_KEY`` environment variable.
        base_url: the API root (``.../v1``); defaults to OpenAI's.
        timeout: seconds allowed for one HTTP attempt.
        max_retries: client-side retries on connection errors, 408/409/429 and 5xx.
        client: a ready ``openai.AsyncOpenAI`` to use instead of building one; its
            own timeout and retry settings then apply.
        temperature: sent only when given (some reasoning models reject it).
        max_tokens: cap on the answer's tokens, sent as ``max_completion_tokens``.
        structured_output: how :meth:`generate_structured` asks for JSON:
            ``"json_schema"`` (structured outputs, strict where the schema allows),
            ``"json_object"`` (JSON mode plus the schema in the system prompt, for
            servers without structured outputs) or ``"off"`` (no structured output;
            ``supports_structured`` is then false).

    Raises:
        MemoryConfigurationError: ``openai`` is not installed (``pip install
            'harbor-pg[openai]'``), or there is no API key.
    """

    def __init__(
        self,
        model: str = "gpt-4o-mini",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        client: AsyncOpenAI | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        structured_output: StructuredMode = "json_schema",
    ) -> None:
        if structured_output not in ("json_schema", "json_object", "off"):
            raise MemoryConfigurationError(
                f"structured_output must be 'json_schema', 'json_object' or 'off', "
                f"got {structured_output!r}"
            )
        # As embedders/openai.py's OpenAIEmbedder, on purpose: both share client_setup().
        self._client, self._owns_client, self._timeout = client_setup(
            "OpenAIModel",
            client,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
        )
        self.model = model
        self._api_key = api_key
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._structured_mode: StructuredMode = structured_output
        self.supports_structured: bool = structured_output != "off"

    def __repr__(self) -> str:
        return f"OpenAIModel(model={self.model!r}, base_url={str(self._client.base_url)!r})"

    async def aclose(self) -> None:
        """Close the HTTP client if this adapter built it."""
        if self._owns_client:
            await self._client.close()

    async def generate_text(self, system: str, user: str) -> str:
        """Return the model's plain-text answer.

        Raises:
            MemoryModelError: on a transport/HTTP failure, a timeout, a refusal or
                an empty answer.
        """
        content, _finish = await self._complete(system, user, None)
        return content

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        """Return the answer parsed and validated into ``schema``.

        With ``structured_output="json_schema"`` the request carries
        ``response_format={"type": "json_schema", ...}``, strict when the
        schema's shape allows it.

        Raises:
            StructuredOutputUnsupportedError: ``structured_output="off"``.
            MemoryModelError: on any failure, including malformed JSON, a
                truncated answer and a schema mismatch.
        """
        if self._structured_mode == "off":
            raise StructuredOutputUnsupportedError(
                f"OpenAIModel({self.model!r}) was built with structured_output='off'"
            )
        if self._structured_mode == "json_schema":
            response_format = response_format_for(schema)
        else:
            response_format = {"type": "json_object"}
            system = (
                f"{system}\n\nAnswer with one JSON object that matches this JSON schema, "
                f"and nothing else:\n{json.dumps(schema.model_json_schema())}"
            )
        content, finish = await self._complete(system, user, response_format)
        if finish == "length":
            raise MemoryModelError(
                f"{self._what()} stopped at the token limit before finishing the "
                f"{schema.__name__} JSON"
            )
        return _parse_into(schema, content, self._what())

    def _what(self) -> str:
        return f"OpenAI model {self.model!r}"

    async def _complete(
        self, system: str, user: str, response_format: dict[str, Any] | None
    ) -> tuple[str, str | None]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        }
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self._temperature is not None:
            kwargs["temperature"] = self._temperature
        if self._max_tokens is not None:
            kwargs["max_completion_tokens"] = self._max_tokens
        try:
            response = await self._client.chat.completions.create(**kwargs)
        except Exception as exc:
            failure = describe_openai_error(
                exc, what=self._what(), api_key=self._secret(), timeout=self._timeout
            )
            raise MemoryModelError(failure.message, status_code=failure.status_code) from None
        if not response.choices:
            raise MemoryModelError(f"{self._what()} returned no choices")
        choice = response.choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise MemoryModelError(f"{self._what()} refused: {redact_secrets(str(refusal))[:300]}")
        if choice.finish_reason == "content_filter":
            raise MemoryModelError(f"{self._what()} answer was withheld by the content filter")
        content = message.content
        if content is None or not content.strip():
            raise MemoryModelError(f"{self._what()} returned an empty answer")
        return content, choice.finish_reason

    def _secret(self) -> str | None:
        if self._api_key is not None:
            return self._api_key
        key = getattr(self._client, "api_key", None)
        return key if isinstance(key, str) else None


def _parse_into(schema: type[T], content: str, what: str) -> T:
    """Parse ``content`` as JSON (tolerating a Markdown fence) and validate it."""
    fenced = _FENCE.match(content)
    text = fenced.group(1) if fenced else content
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemoryModelError(
            f"{what} returned malformed JSON for {schema.__name__}: {exc.msg} at position {exc.pos}"
        ) from None
    # As llm/langchain.py's check of structured output, on purpose: the messages name what was
    # checked (the JSON text of an OpenAI answer here, a LangChain model's output there).
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise MemoryModelError(
            f"{what} returned JSON that does not match {schema.__name__}: {problems}"
        ) from None
