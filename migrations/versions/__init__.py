"""Alembic revisions of the harbor schema, frozen once committed.

Each revision is self-contained and hash-pinned
(tests/migration/test_frozen_revisions.py): they repeat each other's index definitions
and helper statements instead of sharing code, so
that what a revision does never changes after it has run somewhere.
"""
