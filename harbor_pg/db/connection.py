"""Connection pools and the caller's identity, set once per transaction."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import random
import re
import select
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar, cast

import psycopg
import psycopg.adapt
import psycopg.errors
import psycopg.waiting
from psycopg import AsyncConnection, AsyncRawCursor
from psycopg import sql as pgsql
from psycopg.rows import AsyncRowFactory, dict_row, tuple_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from harbor_pg.db.errors import (
    ShardMovedError,
    connect_error,
    harbor_error,
    wrap_db_errors,
    wrap_sync,
)
from harbor_pg.db.server import ADMIN_ROLE, APP_ROLE
from harbor_pg.db.sqlfiles import query
from harbor_pg.db.vectors import register_vector_array
from harbor_pg.errors import (
    MemoryConcurrencyError,
    MemoryConfigurationError,
)
from harbor_pg.owner import MemoryOwner

__all__ = [
    "DEFAULT_TIMEOUT",
    "RETRY_ATTEMPTS",
    "Connection",
    "Database",
    "carried_identity",
    "default_pool_size",
    "elevated_role_setup",
    "harbor_error",
    "wrap_db_errors",
]

log = logging.getLogger("harbor_pg")

Connection = AsyncConnection[dict[str, Any]]
SyncConnection = psycopg.Connection[dict[str, Any]]

_IDLE = psycopg.pq.TransactionStatus.IDLE
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)s|%)|%")


@functools.lru_cache(maxsize=512)
def _server_form(statement: str) -> tuple[str, tuple[str, ...]] | None:
    """``statement`` with its ``%(name)s`` placeholders as the server's ``$n`` (a name
    that repeats keeps its number) and the names in that order, converted once; None for
    a statement this does not convert (another kind of placeholder: psycopg converts it).

    psycopg converts a statement on every execution and caches the conversion only for
    a statement under 4 kB: save_memory, over 6 kB, cost about 45 us of client CPU a
    save to convert."""
    names: dict[str, int] = {}
    unsupported = False

    def server(match: re.Match[str]) -> str:
        nonlocal unsupported
        text = match.group(0)
        if text == "%%":
            return "%"
        name = match.group(1)
        if name is None:
            unsupported = True
            return text
        return f"${names.setdefault(name, len(names) + 1)}"

    converted = _PLACEHOLDER.sub(server, statement)
    return None if unsupported else (converted, tuple(names))


def _server_call(statement: str, params: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """``statement`` in the server's placeholders with ``params``' values in their order
    (:func:`_server_form`); None for a statement that form does not convert."""
    form = _server_form(statement)
    if form is None:
        return None
    text, names = form
    try:
        return text, [params[name] for name in names]
    except KeyError as exc:
        raise psycopg.ProgrammingError(f"query parameter missing: {exc.args[0]}") from None


def _set_role(row: dict[str, Any] | None, target: str) -> psycopg.sql.Composed | None:
    """The SET ROLE a login needs to act as ``target`` (None: none needed).

    A privileged login (superuser / BYPASSRLS) would skip the policies: it must
    switch to the target role, or it is refused.
    """
    assert row is not None
    if row["current_user"] == target:
        return None
    if row["is_member"]:
        return psycopg.sql.SQL("set role {}").format(psycopg.sql.Identifier(target))
    if row["privileged"]:
        raise MemoryConfigurationError(
            f"login {row['current_user']!r} bypasses row-level security and cannot "
            f"switch to {target!r}: connect as {target} or a role bound to an identity"
        )
    return None


Row = TypeVar("Row")
T = TypeVar("T")

#: Seconds a call waits for a database connection before it fails with
#: MemoryDatabaseError (``HARBOR_DATABASE_TIMEOUT`` chooses another).
DEFAULT_TIMEOUT = 5.0
TIMEOUT_ENV = "HARBOR_DATABASE_TIMEOUT"
#: Attempts of a write that a deadlock or serialization failure rolled back.
RETRY_ATTEMPTS = 4
#: Longest pause between two attempts to reach a server that is down (the pool's
#: own back-off doubles up to minutes: a server back after 10 s waited 11-16 s).
_RECONNECT_MAX_DELAY = 0.25


def default_timeout() -> float:
    """``HARBOR_DATABASE_TIMEOUT`` (seconds, > 0) or :data:`DEFAULT_TIMEOUT`."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise MemoryConfigurationError(
            f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds"
        )
    return value


def default_pool_size() -> int:
    """Connections the application pool opens at most: four times the machine's
    cores, between 4 and 16 (``benchmarks/load.py``, 16 clients of mixed load on two
    cores: a pool of 8 served 2-17% more than one of 4, paired, and 12 or 16 no more
    than 8: the calls' round trips overlap the server's work up to there, and past it
    they only queue inside the server)."""
    return min(max(4 * (os.cpu_count() or 2), 4), 16)


