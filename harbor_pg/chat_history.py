"""LangChain chat message history backed by the short-term tier."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.messages import from_langchain, to_langchain
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.tiers.base import BlockingShortTermStore
from harbor_pg.tiers.in_process import InMemoryShortTermStore

__all__ = ["HarborChatMessageHistory"]

T = TypeVar("T")


class HarborChatMessageHistory(BaseChatMessageHistory):
    """LangChain's chat history interface over one session's turns.

    The async members (``aget_messages``, ``aadd_messages``, ``aclear``, what
    ``RunnableWithMessageHistory`` calls under ``ainvoke``) are the native
    path. The sync members (``messages``, ``add_messages``, ``clear``, used
    under ``invoke``) work too:

    - when the manager's database pools run on an event loop in another
      thread, the call is handed to that loop and waited for (the full
      manager path, background summaries included);
    - otherwise, on PostgreSQL, the call runs on a short-lived connection of
      its own: from plain sync code, and also from inside the loop that runs
      the pools (which it blocks for that one statement, as any sync database
      call would; waiting on the pool there would deadlock). A turn appended
      this way schedules no background summary; the next async append or
      context build does;
    - the in-process stores run the call on a private event loop.

    Only a custom store called from inside a running event loop cannot be
    driven synchronously; that raises :class:`MemoryConfigurationError`.
    """

    def __init__(self, manager: MemoryManager, owner: MemoryOwner, *, limit: int | None = None):
        owner.require_scope(MemoryScope.SESSION)
        self.manager = manager
        self.owner = owner
        self.limit = limit

    # -- sync -----------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's recent turns as LangChain messages, oldest first."""
        store = self._pg_store()
        direct = (lambda: self._pg_recent(store)) if store is not None else None
        return self._call(self.aget_messages, direct)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append LangChain messages to the session."""
        batch = list(messages)
        store = self._pg_store()
        direct = (lambda: self._pg_add(store, batch)) if store is not None else None
        self._call(lambda: self.aadd_messages(batch), direct)

    def clear(self) -> None:
        """Delete the session's turns."""
        store = self._pg_store()
        direct = (lambda: self._pg_clear(store)) if store is not None else None
        self._call(self.aclear, direct)

    # -- async ----------------------------------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        """The session's recent turns as LangChain messages, oldest first."""
        return [to_langchain(m) for m in await self.manager.recent(self.owner, self.limit)]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append LangChain messages to the session (all are validated before the first)."""
        turns = [self.manager._turn(self.owner, from_langchain(m)) for m in messages]
        for turn in turns:
            await self.manager.append(self.owner, turn)

    async def aclear(self) -> None:
        """Delete the session's turns."""
        await self.manager.clear(self.owner)

    # -- running a call from sync code -------------------------------------------------

    def _call(
        self,
        coroutine: Callable[[], Coroutine[Any, Any, T]],
        direct: Callable[[], T] | None,
    ) -> T:
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        store = self.manager.short_term
        home = store.loop if isinstance(store, BlockingShortTermStore) else None
        if home is not None and home is not here and home.is_running() and not home.is_closed():
            return asyncio.run_coroutine_threadsafe(coroutine(), home).result()
        if direct is not None:
            return direct()
        if here is None:
            return asyncio.run(coroutine())
        if isinstance(store, InMemoryShortTermStore):
            # the in-process store does no I/O: a private loop in a helper thread runs it
            # while this loop waits
            with ThreadPoolExecutor(1, thread_name_prefix="harbor-history") as helper:
                return helper.submit(asyncio.run, coroutine()).result()
        raise MemoryConfigurationError(
            "HarborChatMessageHistory: a custom short-term store cannot be driven "
            "synchronously from inside a running event loop; use `await "
            "history.aget_messages()`, `aadd_messages(...)` and `aclear()` here"
        )

    def _pg_store(self) -> BlockingShortTermStore | None:
        store = self.manager.short_term
        return store if isinstance(store, BlockingShortTermStore) else None

    def _pg_recent(self, store: BlockingShortTermStore) -> list[BaseMessage]:
        self.owner.require_scope(MemoryScope.SESSION)
        limit = self.manager._recent_limit(self.limit)
        ttl = self.manager.config.session_ttl_seconds
        return [to_langchain(m) for m in store.recent_sync(self.owner, limit, ttl_seconds=ttl)]

    def _pg_add(self, store: BlockingShortTermStore, messages: list[BaseMessage]) -> None:
        # validate every message before the first write, as the async path does per message
        turns = [self.manager._turn(self.owner, from_langchain(m)) for m in messages]
        for turn in turns:
            store.append_sync(self.owner, turn)

    def _pg_clear(self, store: BlockingShortTermStore) -> None:
        self.owner.require_scope(MemoryScope.SESSION)
        store.clear_sync(self.owner)
