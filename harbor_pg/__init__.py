"""harbor-pg: scope-aware memory for LLM chat and agent applications, in PostgreSQL.

The names below load on first use (PEP 562): ``import harbor_pg`` itself
imports nothing heavy, and ``from harbor_pg import MemoryManager`` loads the
manager and what it needs, not LangChain's message classes, the context
builder, the embedders' runtimes or the integrations (tests/unit/test_import_cost.py).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harbor_pg.chat_history import HarborChatMessageHistory
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
    from harbor_pg.profile import ProfileEntry, UserProfile
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

#: public name -> the module that defines it
_LAZY: dict[str, str] = {
    "MemoryContextBuilder": "harbor_pg.context.builder",
    "MemoryRecall": "harbor_pg.context.recall",
    "RecalledMemory": "harbor_pg.context.recall",
    "ProfileEntry": "harbor_pg.profile",
    "UserProfile": "harbor_pg.profile",
    "recalled_entity_ids": "harbor_pg.context.recall",
    "MemoryContext": "harbor_pg.context.result",
    "SessionSummarizer": "harbor_pg.context.summarizer",
    "default_embedder": "harbor_pg.embedders",
    "Embedder": "harbor_pg.embedders.base",
    "EmbedderError": "harbor_pg.embedders.base",
    "HashingEmbedder": "harbor_pg.embedders.hashing",
    "MemoryConcurrencyError": "harbor_pg.errors",
    "MemoryConfigurationError": "harbor_pg.errors",
    "MemoryDatabaseError": "harbor_pg.errors",
    "MemoryError": "harbor_pg.errors",
    "MemoryNotFoundError": "harbor_pg.errors",
    "MemoryScopeError": "harbor_pg.errors",
    "MemoryValidationError": "harbor_pg.errors",
    "MemoryEntityResolver": "harbor_pg.extraction.entities",
    "ResolvedEntity": "harbor_pg.extraction.entities",
    "MemoryExtractor": "harbor_pg.extraction.extractor",
    "extract_memories": "harbor_pg.extraction.extractor",
    "MemoryModel": "harbor_pg.llm.base",
    "MemoryModelError": "harbor_pg.llm.base",
    "MemoryManager": "harbor_pg.manager",
    "MemoryManagerConfig": "harbor_pg.manager",
    "MemorySnapshot": "harbor_pg.manager",
    "SCOPE_OWNER_FIELDS": "harbor_pg.owner",
    "MemoryOwner": "harbor_pg.owner",
    "MemoryScope": "harbor_pg.owner",
    "scope_owner_fields": "harbor_pg.owner",
    "BudgetSplit": "harbor_pg.policy",
    "MemoryPolicy": "harbor_pg.policy",
    "RECALL_MEMORY_TYPES": "harbor_pg.records",
    "ConversationMessage": "harbor_pg.records",
    "Memory": "harbor_pg.records",
    "MemoryType": "harbor_pg.records",
    "Sensitivity": "harbor_pg.records",
    "EraseReceipt": "harbor_pg.tiers.base",
    "RetentionReceipt": "harbor_pg.tiers.base",
    "SaveResult": "harbor_pg.tiers.base",
    "InMemoryConversationStore": "harbor_pg.tiers.facades",
    "InMemoryMemoryRepository": "harbor_pg.tiers.facades",
    "InMemoryWorkingMemoryStore": "harbor_pg.tiers.facades",
    "LongTermMemory": "harbor_pg.tiers.facades",
    "ShortTermMemory": "harbor_pg.tiers.facades",
    "WorkingMemory": "harbor_pg.tiers.facades",
    "InMemoryLongTermStore": "harbor_pg.tiers.in_process",
    "InMemoryShortTermStore": "harbor_pg.tiers.in_process",
    "InMemoryWorkingStore": "harbor_pg.tiers.in_process",
    "approximate_tokens": "harbor_pg.tokens",
    # LangChain's chat-history base class imports its tracing stack (about 0.3 s)
    "HarborChatMessageHistory": "harbor_pg.chat_history",
}

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
    "ProfileEntry",
    "RecalledMemory",
    "ResolvedEntity",
    "RetentionReceipt",
    "SaveResult",
    "Sensitivity",
    "SessionSummarizer",
    "ShortTermMemory",
    "UserProfile",
    "WorkingMemory",
    "approximate_tokens",
    "default_embedder",
    "extract_memories",
    "recalled_entity_ids",
    "scope_owner_fields",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harbor_pg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