class _QuickReconnect(AttemptWithBackoff):
    # retry a server that is down every quarter second at most, not with the
    # pool's doubling back-off: the first call after it is back gets through
    INITIAL_DELAY = 0.05
    DELAY_BACKOFF = 1.5

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, _RECONNECT_MAX_DELAY)


class _Pool(AsyncConnectionPool[Connection]):
    """The pool with a short, flat reconnect back-off, which can adopt a
    connection opened before it (:meth:`Database.open`'s probe) as its first."""

    _adopt: Connection | None = None

    async def _connect(self, timeout: float | None = None) -> Connection:
        adopt, self._adopt = self._adopt, None
        if adopt is None or adopt.closed:
            return await super()._connect(timeout)
        real = self.connection_class
        self.connection_class = _Handover(adopt, real)  # type: ignore[assignment]
        try:
            # the pool's own path: configure, expiry, statistics
            return await super()._connect(timeout)
        finally:
            self.connection_class = real

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = _QuickReconnect(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing)


class _Handover:
    """Stands in for the connection class for one :meth:`_Pool._connect`: the
    first ``connect()`` returns the adopted connection, any other a new one."""

    def __init__(self, conn: Connection, real: Any) -> None:
        self._conn: Connection | None = conn
        self._real = real

    async def connect(self, conninfo: str, **kwargs: Any) -> Connection:
        conn, self._conn = self._conn, None
        if conn is not None:
            return conn
        return await self._real.connect(conninfo, **kwargs)  # type: ignore[no-any-return]


def _alive(conn: Connection) -> bool:
    """Whether a pooled connection still has its server, without a round trip.

    An idle connection's socket has nothing to read unless the server went
    away (a restart closes it) or sent a notice; reading what is there tells
    the two apart (one poll of the socket, no message to the server).
    """
    pgconn = conn.pgconn
    if pgconn.status != psycopg.pq.ConnStatus.OK:
        return False
    try:
        # a server going away sends its FATAL message, then closes: the first read
        # takes the message, a further one meets the end of the stream
        for _ in range(4):
            readable, _, _ = select.select([pgconn.socket], [], [], 0)
            if not readable:
                break
            pgconn.consume_input()
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                return False
        else:
            return False
    except (OSError, ValueError, psycopg.Error):
        return False
    return bool(pgconn.status == psycopg.pq.ConnStatus.OK)


def _json_loads(data: str | bytes) -> Any:
    # most metadata is empty, and most turns' tool calls: skip the parser for them
    # (a new dict or list each time)
    if data == b"{}" or data == "{}":
        return {}
    if data == b"[]" or data == "[]":
        return []
    return json.loads(data)


def _role_switcher(target: str) -> Callable[[Connection], Any]:
    async def configure(conn: Connection) -> None:
        set_json_loads(_json_loads, conn)
        row = await (await conn.execute(query("login_role"), {"target": target})).fetchone()
        if row is not None and row.get("vector_oid") is not None:
            register_vector_array(conn, int(row["vector_oid"]))
        statement = _set_role(row, target)
        if statement is not None:
            await conn.execute(statement)
        await conn.commit()

    return configure


def elevated_role_setup() -> Callable[[Connection], Any]:
    """The ``configure`` of another pool that acts as the elevated role (the job queue's,
    :mod:`harbor_pg.jobs`): SET ROLE harbor_admin when the login is a member of it, as
    :class:`Database`'s own elevated pool does; a privileged login that cannot is refused."""
    return _role_switcher(ADMIN_ROLE)


