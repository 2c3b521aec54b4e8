"""Test support for applications: the store conformance suite.

Subclass :class:`~harbor_pg.testing.conformance.MemoryStoreConformance` in your
own tests and override its ``make_manager`` to build a manager on your stores;
every check in the class then runs against them. It needs only pytest (no
pytest-asyncio, no configuration).
"""

from harbor_pg.testing.conformance import MemoryStoreConformance

__all__ = ["MemoryStoreConformance"]
