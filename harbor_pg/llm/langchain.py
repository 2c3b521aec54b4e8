"""LangChain chat models as a :class:`MemoryModel` (the compatibility adapter)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm.base import (
    MemoryModel,
    MemoryModelError,
    StructuredOutputUnsupportedError,
    redact_secrets,
    validation_problems,
)

__all__ = ["LangChainModel", "as_memory_model"]

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import BaseMessage

T = TypeVar("T", bound=BaseModel)

# ``langchain_core.language_models`` pulls in tracing and langsmith (about 0.3 s
# of import). It is imported only when a LangChain model is actually used.
_CHAT_MODELS_MODULE = "langchain_core.language_models.chat_models"


def _is_chat_model(obj: object) -> bool:
    """``isinstance(obj, BaseChatModel)`` without importing LangChain's model stack.

    An instance of a ``BaseChatModel`` cannot exist before its module is
    imported, so when the module is absent the answer is no.
    """
    module = sys.modules.get(_CHAT_MODELS_MODULE)
    return module is not None and isinstance(obj, module.BaseChatModel)


def _has_structured_output(chat_model: BaseChatModel) -> bool:
    """Whether ``with_structured_output`` can work for this model class.

    The base implementation is built on ``bind_tools`` and raises
    ``NotImplementedError`` when a model overrides neither.
    """
    from langchain_core.language_models import BaseChatModel

    cls = type(chat_model)
    return (
        cls.with_structured_output is not BaseChatModel.with_structured_output
        or cls.bind_tools is not BaseChatModel.bind_tools
    )


# Near harbor_pg.messages.message_text, on purpose: llm/ sits below messages.py in the
# layering, and a chat answer's blocks need a type to count as text, a stored message's not.
def _message_text(message: BaseMessage) -> str:
    """The text of a chat answer, whether its content is a string or content blocks."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


class LangChainModel:
    """Adapt a LangChain ``BaseChatModel`` to the :class:`MemoryModel` protocol.

    ``generate_text`` sends a system and a human message; ``generate_structured``
    uses the model's ``with_structured_output`` when the model class implements it
    (directly or through ``bind_tools``). Otherwise ``supports_structured`` is
    false and ``generate_structured`` raises
    :class:`StructuredOutputUnsupportedError`, so callers use plain text.

    Args:
        chat_model: any LangChain chat model.
        timeout: optional seconds allowed per call (on top of the model's own).
        structured_method: passed as ``method=`` to ``with_structured_output``
            (e.g. ``"json_schema"``); None keeps the model's default.
    """

    def __init__(
        self,
        chat_model: BaseChatModel,
        *,
        timeout: float | None = None,
        structured_method: str | None = None,
    ) -> None:
        if not _is_chat_model(chat_model):
            raise MemoryConfigurationError(
                "LangChainModel needs a langchain_core BaseChatModel, "
                f"got {type(chat_model).__name__}"
            )
        if timeout is not None and timeout <= 0:
            raise MemoryConfigurationError(f"timeout must be positive, got {timeout!r}")
        self.chat_model = chat_model
        self._timeout = timeout
        self._method = structured_method
        self.supports_structured: bool = _has_structured_output(chat_model)

    def __repr__(self) -> str:
        return f"LangChainModel({type(self.chat_model).__name__})"

    def _what(self) -> str:
        return f"LangChain model {type(self.chat_model).__name__}"

    @staticmethod
    def _messages(system: str, user: str) -> Sequence[BaseMessage]:
        from langchain_core.messages import HumanMessage, SystemMessage

        return [SystemMessage(content=system), HumanMessage(content=user)]

    async def _call(self, runnable: Any, messages: Sequence[BaseMessage]) -> Any:
        try:
            if self._timeout is None:
                return await runnable.ainvoke(list(messages))
            return await asyncio.wait_for(runnable.ainvoke(list(messages)), self._timeout)
        except TimeoutError:
            limit = f" after {self._timeout:g}s" if self._timeout is not None else ""
            raise MemoryModelError(f"{self._what()} timed out{limit}") from None
        except MemoryModelError:
            raise
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            raise MemoryModelError(
                redact_secrets(f"{self._what()} failed: {type(exc).__name__}: {exc}")[:500],
                status_code=status if isinstance(status, int) else None,
            ) from None

    async def generate_text(self, system: str, user: str) -> str:
        """Return the chat model's answer as text.

        Raises:
            MemoryModelError: the model raised, timed out or answered with no text.
        """
        from langchain_core.messages import BaseMessage

        answer = await self._call(self.chat_model, self._messages(system, user))
        if not isinstance(answer, BaseMessage):
            raise MemoryModelError(
                f"{self._what()} returned {type(answer).__name__}, not a message"
            )
        text = _message_text(answer)
        if not text.strip():
            raise MemoryModelError(f"{self._what()} returned an empty answer")
        return text

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        """Return the answer validated into ``schema`` via ``with_structured_output``.

        Raises:
            StructuredOutputUnsupportedError: the model class cannot do structured output.
            MemoryModelError: the model raised, timed out, produced nothing or
                produced something that does not validate against ``schema``.
        """
        if not self.supports_structured:
            raise StructuredOutputUnsupportedError(
                f"{self._what()} does not support structured output"
            )
        kwargs: dict[str, Any] = {}
        if self._method is not None:
            kwargs["method"] = self._method
        try:
            runnable = self.chat_model.with_structured_output(schema, **kwargs)
        except NotImplementedError:
            self.supports_structured = False
            raise StructuredOutputUnsupportedError(
                f"{self._what()} does not support structured output"
            ) from None
        except Exception as exc:
            raise MemoryModelError(
                redact_secrets(f"{self._what()} could not bind {schema.__name__}: {exc}")[:500]
            ) from None
        result = await self._call(runnable, self._messages(system, user))
        if isinstance(result, schema):
            return result
        if result is None:
            raise MemoryModelError(f"{self._what()} returned no {schema.__name__}")
        try:
            if isinstance(result, BaseModel):
                return schema.model_validate(result.model_dump())
            return schema.model_validate(result)
        # As llm/openai.py's check of structured output, on purpose: the messages name what was
        # checked (a LangChain model's output there JSON text).
        except ValidationError as exc:
            problems = validation_problems(exc)
            raise MemoryModelError(
                f"{self._what()} returned output that does not match {schema.__name__}: {problems}"
            ) from None


def as_memory_model(model: MemoryModel | BaseChatModel | None) -> MemoryModel | None:
    """Accept a :class:`MemoryModel`, a LangChain chat model (wrapped) or None.

    Raises:
        MemoryConfigurationError: ``model`` is neither.
    """
    if model is None:
        return None
    if _is_chat_model(model):
        return LangChainModel(model)  # type: ignore[arg-type]
    if isinstance(model, MemoryModel):
        return model
    raise MemoryConfigurationError(
        f"expected a MemoryModel or a LangChain BaseChatModel, got {type(model).__name__}"
    )
