"""The conformance suite, run by pytest in a project of its own, outside this repository.

The project has no pytest configuration at all (no ini file, no conftest, no
``asyncio_mode``), and its stores only delegate to the in-process ones through
the documented methods: every check must pass, with or without pytest-asyncio
installed (strict mode, the default) and with it switched off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import harbor_pg
from harbor_pg.testing.conformance import MemoryStoreConformance

STORES = textwrap.dedent(
    '''
    """Stores of 'my own' that hand every call to the in-process ones."""
    from harbor_pg import InMemoryLongTermStore, InMemoryShortTermStore, InMemoryWorkingStore


    class Delegating:
        inner_type: type = object

        def __init__(self):
            self.inner = self.inner_type()


    def _forward(name):
        def method(self, *args, **kwargs):
            return getattr(self.inner, name)(*args, **kwargs)

        method.__name__ = name
        return method


    def _build(name, inner, methods):
        namespace = {"inner_type": inner, **{m: _forward(m) for m in methods}}
        return type(name, (Delegating,), namespace)


    MyTurns = _build(
        "MyTurns", InMemoryShortTermStore, ["append", "recent", "after", "count", "clear", "erase"]
    )
    MyScratch = _build(
        "MyScratch", InMemoryWorkingStore, ["get", "update", "clear", "erase", "purge_expired_of"]
    )
    MyMemories = _build(
        "MyMemories",
        InMemoryLongTermStore,
        ["save", "get", "search", "delete", "erase", "apply_retention", "expire_memories_of"],
    )
    '''
)

# docs/integrations.md's example, as a user would paste it
TESTS = textwrap.dedent(
    """
    from harbor_pg import MemoryManager
    from harbor_pg.testing import MemoryStoreConformance

    from my_stores import MyMemories, MyScratch, MyTurns


    class TestMyStores(MemoryStoreConformance):
        async def make_manager(self) -> MemoryManager:
            return MemoryManager(short_term=MyTurns(), working=MyScratch(), long_term=MyMemories())
    """
)


@pytest.mark.parametrize("plugins", [[], ["-p", "no:asyncio"]], ids=["strict", "no-asyncio"])
def test_a_user_project_runs_every_check(tmp_path: Path, plugins: list[str]) -> None:
    project = tmp_path / "user_project"
    project.mkdir()
    (project / "my_stores.py").write_text(STORES)
    (project / "test_my_stores.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    # the harbor_pg this test imported (the checkout under test), then the project
    env["PYTHONPATH"] = os.pathsep.join([str(Path(harbor_pg.__file__).parent.parent), str(project)])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *plugins,
            "--rootdir",
            str(project),
            str(project),
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    checks = [n for n in vars(MemoryStoreConformance) if n.startswith("test_")]
    assert f"{len(checks)} passed" in done.stdout, tail
    assert "skipped" not in done.stdout and "warning" not in done.stdout.lower(), tail
