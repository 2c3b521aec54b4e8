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


#: what a worker that makes a MemoryManager with an explicit embedder does not
#: use, so must not pay for at start (a start during load should cost the
#: running requests nothing measurable)
UNUSED_AT_START = (
    "langchain_core",  # LangChain's message classes: the context builder's, ~0.4 s CPU
    "requests",
    "fastembed",
    "onnxruntime",
    "numpy",
    "opentelemetry",
    "openai",
    "mcp",
    "starlette",
    "jinja2",
    "hypothesis",
    # Alembic and SQLAlchemy load only when a migration runs (not for an up-to-date schema)
    "alembic",
    "sqlalchemy",
)


def _modules_after(code: str) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_harbor_pg_loads_no_submodule() -> None:
    loaded = _modules_after("import harbor_pg")
    assert sorted(m for m in loaded if m.startswith("harbor_pg")) == ["harbor_pg"]
    assert not {m.split(".")[0] for m in loaded} & set(UNUSED_AT_START)


def test_the_manager_with_an_explicit_embedder_loads_only_what_it_uses() -> None:
    loaded = _modules_after(
        "from harbor_pg import HashingEmbedder, MemoryManager, MemoryOwner\n"
        "from harbor_pg.db import migrate, server\n"
        "HashingEmbedder()"
    )
    assert "harbor_pg.manager" in loaded
    assert sorted({m.split(".")[0] for m in loaded} & set(UNUSED_AT_START)) == []


def test_every_public_name_resolves() -> None:
    import harbor_pg

    for name in harbor_pg.__all__:
        assert getattr(harbor_pg, name) is not None, name
    assert set(harbor_pg.__all__) <= set(dir(harbor_pg))
