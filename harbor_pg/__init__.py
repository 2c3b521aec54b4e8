"""harbor-pg: scope-aware memory for LLM chat and agent applications, in PostgreSQL."""

from harbor_pg.errors import (
    MemoryConfigurationError,
    MemoryError,
    MemoryScopeError,
    MemoryValidationError,
)
from harbor_pg.manager import MemoryManager, MemoryManagerConfig, MemorySnapshot
from harbor_pg.owner import SCOPE_OWNER_FIELDS, MemoryOwner, MemoryScope, scope_owner_fields
from harbor_pg.records import ConversationMessage, Memory, MemoryType, Sensitivity
from harbor_pg.tiers.base import EraseReceipt, SaveResult
from harbor_pg.tiers.in_process import (
    InMemoryLongTermStore,
    InMemoryShortTermStore,
    InMemoryWorkingStore,
)

__all__ = [
    "SCOPE_OWNER_FIELDS",
    "ConversationMessage",
    "EraseReceipt",
    "InMemoryLongTermStore",
    "InMemoryShortTermStore",
    "InMemoryWorkingStore",
    "Memory",
    "MemoryConfigurationError",
    "MemoryError",
    "MemoryManager",
    "MemoryManagerConfig",
    "MemoryOwner",
    "MemoryScope",
    "MemoryScopeError",
    "MemorySnapshot",
    "MemoryType",
    "MemoryValidationError",
    "SaveResult",
    "Sensitivity",
    "scope_owner_fields",
]
__version__ = "0.1.0"
