"""Local ONNX embeddings through fastembed (the default embedder)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harbor_pg.embedders.base import UNCALIBRATED_DUPLICATE_THRESHOLD, EmbedderError

__all__ = [
    "DEFAULT_FASTEMBED_MODEL",
    "MODEL_PATH_ENV",
    "FastEmbedEmbedder",
    "duplicate_threshold_for_model",
    "threshold_for_model",
]

DEFAULT_FASTEMBED_MODEL = "BAAI/bge-small-en-v1.5"
#: Environment variable naming a local model directory to load instead of a hub model.
MODEL_PATH_ENV = "HARBOR_EMBED_MODEL_PATH"

_INSTALL_HINT = "pip install 'harbor-pg[fastembed]'"
_REQUIRED_FILES = ("tokenizer.json", "tokenizer_config.json")

# Calibrated relevance thresholds (cosine), keyed by a lower-case name fragment.
# bge-small: from the actrone-memory calibration (seed 004). MiniLM-L6: measured
# on the LoCoMo dev conversations (question vs. turn): 0.45 keeps 76% of
# evidence turns and 15% of the others (median 0.54 vs. 0.31).
_THRESHOLDS: tuple[tuple[str, float], ...] = (
    ("bge-small-en", 0.63),
    ("minilm-l6", 0.45),
)
#: Used for a model that was never calibrated here; pass relevance_threshold= to override.
UNCALIBRATED_THRESHOLD = 0.5

# Calibrated near-duplicate thresholds (cosine), keyed the same way. MiniLM-L6:
# measured on the LoCoMo dev conversations (benchmarks/duplicate_threshold.py): a turn
# against its restatements, against every other pair of turns of one conversation;
# 0.955 merges 99.9% of restatements at 99.4% precision (chosen by F1; leave one
# conversation out: 99.7% / 99.4%). bge-small is not calibrated here (no copy of it
# on the machines that measured): it gets the conservative UNCALIBRATED_DUPLICATE_THRESHOLD.
_DUPLICATE_THRESHOLDS: tuple[tuple[str, float], ...] = (("minilm-l6", 0.955),)

_register_lock = threading.Lock()


def _calibrated(table: tuple[tuple[str, float], ...], names: Sequence[str]) -> float | None:
    for name in names:
        lowered = name.lower()
        for fragment, threshold in table:
            if fragment in lowered:
                return threshold
    return None


def threshold_for_model(*names: str) -> float | None:
    """The calibrated threshold for the first name that matches a known model, if any."""
    return _calibrated(_THRESHOLDS, names)


def duplicate_threshold_for_model(*names: str) -> float | None:
    """The calibrated near-duplicate threshold for the first name that matches a known
    model, if any."""
    return _calibrated(_DUPLICATE_THRESHOLDS, names)


def _import_fastembed() -> Any:
    try:
        import fastembed
    except ImportError:
        raise EmbedderError(
            f"FastEmbedEmbedder needs the 'fastembed' package, which is not installed: "
            f"{_INSTALL_HINT}"
        ) from None
    return fastembed


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbedderError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise EmbedderError(f"{path} does not hold a JSON object")
    return data


class FastEmbedEmbedder:
    """Embeddings from a local ONNX model run by fastembed.

    By default this is fastembed's ``BAAI/bge-small-en-v1.5`` (384 dimensions,
    relevance threshold 0.63), fetched into fastembed's cache on first use.
    With ``model_path`` (or, when it is not given, the ``HARBOR_EMBED_MODEL_PATH``
    environment variable) naming a directory that holds ``model.onnx`` and the
    model's tokenizer files (``tokenizer.json``, ``tokenizer_config.json``,
    ``config.json``, ``special_tokens_map.json``), that model is loaded offline
    instead: registered with fastembed as a custom model with mean pooling
    (CLS pooling when its ``1_Pooling/config.json`` says so) and normalisation,
    its dimensions read from ``config.json``'s ``hidden_size`` unless given.
    ``model_id`` then records the directory's name, e.g.
    ``local:all-MiniLM-L6-v2-int8``; for a hub model it is the model name.

    The model is loaded in the constructor (so a bad model fails at wiring
    time); inference runs in a worker thread so it never blocks the event loop.

    Args:
        model_name: a fastembed model name (ignored when a model path is used).
        model_path: a local model directory (see above).
        batch_size: texts per ONNX run.
        dimensions: the local model's vector length, if ``config.json`` lacks it.
        model_file: the ONNX file's name inside ``model_path``.
        local_files_only: never download; load the hub model from the cache only.
        cache_dir: fastembed's cache directory (default: its own).
        threads: ONNX runtime threads (default: onnxruntime's choice).
        relevance_threshold: override the calibrated threshold.
        duplicate_threshold: override the calibrated near-duplicate threshold.
        model_id: override the recorded model id.

    Raises:
        EmbedderError: fastembed is not installed (``pip install
            'harbor-pg[fastembed]'``), the directory is incomplete, or the model
            cannot be loaded or downloaded.
    """

    def __init__(
        self,
        model_name: str = DEFAULT_FASTEMBED_MODEL,
        *,
        model_path: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        dimensions: int | None = None,
        model_file: str = "model.onnx",
        local_files_only: bool = False,
        cache_dir: str | None = None,
        threads: int | None = None,
        relevance_threshold: float | None = None,
        model_id: str | None = None,
        duplicate_threshold: float | None = None,
    ) -> None:
        if batch_size < 1:
            raise EmbedderError(f"batch_size must be >= 1, got {batch_size!r}")
        if model_path is None:
            model_path = os.environ.get(MODEL_PATH_ENV) or None
        fastembed = _import_fastembed()
        self._batch_size = batch_size
        self._lock = threading.Lock()
        load_kwargs: dict[str, Any] = {}
        if cache_dir is not None:
            load_kwargs["cache_dir"] = cache_dir
        if threads is not None:
            load_kwargs["threads"] = threads

        if model_path is not None:
            directory = Path(model_path).expanduser()
            fastembed_name, dims, names = self._register_local(
                fastembed, directory, dimensions, model_file
            )
            load_kwargs["specific_model_path"] = str(directory.resolve())
            default_id = f"local:{directory.resolve().name}"
            self.model_path: Path | None = directory.resolve()
        else:
            fastembed_name = model_name
            names = [model_name]
            try:
                dims = int(fastembed.TextEmbedding.get_embedding_size(model_name))
            except ValueError:
                raise EmbedderError(
                    f"fastembed does not know the model {model_name!r}; pass a supported "
                    "model name or model_path= to a local model directory"
                ) from None
            if local_files_only:
                load_kwargs["local_files_only"] = True
            default_id = model_name
            self.model_path = None

        try:
            self._model = fastembed.TextEmbedding(model_name=fastembed_name, **load_kwargs)
        except Exception as exc:
            where = f"from {self.model_path}" if self.model_path else "(download or cache)"
            raise EmbedderError(
                f"could not load embedding model {default_id!r} {where}: "
                f"{type(exc).__name__}: {exc}"
            ) from None

        self.model_name = model_name if model_path is None else fastembed_name
        self._model_id = model_id or default_id
        self._dimensions = dims
        if relevance_threshold is None:
            relevance_threshold = threshold_for_model(*names)
        self._threshold = (
            relevance_threshold if relevance_threshold is not None else UNCALIBRATED_THRESHOLD
        )
        if duplicate_threshold is None:
            duplicate_threshold = duplicate_threshold_for_model(*names)
        self._duplicate_threshold = (
            duplicate_threshold
            if duplicate_threshold is not None
            else UNCALIBRATED_DUPLICATE_THRESHOLD
        )

    @staticmethod
    def _register_local(
        fastembed: Any, directory: Path, dimensions: int | None, model_file: str
    ) -> tuple[str, int, list[str]]:
        """Validate ``directory`` and register it with fastembed; return (name, dims, names)."""
        if not directory.is_dir():
            raise EmbedderError(f"embedding model directory {directory} does not exist")
        missing = [f for f in (model_file, *_REQUIRED_FILES) if not (directory / f).is_file()]
        if missing:
            raise EmbedderError(
                f"embedding model directory {directory} lacks {', '.join(missing)} "
                f"(it needs {model_file} and the model's tokenizer files)"
            )
        config: dict[str, Any] = {}
        if (directory / "config.json").is_file():
            config = _read_json(directory / "config.json")
        if dimensions is None:
            hidden = config.get("hidden_size")
            if not isinstance(hidden, int) or hidden <= 0:
                raise EmbedderError(
                    f"cannot tell the dimensions of the model in {directory}: config.json has "
                    "no hidden_size; pass dimensions="
                )
            dimensions = hidden
        pooling_name = "MEAN"
        pooling_config = directory / "1_Pooling" / "config.json"
        if pooling_config.is_file():
            pooling = _read_json(pooling_config)
            if pooling.get("pooling_mode_cls_token") and not pooling.get(
                "pooling_mode_mean_tokens"
            ):
                pooling_name = "CLS"

        from fastembed.common.model_description import ModelSource, PoolingType

        resolved = directory.resolve()
        # the registry is process-wide and keyed by name: derive the name from
        # everything that shapes the vectors, so two directories never clash
        digest = hashlib.sha256(
            f"{resolved}|{model_file}|{dimensions}|{pooling_name}".encode()
        ).hexdigest()[:12]
        name = f"local/{resolved.name}-{digest}"
        with _register_lock:
            known = {m.model.lower() for m in fastembed.TextEmbedding._list_supported_models()}
            if name.lower() not in known:
                fastembed.TextEmbedding.add_custom_model(
                    model=name,
                    pooling=getattr(PoolingType, pooling_name),
                    normalization=True,
                    sources=ModelSource(hf="local/none"),
                    dim=dimensions,
                    model_file=model_file,
                )
        names = [resolved.name, str(config.get("_name_or_path", ""))]
        return name, dimensions, names

    # model_id, dimensions, __repr__ and embed()'s argument check stand in every embedder
    # (hashing.py, openai.py) on purpose: each class documents its own for help().
    @property
    def model_id(self) -> str:
        """The hub model name, or ``local:<directory name>``."""
        return self._model_id

    @property
    def dimensions(self) -> int:
        """Vector length."""
        return self._dimensions

    @property
    def relevance_threshold(self) -> float:
        """Calibrated threshold (0.63 bge-small, 0.45 MiniLM-L6, else 0.5 uncalibrated)."""
        return self._threshold

    @property
    def duplicate_threshold(self) -> float:
        """Calibrated near-duplicate threshold (0.955 MiniLM-L6, else 0.97 uncalibrated)."""
        return self._duplicate_threshold

    def __repr__(self) -> str:
        return f"FastEmbedEmbedder(model_id={self._model_id!r}, dimensions={self._dimensions})"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` in batches of ``batch_size``, in a worker thread."""
        if isinstance(texts, str):
            raise EmbedderError("embed() takes a sequence of texts; use embed_query() for one")
        items = list(texts)
        if not items:
            return []
        return await asyncio.to_thread(self._run, items, False)

    async def embed_query(self, text: str) -> list[float]:
        """Embed one query with the model's query encoding."""
        return (await asyncio.to_thread(self._run, [text], True))[0]

    def _run(self, texts: list[str], query: bool) -> list[list[float]]:
        if not all(isinstance(t, str) for t in texts):
            raise EmbedderError("every text to embed must be a str")
        try:
            with self._lock:
                if query:
                    rows = list(self._model.query_embed(texts))
                else:
                    rows = list(self._model.embed(texts, batch_size=self._batch_size))
        except Exception as exc:
            raise EmbedderError(
                f"{self._model_id} failed to embed: {type(exc).__name__}: {exc}"
            ) from None
        import numpy as np  # loaded with the model; kept out of ``import harbor_pg``

        matrix = np.asarray(rows, dtype=np.float64)
        if matrix.shape != (len(texts), self._dimensions):
            raise EmbedderError(
                f"{self._model_id} returned vectors of shape {matrix.shape}, "
                f"expected ({len(texts)}, {self._dimensions})"
            )
        if not np.isfinite(matrix).all():
            raise EmbedderError(f"{self._model_id} returned NaN or infinite components")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if (norms == 0).any():
            raise EmbedderError(f"{self._model_id} returned a zero vector")
        result: list[list[float]] = (matrix / norms).tolist()
        return result
