"""No span is made until the application sets a tracer provider (each would be a
no-op that still costs the call two context switches), and spans start as soon
as one is set, without a restart."""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from harbor_pg import telemetry

@telemetry.traced("probe")
async def probe() -> int:
    return 7

assert asyncio.run(probe()) == 7
assert telemetry._recording() is None
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
assert asyncio.run(probe()) == 7
print([s.name for s in exporter.get_finished_spans()])
"""


def test_spans_start_when_a_provider_is_set() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout
    # the call before the provider made no span; the one after made exactly one
    assert out.strip().splitlines()[-1] == "['probe']"
