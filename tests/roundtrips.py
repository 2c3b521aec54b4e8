"""Count client/server round trips on the wire, for tests that promise "one round trip".

:class:`RoundTripProxy` sits between libpq and the server's Unix socket and
forwards bytes unchanged. It counts *flights*: a flight starts when the client
sends after it has received something from the server (or sends for the first
time). A client that writes everything before it waits for an answer makes one
flight, however many TCP writes or protocol messages that takes; each time it
has to wait for a reply before it can send more is another flight. The server
flushes its replies only at a Sync or Flush, so the count does not depend on
timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg import conninfo

if TYPE_CHECKING:
    from harbor_pg.db.connection import Database


@dataclass
class _Link:
    flights: int = 0
    heard_back: bool = True  # the next client write starts a flight


@dataclass
class RoundTripProxy:
    """A Unix-socket proxy in front of the server named by ``url``."""

    url: str
    links: list[_Link] = field(default_factory=list)
    _server: asyncio.AbstractServer | None = None
    _dir: str = ""
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def flights(self) -> int:
        """Flights on every connection since the last :meth:`reset`."""
        return sum(link.flights for link in self.links)

    def reset(self) -> None:
        for link in self.links:
            link.flights = 0

    def _target(self) -> str:
        params = conninfo.conninfo_to_dict(self.url)
        host, port = str(params.get("host") or ""), str(params.get("port") or "5432")
        if not host.startswith("/"):
            raise ValueError("RoundTripProxy needs a server on a Unix socket")
        return os.path.join(host, f".s.PGSQL.{port}")

    def proxied(self, url: str) -> str:
        """``url`` pointed at the proxy instead of the server."""
        params = conninfo.conninfo_to_dict(url)
        params["host"] = self._dir
        params["port"] = "5432"
        return conninfo.make_conninfo(**params)

    async def start(self) -> None:
        target = self._target()
        self._dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")

        async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
            s_reader, s_writer = await asyncio.open_unix_connection(target)
            link = _Link()
            self.links.append(link)

            async def client_to_server() -> None:
                while data := await c_reader.read(65536):
                    if link.heard_back:
                        link.flights += 1
                        link.heard_back = False
                    s_writer.write(data)
                    await s_writer.drain()
                s_writer.close()

            async def server_to_client() -> None:
                while data := await s_reader.read(65536):
                    link.heard_back = True
                    c_writer.write(data)
                    await c_writer.drain()
                c_writer.close()

            with contextlib.suppress(ConnectionError, OSError):
                await asyncio.gather(client_to_server(), server_to_client())

        def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.get_running_loop().create_task(handle(reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._server = await asyncio.start_unix_server(
            track, path=os.path.join(self._dir, ".s.PGSQL.5432")
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self._dir, ".s.PGSQL.5432"))
            os.rmdir(self._dir)


@contextlib.asynccontextmanager
async def counted_database(
    app_url: str, admin_url: str
) -> AsyncIterator[tuple[Database, RoundTripProxy]]:
    """A one-connection :class:`Database` whose traffic goes through a proxy that counts it."""
    from harbor_pg.db.connection import Database

    proxy = RoundTripProxy(app_url)
    await proxy.start()
    db = Database(proxy.proxied(app_url), proxy.proxied(admin_url), min_size=1, max_size=1)
    await db.open()
    try:
        yield db, proxy
    finally:
        await db.close()
        await proxy.stop()
