"""Committed migrations do not change.

A revision that has run on a database has done its work there: Alembic never
runs it again, so editing it afterwards leaves that database different from
one migrated by the new text, silently. It happened once: 0008 was re-keyed
in place after it was committed, and migration 0009 repairs the databases its
first version migrated. This test pins the text of every
revision file. When it fails, do not update the hash: put the change in a new
revision. The one exception is a change that leaves every database the same,
such as a comment; then update the hash in the same commit and say so there.
A new revision is added here when it is committed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

VERSIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"

# the first 16 hex digits of the SHA-256 of each file (line endings as LF)
FROZEN = {
    "0001_initial.py": "749bc6995ae59ca9",
    "0001_initial.sql": "4135330dd07542a5",
    "0002_drop_memories_valid_idx.py": "3278d2b43a9f6270",
    "0003_embedding_views.py": "b19691623b414a6f",
    "0004_dedup_key_expression.py": "1b05377e2900cfd7",
    "0005_owner_covering_indexes.py": "47e53dd67e15e71a",
    "0006_hnsw_ef_construction.py": "65b856471a8c1dd5",
    "0007_vector_owner_key.py": "66c4204636eb6980",
    "0008_owner_terms.py": "6c48e4e548eb3067",
    "0009_repair_owner_terms.py": "5cbc203b1ab60a32",
    "0010_embedding_owner_copies.py": "5605a2872c67af8b",
    "0011_memory_provenance_owner.py": "83f6ab6a44189dd8",
    "0014_access_tokens.py": "da339af60580ee14",
    "0015_sensitivity_index.py": "134feaae02112eb7",
    "0016_summary_owner_ids.py": "462a88159cb33022",
    "0017_owner_locks.py": "110c87ac4980b8d5",
    "0018_graph_owners.py": "0dec674b9c9557ff",
    "0019_context_hash.py": "747f8e913c934c43",
    "0020_job_queue.py": "5d69dce24eb0bf30",
    "0020_job_queue.sql": "c70ec4b400a60ad9",
    "0021_current_dedup_unique.py": "cc6cfda2674f5fcb",
    "0022_job_errors.py": "39ad8c407ed4cfa5",
    "0023_drop_entities_index.py": "fb8e0c66b8de80dc",
    "0024_memory_expiry.py": "6432edb51c82d9c4",
    "0025_memory_hits.py": "17ebd6140663948b",
    "0026_observation_type.py": "4ec5ccc83467e236",
    "0027_user_locks.py": "40dd094765b2f0bc",
    "0028_drop_fts_index.py": "50b3fab8c35e5c84",
    "0029_session_extraction_flag.py": "9561349214f2a779",
    "0030_compact_scope_key.py": "70c4dda0ed86e45b",
    "0031_no_own_role_bindings.py": "4df31004a690bf97",
    "0032_summary_frontier.py": "63a76fe2fa2675fc",
}


def fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes().replace(b"\r\n", b"\n")).hexdigest()[:16]


def test_every_revision_file_is_pinned() -> None:
    files = sorted(p.name for p in VERSIONS.iterdir() if p.name[:1].isdigit())
    assert files == sorted(FROZEN), "pin a new revision file in FROZEN when it is committed"


def test_committed_revisions_are_unchanged() -> None:
    changed = [name for name, digest in FROZEN.items() if fingerprint(VERSIONS / name) != digest]
    assert changed == [], (
        f"{changed} changed after they were committed: a database they already migrated "
        "keeps the old result; put the change in a new revision instead"
    )


def test_the_queue_schema_is_the_installed_procrastinates() -> None:
    """0020 froze procrastinate's schema: a procrastinate whose schema differs (a new
    version in pyproject.toml) needs a revision that migrates the queue to it."""
    from procrastinate.schema import SchemaManager

    frozen = (VERSIONS / "0020_job_queue.sql").read_text(encoding="utf-8")
    assert SchemaManager.get_schema() == frozen
