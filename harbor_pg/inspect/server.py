"""Run the inspector under uvicorn until interrupted."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harbor_pg.inspect.app import InspectorSettings, build_app

if TYPE_CHECKING:
    from harbor_pg.manager import MemoryManager

__all__ = ["serve", "url_of"]


def url_of(host: str, port: int) -> str:
    """The URL a browser opens for ``host``:``port`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


async def serve(
    manager: MemoryManager,
    settings: InspectorSettings,
    *,
    ready: Callable[[str], Any] | None = None,
) -> None:
    """Serve the inspector over ``manager`` at ``settings.host``:``settings.port`` until
    cancelled; ``ready(url)`` is called once the socket listens."""
    import uvicorn

    app = build_app(manager, settings)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", lifespan="on"
    )
    web = uvicorn.Server(config)
    if ready is not None:
        original = web.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets=sockets)
            if web.started:
                port = settings.port
                if port == 0 and web.servers and web.servers[0].sockets:
                    port = web.servers[0].sockets[0].getsockname()[1]
                ready(url_of(settings.host, port))

        web.startup = startup  # type: ignore[method-assign]
    await web.serve()
