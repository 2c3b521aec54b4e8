"""The Model Context Protocol server: harbor-pg's memory as tools and resources.

``harbor-pg mcp`` runs it (``--help``); :func:`build_server` builds it over a
:class:`~harbor_pg.MemoryManager`. It needs the ``mcp`` extra
(``pip install 'harbor-pg[mcp]'``).
"""

from __future__ import annotations

from harbor_pg.mcp.server import Caller, HarborTokenVerifier, build_server, serve_http, serve_stdio

__all__ = ["Caller", "HarborTokenVerifier", "build_server", "serve_http", "serve_stdio"]
