"""Where the bytes of erased text stay on disk after harbor.erase, and what removes them.

Stores a user's turns and memories holding a unique marker (with other users'
rows around them), erases the user, then greps the database's files (heap,
TOAST and index files under base/<database oid>) and the WAL segments for the
marker after each step of the physical-erasure recipe:

    VACUUM -> VACUUM (FULL) -> CHECKPOINT -> pg_switch_wal() + CHECKPOINT (x3)

Run: python -m benchmarks erasure_residue [--rows 200] [--record]

``--record`` writes the table into benchmarks/RESULTS.md's ``erasure-residue`` section.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path

import psycopg

from benchmarks._common import (
    RESULTS,
    harbor_database,
    machine,
    private_server,
    record,
    with_params,
)
from harbor_pg.db import migrate, server
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory

TABLES = ("messages", "working_state", "memories", "memory_embeddings", "session_state")


async def fill(su: str, marker: str, rows: int) -> None:
    db = harbor_database(su)
    await db.open()
    try:
        manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
        for who in ("dana", "erin", "frank"):
            owner = MemoryOwner(tenant_id="t1", principal_id=who, session_id="s1", run_id="r1")
            text = marker if who == "dana" else f"other{who}"
            await manager.update(owner, {"note": f"state {text}"})
            for i in range(rows):
                await manager.append(
                    owner, ConversationMessage(role="user", content=f"turn {i} {text}")
                )
                await manager.save(owner, Memory(content=f"fact {i} about {text}"))
        receipt = await manager.erase("t1", user_id="dana")
        print(f"erased: {receipt}")
    finally:
        await db.close()


def relation_files(su: str) -> tuple[Path, dict[str, str]]:
    """The database's directory and, per file name, the relation it belongs to."""
    with psycopg.connect(with_params(su, dbname="harbor")) as conn:
        datadir = Path(str(conn.execute("show data_directory").fetchone()[0]))  # type: ignore[index]
        oid = conn.execute("select oid from pg_database where datname = 'harbor'").fetchone()[0]  # type: ignore[index]
        names = {
            str(node): str(rel)
            for node, rel in conn.execute(
                "select pg_relation_filenode(c.oid), c.oid::regclass::text from pg_class c"
                " where pg_relation_filenode(c.oid) is not null"
            ).fetchall()
        }
    return datadir / "base" / str(oid), names | {"": ""}


def scan(su: str, marker: bytes) -> tuple[list[str], int]:
    """Relations whose files hold ``marker``, and the WAL segments that do."""
    base, names = relation_files(su)
    found = set()
    for path in base.iterdir():
        if path.is_file() and marker in path.read_bytes():
            node = path.name.split(".")[0].split("_")[0]
            found.add(names.get(node, f"file {path.name}"))
    wal = base.parent.parent / "pg_wal"
    segments = sum(1 for p in wal.iterdir() if p.is_file() and marker in p.read_bytes())
    return sorted(found), segments


def step(su: str, marker: str, label: str, *statements: str) -> tuple[str, list[str], int]:
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
    relations, segments = scan(su, marker.encode())
    print(f"{label:34s} relations: {', '.join(relations) or '-'}; WAL segments: {segments}")
    return label, relations, segments


def write_results(
    steps: list[tuple[str, list[str], int]], rows: int, *, path: Path = RESULTS
) -> None:
    """Replace RESULTS.md's ``erasure-residue`` section with this run's steps."""
    record(
        "erasure-residue",
        title="Erased text left on disk (`erasure_residue`)",
        data=f"{rows} turns + {rows} memories of the erased user beside two other users';"
        " a marker string searched in every relation file and WAL segment",
        header=["after", "relations whose files hold the marker", "WAL segments"],
        rows=[[label, ", ".join(rels) or "none", segs] for label, rels, segs in steps],
        results=path,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200, help="turns and memories per user")
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args()
    steps = []
    marker = "zqres" + uuid.uuid4().hex[:12]
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        asyncio.run(fill(su, marker, args.rows))
        tables = ", ".join(f"harbor.{t}" for t in TABLES)
        steps.append(step(su, marker, "after erase + CHECKPOINT", "checkpoint"))
        steps.append(
            step(su, marker, "after VACUUM + CHECKPOINT", f"vacuum {tables}", "checkpoint")
        )
        steps.append(
            step(
                su,
                marker,
                "after VACUUM (FULL) + CHECKPOINT",
                f"vacuum (full) {tables}",
                "checkpoint",
            )
        )
        for i in range(3):
            steps.append(
                step(
                    su,
                    marker,
                    f"after pg_switch_wal + CHECKPOINT #{i + 1}",
                    "select pg_switch_wal()",
                    "checkpoint",
                )
            )
    print(f"machine: {machine()}")
    if args.record:
        write_results(steps, args.rows)


if __name__ == "__main__":
    main()
