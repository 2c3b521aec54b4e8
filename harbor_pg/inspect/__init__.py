"""``harbor-pg inspect``: a local web inspector of what the memory holds and why recall
ranks what it does (Starlette, server-rendered HTML; see docs/inspector.md).

Needs the ``inspect`` extra: ``pip install 'harbor-pg[inspect]'``.
"""

from harbor_pg.inspect.app import InspectorSettings, build_app
from harbor_pg.inspect.server import serve

__all__ = ["InspectorSettings", "build_app", "serve"]
