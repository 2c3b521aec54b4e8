"""``import harbor_pg`` stays light: heavy optional stacks load on first use.

Cold start to first query counts the package import, so LangChain's model and
tracing stack (about 0.3 s) and numpy (about 0.1 s) must not load until a
LangChain model, the chat-history adapter or the local embedding model is used.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "langchain_core.language_models.chat_models",
    "langchain_core.chat_history",
    "langchain_core.tracers",
    "langsmith",
    "numpy",
    # spans are optional: the API loads on the first traced call, never at import
    "opentelemetry.trace",
    # the MCP server and its web stack load only for `harbor-pg mcp`
    "mcp",
    "starlette",
    # and the inspector's templates only for `harbor-pg inspect`
    "jinja2",
)


def _loaded_after(code: str) -> dict[str, bool]:
    probe = (
        f"import json, sys\n{code}\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    loaded: dict[str, bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_import_harbor_pg_does_not_load_heavy_optional_stacks() -> None:
    loaded = _loaded_after("import harbor_pg\nfrom harbor_pg import MemoryManager, MemoryExtractor")
    assert loaded == {m: False for m in HEAVY}


def test_chat_history_adapter_still_loads_on_first_use() -> None:
    loaded = _loaded_after(
        "from harbor_pg import HarborChatMessageHistory\n"
        "from langchain_core.chat_history import BaseChatMessageHistory\n"
        "assert issubclass(HarborChatMessageHistory, BaseChatMessageHistory)"
    )
    assert loaded["langchain_core.chat_history"]


def test_unknown_attribute_is_an_attribute_error() -> None:
    import harbor_pg

    try:
        harbor_pg.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("harbor_pg.NoSuchThing should not exist")
