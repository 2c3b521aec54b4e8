"""An application module for ``harbor-pg worker --manager``: a manager whose extraction
model is the scripted one of tests/integration/test_jobs_append.py."""

from __future__ import annotations

import asyncio
from typing import Any

from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from tests.integration.test_jobs_append import TeaModel


async def manager() -> MemoryManager:
    return await MemoryManager.create(embedder=HashingEmbedder(), extraction_model=TeaModel())


class SlowModel(TeaModel):
    """Answers after a minute: a worker running its job is killed mid-job."""

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        await asyncio.sleep(60)
        return await super().generate_structured(system, user, schema)


async def slow_manager() -> MemoryManager:
    return await MemoryManager.create(
        embedder=HashingEmbedder(),
        extraction_model=SlowModel(),
        config=MemoryManagerConfig(jobs_in_process=False, job_stalled_seconds=1.0),
    )
