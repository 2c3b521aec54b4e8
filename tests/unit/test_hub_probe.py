"""The model-hub probe of the default embedder is bounded and not paid twice.

An unreachable hub is simulated on loopback (a port whose accept queue is
full never completes a TCP connect, as behind a firewall that drops packets)
and by a name lookup that never answers; nothing leaves the machine.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harbor_pg.embedders import HashingEmbedder, default_embedder, factory

# the unreachable hub of `startup --mode hub` (benchmarks/_startup_hub.py), one copy for both
_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_startup_hub.py"
_spec = importlib.util.spec_from_file_location("_startup_hub", _PATH)
assert _spec is not None and _spec.loader is not None
_startup_hub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_startup_hub)


@pytest.fixture(autouse=True)
def fresh_probe_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "_unreachable_since", {}, raising=False)


@pytest.fixture
def blackholed(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port, held = _startup_hub.blackholed_port()  # the benchmark's own simulation
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.raises(TimeoutError):  # the simulation holds: a connect hangs
        socket.create_connection(("127.0.0.1", port), timeout=0.5)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    yield endpoint
    for sock in held:
        sock.close()


def _timed(call: object) -> tuple[object, float]:
    t0 = time.perf_counter()
    result = call()  # type: ignore[operator]
    return result, time.perf_counter() - t0


def test_a_connect_that_never_answers_costs_at_most_the_deadline_once(blackholed: str) -> None:
    reachable, first = _timed(factory._hub_reachable)
    assert reachable is False
    assert first < 0.6  # the deadline is 0.3 s (it was 2 s)
    reachable, second = _timed(factory._hub_reachable)
    assert reachable is False
    assert second < 0.05  # remembered: not probed again


def test_a_name_lookup_that_never_answers_is_cut_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.getaddrinfo

    def hanging(*args: object, **kwargs: object) -> object:
        time.sleep(3)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    reachable, took = _timed(factory._hub_reachable)
    assert reachable is False
    assert took < 0.6  # create_connection's timeout alone does not cover the lookup


def test_default_embedder_with_an_unreachable_hub_is_quick(
    blackholed: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("HARBOR_EMBED_MODEL_PATH", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(tmp_path / "empty-cache"))
    import fastembed  # noqa: F401 - imported outside the timings

    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        times = []
        for _ in range(3):
            embedder, took = _timed(default_embedder)
            assert isinstance(embedder, HashingEmbedder)
            times.append(took)
    assert times[0] < 1.0
    assert max(times[1:]) < 0.2
    assert all("not reachable" in r.getMessage() for r in caplog.records)
    assert len(caplog.records) == 3  # one WARNING per fallback, as before
