"""LangChain chat message history backed by the short-term tier."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from harbor_pg.context.messages import from_langchain, to_langchain
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope

__all__ = ["HarborChatMessageHistory"]


class HarborChatMessageHistory(BaseChatMessageHistory):
    """LangChain's chat history interface over one session's turns.

    The store is asynchronous: use ``aget_messages``, ``aadd_messages`` and
    ``aclear`` (what ``RunnableWithMessageHistory`` calls under ``ainvoke``).
    The synchronous members raise :class:`MemoryConfigurationError`.
    """

    def __init__(self, manager: MemoryManager, owner: MemoryOwner, *, limit: int | None = None):
        owner.require_scope(MemoryScope.SESSION)
        self.manager = manager
        self.owner = owner
        self.limit = limit

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        raise MemoryConfigurationError(
            "HarborChatMessageHistory is async: use `await history.aget_messages()`"
        )

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        raise MemoryConfigurationError(
            "HarborChatMessageHistory is async: use `await history.aadd_messages(...)`"
        )

    def clear(self) -> None:
        raise MemoryConfigurationError(
            "HarborChatMessageHistory is async: use `await history.aclear()`"
        )

    async def aget_messages(self) -> list[BaseMessage]:
        """The session's recent turns as LangChain messages, oldest first."""
        return [to_langchain(m) for m in await self.manager.recent(self.owner, self.limit)]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append LangChain messages to the session."""
        for message in messages:
            await self.manager.append(self.owner, from_langchain(message))

    async def aclear(self) -> None:
        """Delete the session's turns."""
        await self.manager.clear(self.owner)
