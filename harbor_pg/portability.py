"""Export and import of long-term memories as JSON Lines.

The format (``harbor-pg/memories``, version 1), one JSON object a line, keys sorted:

- a header: ``{"type": "header", "format": "harbor-pg/memories", "version": 1,
  "tenant_id": ..., "elevated": bool, "vectors": bool}``;
- one ``{"type": "memory", ...}`` line per stored row, closed and superseded
  versions included: its id, owner fields, type, content, context, importance,
  entities, provenance (``source``, ``source_session_id``,
  ``source_message_ids``), governance (``sensitivity``, ``metadata``), validity
  (``valid_from``, ``invalid_at``, ``superseded_by``), ``created_at`` and
  ``updated_at`` (ISO 8601, UTC) and, when exported with vectors, its stored
  ``vectors`` (model id, which text, float4 components);
- a trailer ``{"type": "end", "memories": N}``, so a file cut at a line
  boundary is recognised as truncated.

Ids are kept: an import writes each memory under its exported id, so a
re-run writes nothing new (a row with that id exists), a memory whose content
is already current in the same scope under another id is skipped as a
duplicate (the dedup constraint), and an export of the imported database is
the same file. Successors are written before the rows they superseded, so
the links survive.

An import reads and checks the whole input before it writes anything: a line
that is not JSON, a missing header or trailer, another format version, or a
memory line that does not fit the format stops it with the line's number.
Lines the importing identity may not write (another tenant, another owner, a
TENANT memory without the elevated role) are refused, each with its line
number and reason, and the rest is written in batches, one transaction each:
a batch that fails leaves nothing of itself behind.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harbor_pg.db.connection import Database, identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.db.vectors import PgVector
from harbor_pg.embedders.base import Embedder
from harbor_pg.errors import MemoryConfigurationError, MemoryError, MemoryValidationError
from harbor_pg.owner import MAX_ID_LENGTH, MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType, Sensitivity, validate_source
from harbor_pg.tiers.facade import FacadeBase
from harbor_pg.tiers.writer import embed_memories

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ImportReport",
    "Portability",
    "export_memories",
    "import_memories",
]

FORMAT = "harbor-pg/memories"
FORMAT_VERSION = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class PortableManager(Protocol):
    """What export and import use of a :class:`~harbor_pg.manager.MemoryManager`:
    its database and its embedder (None: imported memories without vectors stay so)."""

    @property
    def database(self) -> Database | None: ...

    @property
    def embedder(self) -> Embedder | None: ...


_OWNER_FIELDS = ("project_id", "user_id", "session_id", "run_id")
_VECTOR_CHUNK = 500
#: Memory fields an export leaves out on purpose (none today). A new Memory field must be
#: written by _memory_line, read by _MemoryLine and _params, or named here:
#: tests/unit/test_portability_fields.py fails until it is.
NOT_EXPORTED: frozenset[str] = frozenset()

Progress = Callable[[int, int], None]


@dataclass
class ImportReport:
    """What an import did: lines read, memories written, duplicates skipped, lines refused."""

    read: int = 0
    written: int = 0
    duplicates: int = 0
    vectors: int = 0
    #: (line number, reason) of every memory line that was not written
    refused: list[tuple[int, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line: read, written, skipped as duplicates, refused."""
        return (
            f"read {self.read} memories, wrote {self.written} ({self.vectors} vectors), "
            f"skipped {self.duplicates} as duplicates, refused {len(self.refused)}"
        )


class _VectorLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    with_context: bool
    embedding: list[float] = Field(min_length=1, max_length=16000)

    @field_validator("embedding")
    @classmethod
    def _finite(cls, value: list[float]) -> list[float]:
        if not all(math.isfinite(x) for x in value):
            raise ValueError("a vector component is not a finite number")
        return value


