"""LangChainModel over langchain_core's fake chat models."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import BaseModel

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm import (
    LangChainModel,
    MemoryModel,
    MemoryModelError,
    StructuredOutputUnsupportedError,
    as_memory_model,
    supports_structured_output,
)


class Rewrite(BaseModel):
    query: str
    wanted_types: list[str]


class ToolCallingFake(GenericFakeChatModel):
    """A fake that 'supports' tools, so the base with_structured_output works."""

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        return self


class RecordingFake(FakeListChatModel):
    """Remembers the messages of each call."""

    seen: list[list[BaseMessage]] = []  # noqa: RUF012 - pydantic field, copied per instance

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


class SlowFake(FakeListChatModel):
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        await asyncio.sleep(5)
        raise AssertionError("not reached")


class FailingFake(FakeListChatModel):
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise RuntimeError("upstream exploded, key sk-abcdefghijklmnop leaked")


async def test_generate_text_sends_system_and_user() -> None:
    fake = RecordingFake(responses=["the summary"])
    model = LangChainModel(fake)
    assert await model.generate_text("be brief", "summarise this") == "the summary"
    [messages] = fake.seen
    assert [(m.type, m.content) for m in messages] == [
        ("system", "be brief"),
        ("human", "summarise this"),
    ]


async def test_content_blocks_are_joined() -> None:
    blocks: list[str | dict[str, Any]] = [
        {"type": "text", "text": "Alice "},
        {"type": "text", "text": "owns it"},
    ]
    fake = GenericFakeChatModel(messages=iter([AIMessage(content=blocks)]))
    assert await LangChainModel(fake).generate_text("s", "u") == "Alice owns it"


async def test_plain_fake_has_no_structured_output() -> None:
    model = LangChainModel(FakeListChatModel(responses=["x"]))
    assert model.supports_structured is False
    assert not supports_structured_output(model)
    with pytest.raises(StructuredOutputUnsupportedError):
        await model.generate_structured("s", "u", Rewrite)
    # the caller's fallback: plain text still works
    assert await model.generate_text("s", "u") == "x"


async def test_structured_output_through_tool_calls() -> None:
    answer = AIMessage(
        content="",
        tool_calls=[
            {
                "name": "Rewrite",
                "args": {"query": "who owns ingest", "wanted_types": ["fact"]},
                "id": "call-1",
            }
        ],
    )
    model = LangChainModel(ToolCallingFake(messages=iter([answer])))
    assert model.supports_structured is True
    result = await model.generate_structured("s", "u", Rewrite)
    assert result == Rewrite(query="who owns ingest", wanted_types=["fact"])


async def test_structured_output_with_no_tool_call_is_an_error() -> None:
    model = LangChainModel(ToolCallingFake(messages=iter([AIMessage(content="just text")])))
    with pytest.raises(MemoryModelError, match="returned no Rewrite"):
        await model.generate_structured("s", "u", Rewrite)


async def test_structured_output_that_does_not_validate() -> None:
    answer = AIMessage(
        content="", tool_calls=[{"name": "Rewrite", "args": {"query": 3}, "id": "c"}]
    )
    model = LangChainModel(ToolCallingFake(messages=iter([answer])))
    with pytest.raises(MemoryModelError):
        await model.generate_structured("s", "u", Rewrite)


async def test_model_errors_are_wrapped_and_redacted() -> None:
    model = LangChainModel(FailingFake(responses=["unused"]))
    with pytest.raises(MemoryModelError, match="RuntimeError: upstream exploded") as info:
        await model.generate_text("s", "u")
    assert "sk-abcdefghijklmnop" not in str(info.value)


async def test_empty_answer_is_an_error() -> None:
    model = LangChainModel(FakeListChatModel(responses=[""]))
    with pytest.raises(MemoryModelError, match="empty answer"):
        await model.generate_text("s", "u")


async def test_timeout() -> None:
    model = LangChainModel(SlowFake(responses=["x"]), timeout=0.05)
    with pytest.raises(MemoryModelError, match=r"timed out after 0\.05s"):
        await model.generate_text("s", "u")


def test_as_memory_model() -> None:
    fake: BaseChatModel = FakeListChatModel(responses=["x"])
    wrapped = as_memory_model(fake)
    assert isinstance(wrapped, LangChainModel)
    assert isinstance(wrapped, MemoryModel)
    assert as_memory_model(wrapped) is wrapped
    assert as_memory_model(None) is None
    with pytest.raises(MemoryConfigurationError):
        as_memory_model("gpt-4o")  # type: ignore[arg-type]
    with pytest.raises(MemoryConfigurationError):
        LangChainModel(object())  # type: ignore[arg-type]
