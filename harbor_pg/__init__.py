"""harbor-pg: scope-aware memory for LLM chat and agent applications, in PostgreSQL."""

from typing import TYPE_CHECKING, Any

from harbor_pg.context.builder import MemoryContextBuilder
from harbor_pg.context.recall import MemoryRecall, RecalledMemory, recalled_entity_ids
from harbor_pg.context.result import MemoryContext
from harbor_pg.context.summarizer import SessionSummarizer
from harbor_pg.embedders import default_embedder
from harbor_pg.embedders.base import Embedder, EmbedderError
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import (
    MemoryConcurrencyError,
    MemoryConfigurationError,
    MemoryDatabaseError,
    MemoryError,
    MemoryNotFoundError,
    MemoryScopeError,
    MemoryValidationError,
)
from harbor_pg.extraction.entities import MemoryEntityResolver, ResolvedEntity
from harbor_pg.extraction.extractor import MemoryExtractor, extract_memories
from harbor_pg.llm.base import MemoryModel, MemoryModelError
from harbor_pg.manager import MemoryManager, MemoryManagerConfig, MemorySnapshot
from harbor_pg.owner import SCOPE_OWNER_FIELDS, MemoryOwner, MemoryScope, scope_owner_fields
from harbor_pg.policy import BudgetSplit, MemoryPolicy
from harbor_pg.records import (
    RECALL_MEMORY_TYPES,
    ConversationMessage,
    Memory,
    MemoryType,
    Sensitivity,
)
from harbor_pg.tiers.base import EraseReceipt, RetentionReceipt, SaveResult
from harbor_pg.tiers.facades import (
    InMemoryConversationStore,
    InMemoryMemoryRepository,
    InMemoryWorkingMemoryStore,
    LongTermMemory,
    ShortTermMemory,
    WorkingMemory,
)
from harbor_pg.tiers.in_process import (
    InMemoryLongTermStore,
    InMemoryShortTermStore,
    InMemoryWorkingStore,
)
from harbor_pg.tokens import approximate_tokens

__all__ = [
    "RECALL_MEMORY_TYPES",
    "SCOPE_OWNER_FIELDS",
    "BudgetSplit",
    "ConversationMessage",
    "Embedder",
    "EmbedderError",
    "EraseReceipt",
    "HarborChatMessageHistory",
    "HashingEmbedder",
    "InMemoryConversationStore",
    "InMemoryLongTermStore",
    "InMemoryMemoryRepository",
    "InMemoryShortTermStore",
    "InMemoryWorkingMemoryStore",
    "InMemoryWorkingStore",
    "LongTermMemory",
    "Memory",
    "MemoryConcurrencyError",
    "MemoryConfigurationError",
    "MemoryContext",
    "MemoryContextBuilder",
    "MemoryDatabaseError",
    "MemoryEntityResolver",
    "MemoryError",
    "MemoryExtractor",
    "MemoryManager",
    "MemoryManagerConfig",
    "MemoryModel",
    "MemoryModelError",
    "MemoryNotFoundError",
    "MemoryOwner",
    "MemoryPolicy",
    "MemoryRecall",
    "MemoryScope",
    "MemoryScopeError",
    "MemorySnapshot",
    "MemoryType",
    "MemoryValidationError",
    "RecalledMemory",
    "ResolvedEntity",
    "RetentionReceipt",
    "SaveResult",
    "Sensitivity",
    "SessionSummarizer",
    "ShortTermMemory",
    "WorkingMemory",
    "approximate_tokens",
    "default_embedder",
    "extract_memories",
    "recalled_entity_ids",
    "scope_owner_fields",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from harbor_pg.chat_history import HarborChatMessageHistory


def __getattr__(name: str) -> Any:
    # LangChain's chat-history base class imports its tracing stack (about
    # 0.3 s), so the adapter is loaded on first use rather than with the package.
    if name == "HarborChatMessageHistory":
        from harbor_pg.chat_history import HarborChatMessageHistory

        return HarborChatMessageHistory
    raise AttributeError(f"module 'harbor_pg' has no attribute {name!r}")
