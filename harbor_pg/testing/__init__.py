"""Test support for applications: the store conformance suite.

Subclass :class:`~harbor_pg.testing.conformance.MemoryStoreConformance` in your
own tests and provide a ``manager`` fixture built on your stores; every test in
the class then runs against them (needs pytest and pytest-asyncio).
"""
