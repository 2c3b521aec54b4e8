"""``startup --mode hub``: how long the default embedder waits for a model hub it cannot reach.

With no local model and nothing in fastembed's cache, ``default_embedder()``
(what ``MemoryManager.create()`` calls) asks whether the model hub answers
before it lets fastembed try a download. This times that decision for a hub
whose TCP connect is never answered (a loopback port whose accept queue is
full: the kernel drops the SYNs, as a firewall does) and for a name lookup
that never answers (``socket.getaddrinfo`` made to sleep), ``--calls`` times
in one process each.

    python -m benchmarks startup --mode hub [--calls 3]

Nothing leaves the machine: the endpoint is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable


def blackholed_port() -> tuple[int, list[socket.socket]]:
    """A loopback port that never completes a TCP connect (its accept queue is full)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = [server]
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            client.connect(("127.0.0.1", port))
        held.append(client)
    time.sleep(0.2)
    return port, held


def timed(calls: int, make: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        make()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks startup --mode hub", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    os.environ.pop("HARBOR_EMBED_MODEL_PATH", None)
    os.environ.pop("HF_HUB_OFFLINE", None)
    os.environ["FASTEMBED_CACHE_PATH"] = tempfile.mkdtemp(prefix="empty-fastembed-cache-")

    from harbor_pg.embedders import default_embedder
    from harbor_pg.embedders.hashing import HashingEmbedder

    def make() -> object:
        embedder = default_embedder()
        assert isinstance(embedder, HashingEmbedder), embedder
        return embedder

    make()  # imports fastembed once, outside the timings (hub endpoint: unset, unresolvable)
    port, _held = blackholed_port()
    os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"
    connect = timed(args.calls, make)

    os.environ["HF_ENDPOINT"] = "https://hub.invalid"
    real = socket.getaddrinfo

    def hanging(*a: object, **k: object) -> object:
        time.sleep(10)
        return real(*a, **k)  # type: ignore[arg-type]

    socket.getaddrinfo = hanging  # type: ignore[assignment]
    try:
        lookup = timed(args.calls, make)
    finally:
        socket.getaddrinfo = real
    print("connect never answered:", " ".join(f"{t:.3f}s" for t in connect))
    print("name lookup never answers:", " ".join(f"{t:.3f}s" for t in lookup))


if __name__ == "__main__":
    main()