class Database:
    """Async connection pools for the application and the elevated role.

    Every unit of work runs in :meth:`transaction`, which sets the caller's
    identity with ``harbor.set_identity(..., is_local => true)`` first, so the
    row-level security policies see it and nothing leaks into the next use
    of the pooled connection.
    """

    def __init__(
        self,
        app_url: str,
        admin_url: str | None = None,
        *,
        min_size: int = 1,
        max_size: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self.app_url = app_url
        self.admin_url = admin_url
        #: seconds a call waits for a connection before MemoryDatabaseError
        self.timeout = default_timeout() if timeout is None else float(timeout)
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise MemoryConfigurationError("the database timeout must be a positive number")
        max_size = default_pool_size() if max_size is None else max_size
        # pooled connections stay in autocommit: a one-statement call (most of them,
        # :meth:`fetch_rows_in_one_round_trip`) needs no BEGIN, and turning autocommit
        # on and off around each (two driver calls with the connection's lock) cost
        # about 0.1 ms of client CPU a call; :meth:`transaction` sends its BEGIN itself
        kwargs = {
            "row_factory": dict_row,
            "autocommit": True,
            "connect_timeout": max(2, math.ceil(self.timeout)),
        }
        self._pool: _Pool = _Pool(
            app_url,
            min_size=min(min_size, max_size),
            max_size=max_size,
            open=False,
            kwargs=kwargs,
            configure=_role_switcher(APP_ROLE),
            name="harbor-app",
            timeout=self.timeout,
        )
        self._admin_pool: AsyncConnectionPool[Connection] | None = None
        #: on Citus the identity is set with SET LOCAL (found by :meth:`open`)
        self.set_local = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard: asyncio.Task[None] | None = None
        if admin_url:
            self._admin_pool = _Pool(
                admin_url,
                min_size=0,
                max_size=2,
                open=False,
                kwargs=kwargs,
                configure=_role_switcher(ADMIN_ROLE),
                name="harbor-admin",
                timeout=self.timeout,
            )

    async def open(self) -> None:
        """Open the pools; one clear error if the server cannot be reached."""
        try:
            # one direct attempt first: the pool would retry quietly for its whole
            # timeout and then report only that it timed out
            probe = await AsyncConnection.connect(
                self.app_url,
                row_factory=dict_row,
                autocommit=True,
                connect_timeout=10,
            )
            # it becomes the pool's first connection: a start opens one, not two
            self._pool._adopt = probe
            await self._pool.open(wait=True, timeout=15)
        except Exception as exc:
            adopt, self._pool._adopt = self._pool._adopt, None
            if adopt is not None:
                await adopt.close()
            await self._pool.close()
            raise connect_error(self.app_url, exc) from None
        if self._admin_pool is not None:
            await self._admin_pool.open(wait=False)
        async with wrap_db_errors(), self._pool.connection() as conn:
            row = await (await conn.execute(query("deployment"))).fetchone()
            await conn.rollback()
        self.set_local = bool(row and row["citus"])
        self._loop = asyncio.get_running_loop()
        self._guard = self._loop.create_task(self._close_when_cancelled(), name="harbor-db-guard")

    async def _close_when_cancelled(self) -> None:
        """Wait; when the event loop shuts down (``asyncio.run()`` cancels every
        task), close the pools. Their worker tasks swallow a cancellation that
        arrives while they connect and would keep ``asyncio.run()`` (and the
        process) waiting forever for a manager nobody closed."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self._guard is not None:  # not cancelled by close(): the loop is ending
                await self._close_pools(timeout=1.0)
            raise

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the pools were opened on (they work only on it)."""
        return self._loop

    async def close(self) -> None:
        """Close the pools."""
        guard, self._guard = self._guard, None
        if guard is not None and not guard.done():
            if guard.get_loop() is asyncio.get_running_loop():
                guard.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await guard
            elif not guard.get_loop().is_closed():
                guard.get_loop().call_soon_threadsafe(guard.cancel)
        await self._close_pools()

    async def _close_pools(self, timeout: float = 5.0) -> None:
        await self._pool.close(timeout=timeout)
        if self._admin_pool is not None:
            await self._admin_pool.close(timeout=timeout)

    @contextlib.asynccontextmanager
    async def _connection(self, pool: AsyncConnectionPool[Connection]) -> AsyncIterator[Connection]:
        """A connection from ``pool`` whose server is still there.

        A connection left over from before a server restart is handed back
        (the pool drops it and connects anew) and the next one taken, so a
        restart costs no call. Waits at most :attr:`timeout` in all.

        On a distributed database a connection whose work failed is closed, not
        reused: an error Citus raises while planning inside a function (a statement it
        cannot push down, say) can leave that backend unable to delegate a later call
        to a worker, and then the call runs on the coordinator without the identity
        it carries reaching the workers (its writes are refused there, its reads find
        nothing). A new backend has no such state.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            conn = await pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))
            if _alive(conn):
                break
            await pool.putconn(conn)
        try:
            try:
                yield conn
            except BaseException:
                if not conn.closed:
                    # (as the connection's own context would: a failed rollback is
                    # logged, not raised over the error that got here)
                    try:
                        await conn.rollback()
                    except Exception as exc:
                        log.warning("error ignored in rollback on %s: %s", conn, exc)
                raise
            # the connection's own context commits on the way out; a pooled connection
            # is in autocommit and nearly always idle here, where a commit would only
            # take the connection's lock to find nothing to do
            if not conn.closed and conn.pgconn.transaction_status != _IDLE:
                await conn.commit()
        except BaseException:
            if self.set_local:
                # past its lifetime: the pool closes it on its return and connects anew
                # (psycopg's attribute for the pool's max_lifetime)
                conn._expire_at = 0.0
            raise
        finally:
            await pool.putconn(conn)

    async def retrying(
        self,
        work: Callable[[], Awaitable[T]],
        *,
        attempts: int = RETRY_ATTEMPTS,
        retry_on: type[MemoryConcurrencyError] = MemoryConcurrencyError,
    ) -> T:
        """Run ``work`` (one whole transaction), again when a deadlock or a
        serialization failure rolled it back, up to ``attempts`` times in all,
        with a short random pause between; then :class:`MemoryConcurrencyError`.
        ``retry_on``: only that kind of conflict (the one-round-trip calls retry
        :class:`ShardMovedError` alone: a statement that met a shard a move or an
        isolation had just replaced)."""
        for attempt in range(1, attempts + 1):
            try:
                return await work()
            except retry_on as exc:
                if attempt >= attempts:
                    raise MemoryConcurrencyError(
                        f"{exc} (after {attempts} attempts; nothing of this call was written)"
                    ) from None
                log.info("retrying after a conflicting concurrent transaction: %s", exc)
                await asyncio.sleep(random.uniform(0.005, 0.02) * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def __aenter__(self) -> Database:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _pool_of(self, admin: bool) -> AsyncConnectionPool[Connection]:
        """The application role's pool, or with ``admin`` the elevated role's (refused
        when no admin URL was configured)."""
        if not admin:
            return self._pool
        if self._admin_pool is None:
            raise MemoryConfigurationError(
                "this operation needs the elevated role: configure an admin URL "
                "(HARBOR_ADMIN_DATABASE_URL)"
            )
        return self._admin_pool

    @contextlib.asynccontextmanager
    async def transaction(
        self, owner: MemoryOwner | None, *, admin: bool = False
    ) -> AsyncIterator[Connection]:
        """A connection inside one transaction, with ``owner``'s identity set.

        ``admin=True`` runs as the elevated role (TENANT/GLOBAL writes,
        erasure, retention). Each statement is a round trip of its own; a unit
        of work that is one statement goes through :meth:`fetch_in_one_round_trip`
        instead. Database errors come out as harbor errors.
        """
        pool = self._pool_of(admin)
        async with wrap_db_errors(), self._connection(pool) as conn, conn.transaction():
            if owner is not None and self.set_local:
                await conn.execute(pgsql.SQL(";").join(local_identity(owner)))
            elif owner is not None:
                await conn.execute(query("set_identity"), identity_params(owner))
            yield conn

    async def fetch_in_one_round_trip(
        self,
        owner: MemoryOwner,
        statement: str,
        params: dict[str, Any] | None = None,
        *,
        plan_cache_mode: str | None = None,
        guards: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> list[dict[str, Any]]:
        """Run one statement in its own transaction with ``owner``'s identity set,
        in one round trip; return its rows as dicts (see :meth:`fetch_rows_in_one_round_trip`).
        """
        return await self.fetch_rows_in_one_round_trip(
            owner, statement, params, dict_row, plan_cache_mode=plan_cache_mode, guards=guards
        )

    async def fetch_rows_in_one_round_trip(
        self,
        owner: MemoryOwner,
        statement: str,
        params: dict[str, Any] | None,
        row_factory: AsyncRowFactory[Row],
        *,
        plan_cache_mode: str | None = None,
        guards: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> list[Row]:
        """Run one statement in its own transaction with ``owner``'s identity set,
        in one round trip; return its rows as ``row_factory`` builds them.

        ``plan_cache_mode`` (``force_generic_plan``, ``force_custom_plan``) is set for
        that transaction alone, in the same round trip: a statement prepared on a
        connection (each is, from its first run there: :func:`_exchange`) is planned
        again on every run unless its generic plan looks cheaper than the custom ones
        (for save_memories, a statement of many CTEs, planning was half of a one-memory
        save's time); ``force_generic_plan`` runs the generic plan.

        The identity, the statement and the pipeline sync are all written at once,
        before the first wait for the server. In the extended protocol, statements sent
        outside a transaction block run in one implicit transaction that the
        sync ends: committed if both succeed, rolled back otherwise, and the
        transaction-local identity goes with it. So no BEGIN or COMMIT is sent
        (two statements of server and driver work fewer: 0.29 -> 0.16 ms for a
        trivial statement). (A pipelined :meth:`transaction` cannot do this:
        psycopg syncs after its implicit BEGIN, and fetching a result before
        COMMIT flushes the pipeline.) On an error the server skips to the sync
        and rolls back; the error is raised as a harbor error.

        ``guards``: statements (and their parameters) sent before ``statement``, in the
        same transaction and round trip, each in a statement of its own: one that fails
        (a queued job's ``job_turn_present``, say) rolls back the transaction, and
        ``statement`` does not run.
        """
        results = await self.retrying(
            lambda: self._pipeline(
                owner, [*guards, (statement, params)], row_factory, plan_cache_mode
            ),
            retry_on=ShardMovedError,
        )
        return results[-1]

    async def _pipeline(
        self,
        owner: MemoryOwner,
        statements: Sequence[tuple[str, dict[str, Any] | None]],
        row_factory: AsyncRowFactory[Row],
        plan_cache_mode: str | None,
    ) -> list[list[Row]]:
        """``statements`` in one transaction with ``owner``'s identity, in one round
        trip: each one's rows (none for a statement that returns none)."""
        if not self.set_local and _EXCHANGE:
            sent = _server_statements(owner, statements, plan_cache_mode)
            if sent is not None:
                async with wrap_db_errors(), self._connection(self._pool) as conn:
                    return await _exchange_retried(conn, sent, row_factory, identity=True)
        async with wrap_db_errors(), self._connection(self._pool) as conn:
            # autocommit (as every pooled connection is): psycopg adds no BEGIN (and no
            # sync after it); the pipeline's implicit transaction holds the identity and
            # the statements
            try:
                cursors = []
                # leaving the pipeline block sends the sync and reads every result
                async with conn.pipeline():
                    if self.set_local:
                        # SET LOCAL needs a transaction block (the implicit one of a
                        # pipeline is not): BEGIN and COMMIT go in the same round trip
                        await conn.execute("begin")
                        for command in local_identity(owner):
                            await conn.execute(command)
                        if plan_cache_mode is not None:
                            await conn.execute(
                                query("set_plan_cache_mode"), {"mode": plan_cache_mode}
                            )
                    elif plan_cache_mode is not None:
                        # (one statement for both: each statement of the pipeline costs
                        # client and server work of its own)
                        await _execute(
                            conn,
                            query("set_identity_and_plan_cache_mode"),
                            {**identity_params(owner), "mode": plan_cache_mode},
                            tuple_row,
                            None,
                        )
                    else:
                        await _execute(
                            conn, query("set_identity"), identity_params(owner), tuple_row, None
                        )
                    # a generic plan is a prepared statement's: prepared from its first run
                    # on the connection (psycopg would wait for its sixth, and plan each of
                    # the five before it for their parameters)
                    prepare = True if plan_cache_mode == "force_generic_plan" else None
                    for statement, params in statements:
                        cursors.append(
                            await _execute(conn, statement, params, row_factory, prepare)
                        )
                    if self.set_local:
                        await conn.execute("commit")
                return [await cur.fetchall() if _has_rows(cur.pgresult) else [] for cur in cursors]
            finally:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await conn.rollback()

    async def fetch_each_in_one_round_trip(
        self, owner: MemoryOwner, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[dict[str, Any]]]:
        """Run ``statements`` in order in one transaction with ``owner``'s identity set,
        in one round trip (as :meth:`fetch_rows_in_one_round_trip`); return each one's
        rows as dicts. One that fails rolls the transaction back, and those after it do
        not run.

        For a distributed database, where one statement of several parts (a writing CTE
        and the INSERT that waits on it) is planned in steps, each result copied to the
        workers and committed in two phases, while the same parts as statements of their
        own are each sent whole to the tenant's worker.
        """
        return await self.retrying(
            lambda: self._pipeline(owner, statements, dict_row, None), retry_on=ShardMovedError
        )

    async def fetch_delegated(
        self, statement: str, params: dict[str, Any], *, admin: bool = False
    ) -> list[dict[str, Any]]:
        """:meth:`fetch_rows_delegated` with its rows as dicts."""
        return await self.fetch_rows_delegated(statement, params, dict_row, admin=admin)

    async def fetch_rows_delegated(
        self,
        statement: str,
        params: dict[str, Any],
        row_factory: AsyncRowFactory[Row],
        *,
        admin: bool = False,
    ) -> list[Row]:
        """Run one statement in autocommit, without setting the identity; return its rows
        as ``row_factory`` builds them (again when a shard moved under it, as the
        one-round-trip calls).

        For a call that Citus delegates whole to one worker, the distributed function that
        carries the identity as its arguments and checks them there against the caller's
        (``sql/citus/append.sql``, ``sql/citus/recall.sql``): outside a transaction
        block the coordinator sends the call alone, with no BEGIN, SET LOCAL or COMMIT for
        the worker. ``admin``: as the elevated role (its pool), as :meth:`transaction`.
        """
        pool = self._pool_of(admin)

        # (in one exchange of the extended protocol, as the one-round-trip calls: the
        # statement prepared on its first run on the connection, without psycopg's work
        # per statement; one statement and the sync, so the call is in no transaction
        # block and Citus delegates it)
        call = _server_call(statement, params) if _EXCHANGE else None

        async def once() -> list[Row]:
            async with wrap_db_errors(), self._connection(pool) as conn:
                if call is not None:
                    [rows] = await _exchange_retried(conn, [call], row_factory, identity=False)
                    return rows
                cur = conn.cursor(row_factory=row_factory)
                await cur.execute(statement, params)
                return await cur.fetchall()

        return await self.retrying(once, retry_on=ShardMovedError)

    async def fetch_each_delegated_in_transaction(
        self,
        statements: Sequence[tuple[str, dict[str, Any]]],
        *,
        then: Callable[[list[list[dict[str, Any]]]], Sequence[tuple[str, dict[str, Any]]]]
        | None = None,
        admin: bool = False,
    ) -> list[list[dict[str, Any]]]:
        """Run ``statements`` in order in one transaction block, without setting the
        identity, in one round trip (BEGIN, the statements and COMMIT written at once);
        return each one's rows as dicts. One that fails rolls the transaction back, and
        those after it do not run. ``admin``: as the elevated role.

        For a call that Citus delegates whole to one worker inside a transaction block
        (registered with ``force_delegation``), carrying the identity as its arguments,
        beside statements on the coordinator's own tables in the same transaction (the
        erasure and the job queue's rows, ``sql/citus/erase.sql``).

        ``then``: statements that need the rows of ``statements`` (a turn's jobs need its
        id), built from them and run after them in the same transaction, in a second
        round trip with the COMMIT; their rows follow those of ``statements``.
        """
        pool = self._pool_of(admin)

        async def once() -> list[list[dict[str, Any]]]:
            async with wrap_db_errors(), self._connection(pool) as conn:
                try:
                    cursors = []
                    async with conn.pipeline():
                        await conn.execute("begin")
                        for statement, params in statements:
                            cur = conn.cursor(row_factory=dict_row)
                            await cur.execute(statement, params)
                            cursors.append(cur)
                        if then is None:
                            await conn.execute("commit")
                    rows = [
                        await cur.fetchall() if _has_rows(cur.pgresult) else [] for cur in cursors
                    ]
                    if then is None:
                        return rows
                    cursors = []
                    async with conn.pipeline():
                        for statement, params in then(rows):
                            cur = conn.cursor(row_factory=dict_row)
                            await cur.execute(statement, params)
                            cursors.append(cur)
                        await conn.execute("commit")
                    return rows + [
                        await cur.fetchall() if _has_rows(cur.pgresult) else [] for cur in cursors
                    ]
                finally:
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        with contextlib.suppress(psycopg.Error):
                            await conn.rollback()

        return await self.retrying(once, retry_on=ShardMovedError)

    @contextlib.contextmanager
    def sync_transaction(self, owner: MemoryOwner) -> Iterator[SyncConnection]:
        """A short-lived synchronous connection of its own (not from the pool),
        inside one transaction with ``owner``'s identity set; closed afterwards.

        For synchronous callers that cannot use the async pools: no event loop
        runs the pools, or the caller is inside the loop that does (blocking it
        while waiting on the pool would deadlock). It blocks the calling thread
        for a connection setup and the statement.
        """
        with (
            wrap_sync(),
            psycopg.connect(self.app_url, row_factory=dict_row, connect_timeout=10) as conn,
        ):
            statement = _set_role(
                conn.execute(query("login_role"), {"target": APP_ROLE}).fetchone(), APP_ROLE
            )
            if statement is not None:
                conn.execute(statement)
            conn.commit()
            with conn.transaction():
                if self.set_local:
                    conn.execute(pgsql.SQL(";").join(local_identity(owner)))
                else:
                    conn.execute(query("set_identity"), identity_params(owner))
                yield conn

    @contextlib.asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Connection]:
        """A pooled connection in autocommit mode, for single-statement calls
        that set the identity themselves (one round trip)."""
        async with wrap_db_errors(), self._connection(self._pool) as conn:
            yield conn

    async def fetch_self_identified(
        self, statement: str, params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Run one statement that sets the identity itself (a harbor function that takes
        it as arguments, as ``harbor.recent_turns``) in autocommit, in one round trip;
        return its rows as dicts. As :meth:`autocommit` and ``execute``, with the
        statement sent as :func:`_exchange` sends a one-round-trip call's."""
        call = _server_call(statement, params) if _EXCHANGE else None
        async with wrap_db_errors(), self._connection(self._pool) as conn:
            if call is None:
                cur = await conn.execute(statement, params)
                return await cur.fetchall()
            (rows,) = await _exchange_retried(conn, [call], dict_row, identity=False)
            return rows


async def _execute(
    conn: Connection,
    statement: str,
    params: dict[str, Any] | None,
    row_factory: AsyncRowFactory[Row],
    prepare: bool | None,
) -> psycopg.AsyncCursor[Row] | AsyncRawCursor[Row]:
    """A cursor that has sent ``statement`` with ``params`` (in a pipeline: queued),
    converted to the server's placeholders once (:func:`_server_form`)."""
    call = _server_call(statement, params) if params is not None else None
    if call is None:
        cur = conn.cursor(row_factory=row_factory)
        await cur.execute(statement, params, prepare=prepare)
        return cur
    raw = AsyncRawCursor(conn, row_factory=row_factory)
    await raw.execute(*call, prepare=prepare)
    return raw


def _server_statements(
    owner: MemoryOwner,
    statements: Sequence[tuple[str, dict[str, Any] | None]],
    plan_cache_mode: str | None,
) -> list[tuple[str, list[Any]]] | None:
    """The identity statement and ``statements`` in the server's placeholders with their
    values in order (:func:`_server_form`), for :func:`_exchange`; None when one of them
    has no parameters or placeholders of another kind (psycopg's pipeline sends those)."""
    if plan_cache_mode is not None:
        first: tuple[str, dict[str, Any] | None] = (
            query("set_identity_and_plan_cache_mode"),
            {**identity_params(owner), "mode": plan_cache_mode},
        )
    else:
        first = (query("set_identity"), identity_params(owner))
    sent = []
    for statement, params in (first, *statements):
        call = _server_call(statement, params) if params is not None else None
        if call is None:
            return None
        sent.append(call)
    return sent


class _Prepared:
    """The statements :func:`_exchange` prepared on one connection: name by statement
    text and parameter types (a name is never used twice on a connection)."""

    __slots__ = ("count", "names")

    def __init__(self) -> None:
        self.names: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self.count = 0


#: psycopg's cursor keeps the parts :func:`_exchange` hands a result to (its transformer
#: and the method execute() stores results with); without them, psycopg's pipeline runs
_EXCHANGE = hasattr(AsyncRawCursor, "_set_results") and any(
    "_tx" in vars(cls).get("__annotations__", {}) for cls in AsyncRawCursor.__mro__
)
#: past this many statements prepared on one connection, further ones run unprepared
_PREPARED_MAX = 256
_PIPELINE_SYNC = psycopg.pq.ExecStatus.PIPELINE_SYNC
_FATAL_ERROR = psycopg.pq.ExecStatus.FATAL_ERROR
_PIPELINE_ABORTED = psycopg.pq.ExecStatus.PIPELINE_ABORTED
_COMMAND_OK = psycopg.pq.ExecStatus.COMMAND_OK


async def _exchange_retried(
    conn: Connection,
    statements: list[tuple[str, list[Any]]],
    row_factory: AsyncRowFactory[Row],
    *,
    identity: bool,
) -> list[list[Row]]:
    """:func:`_exchange`, once more after the connection's prepared statements were
    dropped under it (psycopg deallocates every statement of a connection when it rolls
    a transaction back): the failed exchange ran nothing (its transaction was rolled
    back), and the next prepares them anew."""
    try:
        return await _exchange(conn, statements, row_factory, identity=identity)
    except psycopg.errors.InvalidSqlStatementName:
        prepared: _Prepared | None = getattr(conn, "_harbor_prepared", None)
        if prepared is None or not prepared.names:
            raise
        prepared.names.clear()
        return await _exchange(conn, statements, row_factory, identity=identity)


async def _exchange(
    conn: Connection,
    statements: list[tuple[str, list[Any]]],
    row_factory: AsyncRowFactory[Row],
    *,
    identity: bool,
) -> list[list[Row]]:
    """``statements`` (the server's placeholders, their values in order) in one implicit
    transaction and one round trip, in libpq's pipeline mode: the rows of each (none for
    a statement that returns none; ``identity``: the first one sets the identity, and
    its row is not read); the first error among them raised.

    What psycopg's pipeline sends, without its work per statement: psycopg writes each
    statement to the socket as it is queued and polls the socket before and after, and
    gives each a cursor; here every message goes out in one write at the sync, each
    statement is prepared on its first run on the connection (psycopg's, on its sixth),
    and only a result with rows gets a cursor.
    """
    prepared: _Prepared | None = getattr(conn, "_harbor_prepared", None)
    if prepared is None:
        prepared = _Prepared()
        conn._harbor_prepared = prepared  # type: ignore[attr-defined]
    encoding = conn.info.encoding
    tx = psycopg.adapt.Transformer.from_context(conn)
    # what each command's results are: a statement's (its index), or a PREPARE's (its key)
    expected: list[int | tuple[str, tuple[int, ...]]] = []
    async with conn.lock:
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        try:
            for index, (text, values) in enumerate(statements):
                dumped = tx.dump_sequence(values, [psycopg.adapt.PyFormat.AUTO] * len(values))
                types = tx.types or ()
                key = (text, types)
                name = prepared.names.get(key)
                if name is None and len(prepared.names) < _PREPARED_MAX:
                    prepared.count += 1
                    name = prepared.names[key] = b"_harbor_%d" % prepared.count
                    pgconn.send_prepare(name, text.encode(encoding), param_types=types)
                    expected.append(key)
                if name is None:
                    pgconn.send_query_params(
                        text.encode(encoding),
                        dumped,
                        param_types=types,
                        param_formats=tx.formats,
                    )
                else:
                    pgconn.send_query_prepared(name, dumped, param_formats=tx.formats)
                expected.append(index)
            pgconn.pipeline_sync()
            results = await conn.wait(_exchange_gen(pgconn))
            pgconn.exit_pipeline_mode()
        except BaseException:
            # cancelled or cut off with results unread: the connection cannot be used
            # again; closed, the pool replaces it
            for sent in expected:
                if isinstance(sent, tuple):
                    prepared.names.pop(sent, None)
            pgconn.finish()
            raise
    error: psycopg.Error | None = None
    found: list[psycopg.pq.abc.PGresult | None] = [None] * len(statements)
    for sent, command in zip(expected, results, strict=True):
        result = command[-1] if command else None
        if isinstance(sent, tuple):
            if result is None or result.status != _COMMAND_OK:
                prepared.names.pop(sent, None)  # not prepared: the next run prepares it
        else:
            found[sent] = result
        if error is None and result is not None:
            if result.status == _FATAL_ERROR:
                error = psycopg.errors.error_from_result(result, encoding=encoding)
            elif result.status == _PIPELINE_ABORTED and not isinstance(sent, tuple):
                error = psycopg.errors.PipelineAborted("pipeline aborted")
    if error is not None:
        raise error
    rows: list[list[Row]] = []
    for result in found[1:] if identity else found:
        if not _has_rows(result):
            rows.append([])
            continue
        assert result is not None
        if row_factory is dict_row:
            rows.append(cast("list[Row]", _dict_rows(conn, result, encoding)))
            continue
        # a cursor holding the result, as psycopg's execute leaves one (its transformer
        # loads the values, its row factory makes the rows)
        cur = AsyncRawCursor(conn, row_factory=row_factory)
        cur._tx = psycopg.adapt.Transformer(cur)
        cur._set_results([result])
        rows.append(await cur.fetchall())
    return rows


def _dict_rows(
    conn: Connection, result: psycopg.pq.abc.PGresult, encoding: str
) -> list[dict[str, Any]]:
    """``result``'s rows as :func:`~psycopg.rows.dict_row` makes them (the column names,
    each row's values loaded by the connection's adapters), without the cursor that a
    row factory is called with: the cursor and the column descriptions dict_row reads
    its names from cost about 50 us a result, three times the loading of a saved
    memory's 27 columns."""
    tx = psycopg.adapt.Transformer.from_context(conn)
    tx.set_pgresult(result)
    names = [(result.fname(i) or b"").decode(encoding) for i in range(result.nfields)]
    return tx.load_rows(0, result.ntuples, lambda values: dict(zip(names, values, strict=True)))


def _exchange_gen(
    pgconn: psycopg.pq.abc.PGconn,
) -> Generator[psycopg.waiting.Wait, int, list[list[psycopg.pq.abc.PGresult]]]:
    """Flush what was queued, then read every command's results up to the sync's (a
    psycopg wait generator: it yields what it waits for, is sent what is ready)."""
    wait_r, wait_rw = psycopg.waiting.Wait.R, psycopg.waiting.Wait.RW
    while pgconn.flush():
        ready = yield wait_rw
        if ready & psycopg.waiting.Ready.R:
            pgconn.consume_input()
    results: list[list[psycopg.pq.abc.PGresult]] = []
    command: list[psycopg.pq.abc.PGresult] = []
    while True:
        if pgconn.is_busy():
            yield wait_r
            pgconn.consume_input()
            while notify := pgconn.notifies():
                if pgconn.notify_handler:
                    pgconn.notify_handler(notify)
            continue
        result = pgconn.get_result()
        if result is None:
            results.append(command)
            command = []
        elif result.status == _PIPELINE_SYNC:
            return results
        else:
            command.append(result)


def _has_rows(result: psycopg.pq.abc.PGresult | None) -> bool:
    """Whether a statement's result holds rows (a SELECT's, a RETURNING's): read from
    the result itself, not from ``cursor.description``, which builds a column object
    for each column on every call."""
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def identity_params(owner: MemoryOwner) -> dict[str, str | None]:
    """The named parameters of ``set_identity`` for ``owner``."""
    return {
        "tenant_id": owner.tenant_id,
        "project_id": owner.project_id,
        "principal_id": owner.principal_id,
        "user_id": owner.user_id,
        "session_id": owner.session_id,
        "run_id": owner.run_id,
    }


def carried_identity(owner: MemoryOwner, prefix: str = "") -> dict[str, str]:
    """``owner``'s identity as a distributed database's calls carry it: in SET LOCAL
    commands (:func:`local_identity`) and as a delegated call's arguments (each named
    ``prefix`` + the field): '' for a field it lacks, its principal as the user when it
    names none (what ``harbor.set_identity`` would make of it)."""
    values = identity_params(owner)
    values["user_id"] = values["user_id"] or values["principal_id"]
    return {prefix + name: value or "" for name, value in values.items()}


def local_identity(owner: MemoryOwner) -> list[pgsql.Composed]:
    """``owner``'s identity as SET LOCAL commands (``set_identity_local``), for Citus."""
    literals = {name: pgsql.Literal(value) for name, value in carried_identity(owner).items()}
    text = "\n".join(
        line for line in query("set_identity_local").splitlines() if not line.startswith("--")
    )
    return [
        pgsql.SQL(command.strip()).format(**literals)
        for command in text.split(";")
        if command.strip()
    ]
