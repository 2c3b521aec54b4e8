"""Vectors, and a batch's array parameters, sent to PostgreSQL in binary form.

A 384-float vector as text costs the client about 0.3 ms to format (and the
server a parse); packed as pgvector's binary form it costs a few microseconds
and arrives bit for bit. :class:`PgVector` is the parameter type: its dumper is
registered on psycopg's global adapters when this module is imported, with no
type OID, so the server takes the type from the statement's
``%(name)s::public.vector`` cast. Every statement that takes a PgVector must
cast it so, everywhere it uses it.

:class:`BinaryArray` is a list that psycopg sends as a binary array (its element
type that of its first non-null element, a ``text[]`` of strings, a ``jsonb[]`` of
:class:`~psycopg.types.json.Jsonb`), where a plain list goes as text: psycopg
builds an array's text form in Python, quoting and escaping each element (JSON's
quotes all escaped), about 60 us a memory over a batch's columns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types.array import ListBinaryDumper

__all__ = ["BinaryArray", "PgVector", "PgVectorArray", "register_vector_array"]


class PgVector:
    """A vector parameter (float4 components, as pgvector stores them)."""

    __slots__ = ("values",)

    def __init__(self, values: Sequence[float]) -> None:
        self.values = tuple(map(float, values))

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"PgVector({len(self.values)} dimensions)"


class _PgVectorBinaryDumper(Dumper):
    format = Format.BINARY
    oid = 0  # the server infers public.vector from the statement's cast

    def dump(self, obj: PgVector) -> bytes:
        values = obj.values
        # pgvector's binary form: int16 dimensions, int16 unused, float4 components
        return struct.pack(f">HH{len(values)}f", len(values), 0, *values)


psycopg.adapters.register_dumper(PgVector, _PgVectorBinaryDumper)


class PgVectorArray:
    """A ``public.vector[]`` parameter: one vector (or None) per element, sent in
    PostgreSQL's binary array form (a batch of 256 vectors in one parameter).

    The binary form names the element type's OID, which differs from one
    database to the next: :func:`register_vector_array` registers the dumper on
    each pooled connection with its database's OID. Statements cast it
    ``%(name)s::public.vector[]``.
    """

    __slots__ = ("values",)

    def __init__(self, values: Sequence[Sequence[float] | None]) -> None:
        # components as given: the caller checked them (a non-number fails in the dumper)
        self.values = list(values)

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"PgVectorArray({len(self.values)} vectors)"


def register_vector_array(conn: psycopg.AsyncConnection[object], vector_oid: int) -> None:
    """Make ``conn`` send :class:`PgVectorArray` parameters (``vector_oid``: the OID of
    ``public.vector`` in its database)."""

    class _Dumper(Dumper):
        format = Format.BINARY
        oid = 0  # the statement's cast names the array type

        def dump(self, obj: PgVectorArray) -> bytes:
            values = obj.values
            if not values:
                return struct.pack(">iiI", 0, 0, vector_oid)  # no dimensions: empty
            has_null = any(v is None for v in values)
            # header: dimensions, has-nulls flag, element OID, then length and lower bound
            parts = [struct.pack(">iiIii", 1, int(has_null), vector_oid, len(values), 1)]
            for v in values:
                if v is None:
                    parts.append(b"\xff\xff\xff\xff")  # length -1: NULL
                else:
                    n = len(v)
                    parts.append(struct.pack(f">iHH{n}f", 4 + 4 * n, n, 0, *v))
            return b"".join(parts)

    conn.adapters.register_dumper(PgVectorArray, _Dumper)


class BinaryArray(list):  # type: ignore[type-arg]
    """A list parameter sent in PostgreSQL's binary array form (psycopg's own binary
    dumpers, each element by the dumper of the first non-null one): for elements all of
    one type, strings (``text[]``), :class:`~psycopg.types.json.Jsonb` (``jsonb[]``) or
    time-zone-aware datetimes (``timestamptz[]``); one of only None goes as a plain
    list does. The statement casts it to its array type."""

    __slots__ = ()


psycopg.adapters.register_dumper(BinaryArray, ListBinaryDumper)