class _MemoryLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["memory"]
    id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    tenant_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    scope: MemoryScope
    project_id: str = Field(max_length=MAX_ID_LENGTH)
    principal_id: str = Field(max_length=MAX_ID_LENGTH)
    user_id: str = Field(max_length=MAX_ID_LENGTH)
    session_id: str = Field(max_length=MAX_ID_LENGTH)
    run_id: str = Field(max_length=MAX_ID_LENGTH)
    memory_type: MemoryType
    content: str = Field(min_length=1)
    content_hash: str
    context: str | None
    importance: float = Field(ge=0.0, le=1.0)
    entity_ids: list[str]
    source: str
    sensitivity: Sensitivity
    valid_from: datetime
    invalid_at: datetime | None
    superseded_by: str | None
    source_session_id: str | None
    source_message_ids: list[str]
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    vectors: list[_VectorLine] | None = None

    @field_validator("content_hash")
    @classmethod
    def _hash(cls, value: str) -> str:
        if not _HEX64.match(value):
            raise ValueError("content_hash must be 64 lower-case hex digits")
        return value

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return validate_source(value)

    @field_validator("valid_from", "invalid_at", "created_at", "updated_at", "expires_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("timestamps must carry a time zone")
        return value

    def check(self) -> None:
        """Raise ValueError when the fields contradict each other."""
        if self.scope is MemoryScope.GLOBAL:
            raise ValueError("GLOBAL memories are not exported or imported")
        if self.invalid_at is not None and self.invalid_at <= self.valid_from:
            raise ValueError("invalid_at must be later than valid_from")
        keyed = {
            MemoryScope.TENANT: (),
            MemoryScope.PROJECT: ("project_id",),
            MemoryScope.USER: ("user_id",),
            MemoryScope.SESSION: ("user_id", "session_id"),
            MemoryScope.RUN: ("user_id", "session_id", "run_id"),
        }[self.scope]
        for name in _OWNER_FIELDS:
            value = getattr(self, name)
            if name in keyed and not value:
                raise ValueError(f"a {self.scope.value} memory needs {name}")
            if (
                name not in keyed
                and value
                and not (self.scope is MemoryScope.RUN and name == "project_id")
            ):
                raise ValueError(f"a {self.scope.value} memory stores no {name}")
        if "\x00" in self.content or (self.context and "\x00" in self.context):
            raise ValueError("text contains a NUL character")


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _memory_line(row: dict[str, Any], vectors: list[dict[str, Any]] | None) -> str:
    obj: dict[str, Any] = {
        "type": "memory",
        "id": row["id"],
        "tenant_id": row["tenant_id"],
        "scope": row["scope"],
        "project_id": row["project_id"],
        "principal_id": row["principal_id"],
        "user_id": row["user_id"],
        "session_id": row["session_id"],
        "run_id": row["run_id"],
        "memory_type": row["memory_type"],
        "content": row["content"],
        "content_hash": row["content_hash"],
        "context": row["context"],
        "importance": float(row["importance"]),
        "entity_ids": list(row["entity_ids"]),
        "source": row["source"],
        "sensitivity": row["sensitivity"],
        "valid_from": _iso(row["valid_from"]),
        "invalid_at": _iso(row["invalid_at"]),
        "superseded_by": row["superseded_by"],
        "source_session_id": row["source_session_id"],
        "source_message_ids": list(row["source_message_ids"]),
        "metadata": row["metadata"],
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "expires_at": _iso(row["expires_at"]),
    }
    if vectors is not None:
        obj["vectors"] = vectors
    return _dumps(obj)


def _require_database(manager: PortableManager) -> Any:
    if manager.database is None:
        raise MemoryConfigurationError("export and import need the PostgreSQL stores")
    return manager.database


async def export_memories(
    manager: PortableManager,
    owner: MemoryOwner,
    destination: str | Path | IO[str],
    *,
    elevated: bool = False,
    vectors: bool = False,
    progress: Progress | None = None,
) -> int:
    """Write ``owner``'s memories (or, ``elevated``, all of its tenant's) as JSON Lines.

    As a bound identity (the default) the export holds what row-level security
    shows ``owner``, less TENANT and GLOBAL memories (they are not the
    identity's to move); ``elevated=True`` reads as the elevated role every
    memory of ``owner.tenant_id``. ``vectors=True`` adds each memory's stored
    vectors. Returns the number of memories written; ``progress(done, total)``
    is called as they are.
    """
    db = _require_database(manager)
    if isinstance(destination, str | Path):
        with open(destination, "w", encoding="utf-8", newline="\n") as handle:
            return await export_memories(
                manager, owner, handle, elevated=elevated, vectors=vectors, progress=progress
            )
    sink: IO[str] = destination
    who = MemoryOwner(tenant_id=owner.tenant_id) if elevated else owner
    header = {
        "type": "header",
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "tenant_id": owner.tenant_id,
        "elevated": elevated,
        "vectors": vectors,
    }
    sink.write(_dumps(header) + "\n")
    written = 0
    async with db.transaction(who, admin=elevated) as conn:
        rows = await (
            await conn.execute(
                query("export_memories"), {"tenant_id": owner.tenant_id, "elevated": elevated}
            )
        ).fetchall()
        total = len(rows)
        for start in range(0, total, _VECTOR_CHUNK):
            chunk = rows[start : start + _VECTOR_CHUNK]
            found: dict[str, list[dict[str, Any]]] = {}
            if vectors:
                stored = await (
                    await conn.execute(
                        query("export_vectors"),
                        {"tenant_id": owner.tenant_id, "ids": [r["id"] for r in chunk]},
                    )
                ).fetchall()
                for v in stored:
                    found.setdefault(v["memory_id"], []).append(
                        {
                            "model_id": v["model_id"],
                            "with_context": v["with_context"],
                            "embedding": [float(x) for x in v["embedding"]],
                        }
                    )
            for row in chunk:
                sink.write(_memory_line(row, found.get(row["id"], []) if vectors else None) + "\n")
            written += len(chunk)
            if progress is not None:
                progress(written, total)
    sink.write(_dumps({"type": "end", "memories": written}) + "\n")
    sink.flush()
    return written


def _lines(source: str | Path | IO[str] | Iterable[str]) -> Iterator[str]:
    if isinstance(source, str | Path):
        with open(source, encoding="utf-8", newline="") as handle:
            yield from handle
    else:
        yield from source


def _bad(number: int, reason: str) -> MemoryValidationError:
    return MemoryValidationError(f"line {number}: {reason}; nothing was imported")


def _parse(source: str | Path | IO[str] | Iterable[str]) -> list[tuple[int, _MemoryLine]]:
    """Every memory line of ``source`` with its line number; raises on the first bad line."""
    header: dict[str, Any] | None = None
    trailer: dict[str, Any] | None = None
    records: list[tuple[int, _MemoryLine]] = []
    number = 0
    for number, raw in enumerate(_lines(source), start=1):
        if trailer is not None:
            if raw.strip():
                raise _bad(number, "a line after the end line")
            continue
        if not raw.endswith("\n"):
            raise _bad(number, "the line is not terminated: the file looks truncated")
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _bad(number, f"not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise _bad(number, "not a JSON object")
        kind = obj.get("type")
        if header is None:
            if kind != "header" or obj.get("format") != FORMAT:
                raise _bad(number, f"the first line must be a {FORMAT} header")
            if obj.get("version") != FORMAT_VERSION:
                raise _bad(
                    number,
                    f"format version {obj.get('version')!r} is not supported "
                    f"(this harbor-pg reads version {FORMAT_VERSION})",
                )
            header = obj
        elif kind == "memory":
            try:
                record = _MemoryLine.model_validate(obj)
                record.check()
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err.get("loc", ()))
                raise _bad(number, f"{where}: {err.get('msg')}") from None
            except ValueError as exc:
                raise _bad(number, str(exc)) from None
            records.append((number, record))
        elif kind == "end":
            if obj.get("memories") != len(records):
                raise _bad(
                    number,
                    f"the end line counts {obj.get('memories')!r} memories, the file holds "
                    f"{len(records)}",
                )
            trailer = obj
        else:
            raise _bad(number, f"unknown line type {kind!r}")
    if header is None:
        raise _bad(max(number, 1), "no header: the input is empty or not an export")
    if trailer is None:
        raise _bad(number + 1, "no end line: the file looks truncated")
    return records


def _row_owner(record: _MemoryLine) -> MemoryOwner:
    """The identity a memory line is written as (its own owner fields)."""
    return MemoryOwner(
        tenant_id=record.tenant_id,
        project_id=record.project_id or None,
        principal_id=record.principal_id or None,
        user_id=record.user_id or None,
        session_id=record.session_id or None,
        run_id=record.run_id or None,
    )


def _refusal(record: _MemoryLine, owner: MemoryOwner, elevated: bool) -> str | None:
    """Why ``owner`` may not write ``record`` (None: it may)."""
    if record.tenant_id != owner.tenant_id:
        return (
            f"tenant {record.tenant_id!r} is not the importing identity's tenant "
            f"{owner.tenant_id!r}"
        )
    if elevated:
        return None
    if record.scope is MemoryScope.TENANT:
        return "a tenant memory needs the elevated role (import as the tenant's administrator)"
    if not owner.can_address(record.scope):
        return f"the importing identity cannot address scope {record.scope.value!r}"
    key = owner.key(record.scope)
    for name in _OWNER_FIELDS:
        if key[name] != getattr(record, name):
            return f"{name} {getattr(record, name)!r} is not the importing identity's"
    if record.principal_id != (owner.principal_id or ""):
        return f"written by principal {record.principal_id!r}, not the importing identity"
    return None


def _params(record: _MemoryLine) -> dict[str, Any]:
    return {
        "tenant_id": record.tenant_id,
        "id": record.id,
        "scope": record.scope.value,
        "project_id": record.project_id,
        "user_id": record.user_id,
        "session_id": record.session_id,
        "run_id": record.run_id,
        "principal_id": record.principal_id,
        "memory_type": record.memory_type.value,
        "importance": record.importance,
        "content": record.content,
        "content_hash": record.content_hash,
        "context": record.context,
        "entity_ids": record.entity_ids,
        "source": record.source,
        "sensitivity": record.sensitivity.value,
        "valid_from": record.valid_from,
        "invalid_at": record.invalid_at,
        "superseded_by": record.superseded_by,
        "source_session_id": record.source_session_id,
        "source_message_ids": record.source_message_ids,
        "metadata": json.dumps(record.metadata),
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "expires_at": record.expires_at,
    }


def _batches(
    records: Sequence[tuple[int, _MemoryLine]], size: int, elevated: bool
) -> Iterator[tuple[bool, list[tuple[int, _MemoryLine]]]]:
    """Consecutive runs of at most ``size`` lines written by one role (admin: TENANT rows)."""
    batch: list[tuple[int, _MemoryLine]] = []
    role = False
    for item in records:
        admin = elevated and item[1].scope is MemoryScope.TENANT
        if batch and (admin != role or len(batch) >= size):
            yield role, batch
            batch = []
        role = admin
        batch.append(item)
    if batch:
        yield role, batch


async def import_memories(
    manager: PortableManager,
    owner: MemoryOwner,
    source: str | Path | IO[str] | Iterable[str],
    *,
    elevated: bool = False,
    batch_size: int = 200,
    embed_missing: bool = True,
    progress: Progress | None = None,
) -> ImportReport:
    """Read a JSON Lines export back into the database (see the module's docstring).

    As a bound identity (the default) every memory is written as ``owner`` and
    a line ``owner`` could not have written is refused; ``elevated=True``
    imports every memory of ``owner.tenant_id`` under its own owner (TENANT
    memories as the elevated role). Vectors in the file are stored as they
    are; a memory without them is embedded with the manager's embedder when
    ``embed_missing``. ``progress(done, total)`` is called after each batch.

    Raises:
        MemoryValidationError: a line is malformed (nothing was written).
        MemoryDatabaseError: a batch failed (earlier batches stay written,
            nothing of the failing one).
    """
    db = _require_database(manager)
    if batch_size < 1:
        raise MemoryValidationError("batch_size must be >= 1")
    records = _parse(source)
    report = ImportReport(read=len(records))
    accepted: list[tuple[int, _MemoryLine]] = []
    for number, record in records:
        reason = _refusal(record, owner, elevated)
        if reason is None:
            accepted.append((number, record))
        else:
            report.refused.append((number, reason))
    total = len(accepted)
    done = 0
    for admin, batch in _batches(accepted, batch_size, elevated):
        vectors = await _batch_vectors(manager, [r for _, r in batch]) if embed_missing else {}
        try:
            if admin:
                async with db.transaction(MemoryOwner(tenant_id=owner.tenant_id), admin=True) as c:
                    await _write(c, batch, None, vectors, report)
            else:
                async with db.transaction(None if elevated else owner) as conn:
                    await _write(conn, batch, elevated, vectors, report)
        except MemoryError as exc:
            first, last = batch[0][0], batch[-1][0]
            raise type(exc)(
                f"lines {first}-{last}: the batch was not written ({exc}); "
                f"{report.written} memories of earlier batches were"
            ) from None
        done += len(batch)
        if progress is not None:
            progress(done, total)
    return report


async def _batch_vectors(
    manager: PortableManager, records: Sequence[_MemoryLine]
) -> dict[str, list[tuple[str, bool, list[float]]]]:
    """Vectors for the records that carry none, from the manager's embedder."""
    if manager.embedder is None:
        return {}
    missing = [r for r in records if r.vectors is None and r.memory_type is not MemoryType.SUMMARY]
    if not missing:
        return {}
    embedded = await embed_memories(
        manager.embedder,
        [Memory(content=r.content, context=r.context, scope=r.scope) for r in missing],
    )
    if embedded is None:
        return {}
    model_id = manager.embedder.model_id
    out: dict[str, list[tuple[str, bool, list[float]]]] = {}
    for record, pair in zip(missing, embedded, strict=True):
        found = [(model_id, False, list(pair.content))]
        if pair.with_context is not None:
            found.append((model_id, True, list(pair.with_context)))
        out[record.id] = found
    return out


async def _write(
    conn: Any,
    batch: Sequence[tuple[int, _MemoryLine]],
    per_row_identity: bool | None,
    embedded: dict[str, list[tuple[str, bool, list[float]]]],
    report: ImportReport,
) -> None:
    """Insert one batch on ``conn`` (inside its transaction)."""
    written = duplicates = stored = 0
    for _number, record in batch:
        if per_row_identity:
            await conn.execute(query("set_identity"), identity_params(_row_owner(record)))
        row = await (await conn.execute(query("import_memory"), _params(record))).fetchone()
        if row is None:
            duplicates += 1
            continue
        written += 1
        vectors = (
            [(v.model_id, v.with_context, v.embedding) for v in record.vectors]
            if record.vectors is not None
            else embedded.get(record.id, [])
        )
        for model_id, with_context, values in vectors:
            await conn.execute(
                query("insert_embedding"),
                {
                    "tenant_id": record.tenant_id,
                    "memory_id": record.id,
                    "model_id": model_id,
                    "dims": len(values),
                    "embedding": PgVector(values),
                    "with_context": with_context,
                },
            )
            stored += 1
    # counted only once the batch's statements all ran (the commit follows)
    report.written += written
    report.duplicates += duplicates
    report.vectors += stored


class Portability(FacadeBase):
    """The facade's export and import (a mixin of :class:`~harbor_pg.manager.MemoryManager`)."""

    async def export_memories(
        self,
        owner: MemoryOwner,
        destination: str | Path | Any,
        *,
        elevated: bool = False,
        vectors: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Write ``owner``'s memories, their whole validity history, as JSON Lines
        (see :mod:`harbor_pg.portability`); ``elevated`` exports the tenant's.
        Returns how many were written."""
        self._check_caller(owner)
        return await export_memories(
            self, owner, destination, elevated=elevated, vectors=vectors, progress=progress
        )

    async def import_memories(
        self,
        owner: MemoryOwner,
        source: str | Path | Any,
        *,
        elevated: bool = False,
        batch_size: int = 200,
        progress: Callable[[int, int], None] | None = None,
    ) -> Any:
        """Read an export back (idempotent: a re-run writes nothing); returns an
        :class:`~harbor_pg.portability.ImportReport` (read, written, duplicates,
        refused lines with reasons). See :mod:`harbor_pg.portability`."""
        self._check_caller(owner)
        return await import_memories(
            self, owner, source, elevated=elevated, batch_size=batch_size, progress=progress
        )
