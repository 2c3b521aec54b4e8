"""Pick the best embedder that can be loaded here, without waiting on a network."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from harbor_pg.embedders.base import Embedder, EmbedderError
from harbor_pg.embedders.fastembed import (
    DEFAULT_FASTEMBED_MODEL,
    MODEL_PATH_ENV,
    FastEmbedEmbedder,
)
from harbor_pg.embedders.hashing import HashingEmbedder

__all__ = ["default_embedder"]

logger = logging.getLogger(__name__)

_TRUTHY = {"1", "true", "yes", "on"}
#: The whole probe (name lookup and TCP connect) ends within this many seconds.
_HUB_PROBE_TIMEOUT = 0.3
#: An endpoint found unreachable is not probed again for this long.
_HUB_PROBE_TTL = 300.0
_probe_lock = threading.Lock()
#: endpoint -> monotonic time of the probe that found it unreachable
_unreachable_since: dict[str, float] = {}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUTHY


def _hub_reachable(timeout: float = _HUB_PROBE_TIMEOUT) -> bool:
    """Whether one TCP connect to the model hub succeeds within ``timeout`` seconds.

    fastembed itself retries an unreachable hub for about 40 s, so this is asked
    first. The deadline covers the name lookup too (``socket.create_connection``'s
    timeout does not: a resolver that never answers would hold it for the
    resolver's own timeout), so the lookup and connect run in a daemon thread
    that is abandoned at the deadline. An unreachable endpoint is remembered
    for ``_HUB_PROBE_TTL`` seconds, so a process that creates many managers
    waits for it once.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    with _probe_lock:
        since = _unreachable_since.get(endpoint)
    if since is not None and time.monotonic() - since < _HUB_PROBE_TTL:
        return False
    parsed = urlparse(endpoint)
    host = parsed.hostname
    if not host:
        return False
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    outcome: list[bool] = []
    done = threading.Event()

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(True)
        except OSError:
            outcome.append(False)
        finally:
            done.set()

    threading.Thread(target=connect, name="harbor-hub-probe", daemon=True).start()
    reachable = done.wait(timeout) and bool(outcome) and outcome[0]
    with _probe_lock:
        if reachable:
            _unreachable_since.pop(endpoint, None)
        else:
            _unreachable_since[endpoint] = time.monotonic()
    return reachable


def _may_be_cached(model_name: str) -> bool:
    """Whether fastembed's cache may hold ``model_name`` (False only when surely absent).

    Checked before asking fastembed, whose cache-only attempt logs errors when
    the model is absent, which is the normal case on a machine that never
    downloaded it.
    """
    try:
        from fastembed import TextEmbedding
        from fastembed.common.utils import define_cache_dir

        cache = Path(define_cache_dir(None))
        short = model_name.split("/")[-1]
        candidates = [cache / short, cache / f"fast-{short}"]
        for description in TextEmbedding._list_supported_models():
            if description.model.lower() == model_name.lower() and description.sources.hf:
                candidates.append(cache / ("models--" + description.sources.hf.replace("/", "--")))
        return any(candidate.exists() for candidate in candidates)
    except Exception:
        return True  # cannot tell: let fastembed look


def _fallback(dimensions: int, reason: str) -> HashingEmbedder:
    embedder = HashingEmbedder(dimensions)
    logger.warning(
        "using the hashing embedder (%s, keyword matching only) because %s",
        embedder.model_id,
        reason,
    )
    return embedder


def default_embedder(
    model_path: str | os.PathLike[str] | None = None,
    *,
    allow_download: bool | None = None,
    fallback_dimensions: int = 384,
) -> Embedder:
    """Return the best local embedder that loads, else a :class:`HashingEmbedder`.

    Order of preference:

    1. a local model directory: ``model_path``, else the ``HARBOR_EMBED_MODEL_PATH``
       environment variable (see :class:`FastEmbedEmbedder`); when one is named
       but cannot be loaded, the hub model is *not* tried in its place;
    2. fastembed's default model (``BAAI/bge-small-en-v1.5``) from fastembed's
       cache;
    3. the same model downloaded, when ``allow_download`` (default: unless
       ``HF_HUB_OFFLINE`` is set) and a probe reaches the hub within 0.3 s
       (a hub found unreachable is not probed again for five minutes);
    4. :class:`HashingEmbedder`.

    Falling back logs one WARNING that names the embedder used and why. No
    step waits on an unreachable network for more than 0.3 seconds.

    Args:
        model_path: a local model directory to prefer.
        allow_download: whether the default model may be downloaded.
        fallback_dimensions: dimensions of the hashing fallback (384 matches
            the small neural models).
    """
    if allow_download is None:
        allow_download = not _offline()
    path = model_path if model_path is not None else (os.environ.get(MODEL_PATH_ENV) or None)

    if importlib.util.find_spec("fastembed") is None:
        return _fallback(
            fallback_dimensions,
            "fastembed is not installed (pip install 'harbor-pg[fastembed]')",
        )
    if path is not None:
        try:
            return FastEmbedEmbedder(model_path=path)
        except EmbedderError as exc:
            return _fallback(fallback_dimensions, f"the local embedding model failed: {exc}")

    if _may_be_cached(DEFAULT_FASTEMBED_MODEL):
        try:
            return FastEmbedEmbedder(DEFAULT_FASTEMBED_MODEL, local_files_only=True)
        except EmbedderError:
            pass  # not (fully) cached: try a download below
    if not allow_download:
        return _fallback(
            fallback_dimensions,
            f"{DEFAULT_FASTEMBED_MODEL} is not in fastembed's cache and downloads are off "
            f"(HF_HUB_OFFLINE or allow_download=False); set {MODEL_PATH_ENV} to a local model",
        )
    if not _hub_reachable():
        return _fallback(
            fallback_dimensions,
            f"{DEFAULT_FASTEMBED_MODEL} is not in fastembed's cache and the model hub is not "
            f"reachable; set {MODEL_PATH_ENV} to a local model directory",
        )
    try:
        return FastEmbedEmbedder(DEFAULT_FASTEMBED_MODEL)
    except EmbedderError as exc:
        return _fallback(
            fallback_dimensions, f"downloading {DEFAULT_FASTEMBED_MODEL} failed: {exc}"
        )
