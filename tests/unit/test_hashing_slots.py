"""The hashing embedder's vectors, bit for bit, against its feature-by-feature form:
the slots it keeps a word change how often it hashes, not what it adds."""

from __future__ import annotations

import math
import random

import pytest

from harbor_pg.embedders.hashing import (
    _STEM_WEIGHT,
    _STOPWORD_WEIGHT,
    _STOPWORDS,
    _TRIGRAM_WEIGHT,
    _WORD,
    _WORD_WEIGHT,
    HashingEmbedder,
    _feature_bits,
    _stem,
)


def _reference(text: str, dimensions: int) -> list[float]:
    # one hashed feature at a time, as the embedder computed them before
    def add(vector: list[float], feature: str, weight: float) -> None:
        bits = _feature_bits(feature)
        vector[bits % dimensions] += weight if bits >> 63 else -weight

    counts: dict[str, float] = {}
    for word in _WORD.findall(text.casefold()):
        counts[word] = counts.get(word, 0.0) + 1.0
    vector = [0.0] * dimensions
    if not counts:
        add(vector, "e:", 1.0)
        return vector
    for word, count in counts.items():
        weight = 1.0 + math.log(count)
        if word in _STOPWORDS:
            add(vector, "w:" + word, _STOPWORD_WEIGHT * weight)
            continue
        add(vector, "w:" + word, _WORD_WEIGHT * weight)
        add(vector, "s:" + _stem(word), _STEM_WEIGHT * weight)
        padded = f"<{word}>"
        grams = [padded[i : i + 3] for i in range(len(padded) - 2)]
        share = _TRIGRAM_WEIGHT * weight / math.sqrt(len(grams))
        for gram in grams:
            add(vector, "t:" + gram, share)
    norm = math.hypot(*vector)
    if norm == 0.0:
        add(vector, "e:", 1.0)
        return vector
    return [x / norm for x in vector]


TEXTS = [
    "",
    "?!",
    "a",
    "I",
    "the the the",
    "Deploys deployed deploying the pipeline, twice: deploy!",
    "u1 works on vector index backup",
    "Straße café naïve résumé 東京 2026-12-06",
    "x y z q",
    "alerts alerting alerted budgets budget_review schema_v2",
    " ".join(["review"] * 7 + ["index"] * 3 + ["and"] * 5),
]


def _random_texts(count: int) -> list[str]:
    rng = random.Random(7)
    words = ["pipeline", "ingest", "deploy", "of", "and", "is", "résumé", "a", "b2", "zz", "é"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(count)]


@pytest.mark.parametrize("dimensions", [16, 384, 1536])
def test_vectors_are_the_feature_by_feature_ones(dimensions: int) -> None:
    embedder = HashingEmbedder(dimensions)
    for text in TEXTS + _random_texts(200):
        got = embedder.embed_sync(text)
        assert got == _reference(text, dimensions), text
        assert len(got) == dimensions


def test_the_same_word_in_two_dimensions_gets_each_its_own_slots() -> None:
    small, large = HashingEmbedder(16), HashingEmbedder(384)
    text = "deploying pipelines"
    assert small.embed_sync(text) == _reference(text, 16)
    assert large.embed_sync(text) == _reference(text, 384)
    assert small.embed_sync(text) == _reference(text, 16)
