"""SQLAlchemy Core tables for harbor-pg's schema, and the caller's identity per transaction.

For applications that query memories "directly in SQL" from SQLAlchemy code::

    from sqlalchemy import select
    from harbor_pg.tables import bind_identity, memories

    Session = sessionmaker(engine)           # engine: postgresql+psycopg://harbor_app@...
    bind_identity(Session, lambda: current_owner.get())   # a MemoryOwner per request
    with Session() as session:
        rows = session.execute(select(memories.c.content, memories.c.scope)).all()

Row-level security applies as for any other client: every transaction the
session begins first runs ``harbor.set_identity(..., is_local => true)`` for
the owner the callable returns, so a pooled connection never carries one
request's identity into the next. On a plain ``Connection``, call
:func:`set_identity` at the start of each transaction instead. The tables are
the base tables (``messages``, ``working_state``, ``memories``,
``memory_embeddings``); :func:`reflect` reads every table and view of the
schema from the database, views added by later versions included.

The identity statement is sent with the driver's ``pyformat`` parameters, so
it needs psycopg (3) or psycopg2 under SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Computed,
    FetchedValue,
    Identity,
    Integer,
    MetaData,
    Table,
    Text,
    event,
)
from sqlalchemy.dialects.postgresql import ARRAY, ENUM, JSONB, REAL, TIMESTAMP, TSTZRANGE, TSVECTOR

from harbor_pg.db.connection import identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner

__all__ = [
    "bind_identity",
    "memories",
    "memory_embeddings",
    "messages",
    "metadata",
    "reflect",
    "set_identity",
    "working_state",
]

#: The harbor schema's base tables (read them as harbor_app; the policies filter every row).
metadata = MetaData(schema="harbor")

_scope = ENUM(
    "global",
    "tenant",
    "project",
    "user",
    "session",
    "run",
    name="memory_scope",
    schema="harbor",
    create_type=False,
)
_memory_type = ENUM(
    "fact",
    "preference",
    "decision",
    "episode",
    "summary",
    name="memory_type",
    schema="harbor",
    create_type=False,
)
_sensitivity = ENUM(
    "none", "low", "pii", "sensitive", name="sensitivity", schema="harbor", create_type=False
)
_role = ENUM(
    "system", "user", "assistant", "tool", name="message_role", schema="harbor", create_type=False
)
_tstz = TIMESTAMP(timezone=True)


def _owner_columns() -> list[Column[Any]]:
    return [
        Column("project_id", Text, nullable=False, server_default=""),
        Column("user_id", Text, nullable=False, server_default=""),
        Column("session_id", Text, nullable=False, server_default=""),
        Column("run_id", Text, nullable=False, server_default=""),
    ]


#: Conversation turns (short-term tier), SESSION-scoped.
messages = Table(
    "messages",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("session_id", Text, nullable=False),
    Column("project_id", Text, nullable=False, server_default=""),
    Column("principal_id", Text, nullable=False, server_default=""),
    Column("role", _role, nullable=False),
    Column("content", Text, nullable=False),
    Column("name", Text),
    Column("tool_calls", JSONB, nullable=False),
    Column("tool_call_id", Text),
    Column("metadata", JSONB, nullable=False),
    Column("token_estimate", Integer, nullable=False),
    Column("created_at", _tstz, nullable=False),
)

#: Per-run scratch state (working tier), RUN-scoped; expired rows are invisible.
working_state = Table(
    "working_state",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("project_id", Text, nullable=False, server_default=""),
    Column("user_id", Text, nullable=False),
    Column("session_id", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("principal_id", Text, nullable=False, server_default=""),
    Column("state", JSONB, nullable=False),
    Column("expires_at", _tstz),
    Column("updated_at", _tstz, nullable=False),
)

#: Durable memories (long-term tier), add-only, with validity intervals.
memories = Table(
    "memories",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("id", Text, primary_key=True, server_default=FetchedValue()),
    Column("scope", _scope, nullable=False),
    *_owner_columns(),
    Column("principal_id", Text, nullable=False, server_default=""),
    Column("memory_type", _memory_type, nullable=False),
    Column("importance", REAL, nullable=False),
    Column("content", Text, nullable=False),
    Column("content_hash", Text, nullable=False),
    Column("context", Text),
    Column("entity_ids", ARRAY(Text), nullable=False),
    Column("source", Text, nullable=False),
    Column("sensitivity", _sensitivity, nullable=False),
    Column("valid", TSTZRANGE, nullable=False),
    Column("superseded_by", Text),
    Column("source_session_id", Text),
    Column("source_message_ids", ARRAY(Text), nullable=False),
    Column("metadata", JSONB, nullable=False),
    Column("created_at", _tstz, nullable=False),
    Column("updated_at", _tstz, nullable=False),
    Column(
        "fts",
        TSVECTOR,
        Computed(
            "to_tsvector('english'::regconfig, coalesce(context, '') || ' ' || content)",
            persisted=True,
        ),
    ),
    # whose conversation a memory came from (set by the database; revision 0011)
    Column("source_tenant_id", Text, server_default=FetchedValue()),
    Column("source_user_id", Text, server_default=FetchedValue()),
    # the content hash of the context (set by the database's trigger; revision 0019)
    Column("context_hash", Text, server_default=FetchedValue()),
    # when the memory stops holding (revision 0024)
    Column("expires_at", _tstz),
)

#: One vector per memory and embedding model (and per context variant).
memory_embeddings = Table(
    "memory_embeddings",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("memory_id", Text, primary_key=True),
    Column("model_id", Text, primary_key=True),
    Column("dims", Integer, nullable=False),
    Column("embedding", Vector(), nullable=False),
    Column("scope", _scope, nullable=False),
    *_owner_columns(),
    Column("created_at", _tstz, nullable=False),
    Column("with_context", Boolean, primary_key=True),
    # in the HNSW graph (migration 0018); set by the database's writes, not by callers
    Column("in_graph", Boolean, nullable=False, server_default="false"),
)


def set_identity(connection: Any, owner: MemoryOwner) -> None:
    """Set ``owner`` as the caller's identity for the connection's current transaction.

    ``connection`` is a SQLAlchemy ``Connection`` or ``Session``. Runs
    ``harbor.set_identity(..., is_local => true)`` (with its checks), so the
    identity ends with the transaction. A role binding still wins.
    """
    conn = connection.connection() if hasattr(connection, "get_bind") else connection
    conn.exec_driver_sql(query("set_identity_checked"), identity_params(owner))


def bind_identity(sessions: Any, owner: Callable[[], MemoryOwner | None]) -> None:
    """Set the identity at the start of every transaction a session begins.

    ``sessions`` is a ``sessionmaker`` or a ``Session`` (or its class);
    ``owner`` returns the authenticated caller of the current request (for
    example from a ``contextvars.ContextVar``), or None to set nothing (the
    policies then show no rows).
    """

    @event.listens_for(sessions, "after_begin")
    def _identity(session: Any, transaction: Any, connection: Any) -> None:
        caller = owner()
        if caller is not None:
            connection.exec_driver_sql(query("set_identity_checked"), identity_params(caller))


def reflect(bind: Any, *, views: bool = True) -> MetaData:
    """Every table (and, with ``views``, every view) of the harbor schema, read from ``bind``."""
    found = MetaData(schema="harbor")
    found.reflect(bind, schema="harbor", views=views)
    return found
