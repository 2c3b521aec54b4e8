"""PgVector parameters: pgvector's binary form, equal to the text form bit for bit."""

from __future__ import annotations

import random

import psycopg

from harbor_pg.db.vectors import PgVector
from harbor_pg.tiers.long_term import vector_literal
from tests.conftest import PgDatabase


def test_binary_and_text_vectors_are_the_same_vector(fresh_db: PgDatabase) -> None:
    rng = random.Random(5)
    with psycopg.connect(fresh_db.app_url, autocommit=True) as conn:
        for dims in (1, 3, 384, 1536):
            values = [rng.uniform(-1, 1) for _ in range(dims)]
            values[0] = 1e-40  # a float4 subnormal: rounded the same both ways
            for _ in range(6):  # text protocol first, then prepared
                row = conn.execute(
                    "select %(b)s::public.vector = %(t)s::public.vector,"
                    " public.vector_dims(%(b)s::public.vector)",
                    {"b": PgVector(values), "t": vector_literal(values)},
                ).fetchone()
                assert row == (True, dims)


def test_a_missing_vector_is_null(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.app_url, autocommit=True) as conn:
        row = conn.execute(
            "select %(b)s::public.vector is null, %(b)s::public.vector is not null", {"b": None}
        ).fetchone()
        assert row == (True, False)
