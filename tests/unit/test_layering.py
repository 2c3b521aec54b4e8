"""The package's imports point one way: no module imports one on a higher layer.

The graph is read from the source with :mod:`ast` (nothing is imported), so
the check has no import side effects and also sees imports made inside
functions. The layers are documented in docs/architecture.md; a new module
must be given a layer here, or the test fails and says so.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "harbor_pg"

#: Each unit (a top-level module or subpackage of harbor_pg) and its layer,
#: lowest first. A module may import units on lower layers and modules of its
#: own unit; units that share a layer are peers and may not import each other.
LAYERS: dict[str, int] = {
    "errors": 0,
    "credentials": 0,
    "tokens": 0,
    "telemetry": 0,
    "validation": 1,
    "owner": 1,
    "llm": 1,
    "embedders": 2,
    "records": 2,
    "policy": 3,
    "config": 3,
    "ranking": 3,
    "consolidation": 4,
    "profile": 4,
    "messages": 3,
    "fencing": 4,
    "db": 5,
    "tiers": 6,
    "context": 7,
    "extraction": 7,
    "jobs": 7,
    "changes": 7,
    "tables": 6,
    "access_tokens": 6,
    "portability": 7,
    "governance": 7,
    "reembed": 7,
    "manager": 8,
    "alembic_env": 9,
    # surfaces over the facade
    "chat_history": 9,
    "demo": 9,
    "testing": 9,
    "mcp": 9,
    "inspect": 9,
    # the command line (it runs the demo) and the public names
    "commands": 10,
    "cli": 11,
    "__init__": 11,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every harbor_pg module ``path`` imports, relative imports resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    # names imported under ``if TYPE_CHECKING:`` only annotate: no runtime dependency
    for guard in [n for n in ast.walk(tree) if isinstance(n, ast.If)]:
        if isinstance(guard.test, ast.Name) and guard.test.id == "TYPE_CHECKING":
            guard.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # ``from harbor_pg.context import recall`` imports the module harbor_pg.context.recall
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "harbor_pg" or name.startswith("harbor_pg.")}


def _unit(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_unit_has_a_layer() -> None:
    units = {_unit(module) for module in _graph()}
    missing = sorted(units - LAYERS.keys())
    assert not missing, f"give these harbor_pg modules a layer in {__name__}.LAYERS: {missing}"


def test_no_module_imports_a_higher_layer_or_a_peer() -> None:
    graph = _graph()
    wrong: list[str] = []
    for module, imported in graph.items():
        here = _unit(module)
        for target in sorted(imported):
            if target not in graph:
                continue  # a name imported from a module, not a module
            there = _unit(target)
            if there == here:
                continue
            if LAYERS.get(there, -1) >= LAYERS.get(here, -1):
                wrong.append(
                    f"{module} (layer {LAYERS.get(here)}) imports {target} "
                    f"(layer {LAYERS.get(there)})"
                )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(t for t in targets if t in graph and t != m) for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            for child in edges[node]:
                if child in on_stack:
                    low[node] = min(low[node], low[child])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_cycle() -> None:
    """Not even inside a unit, and not through a package's ``__init__``."""
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from harbor_pg.context.tokens import approximate_tokens\n", "harbor_pg.context.tokens"),
        ("from ..context import prompts\n", "harbor_pg.context.prompts"),
        ("def f():\n    import harbor_pg.manager\n", "harbor_pg.manager"),
    ],
)
def test_the_graph_sees_every_form_of_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: str
) -> None:
    # A module inside a throwaway copy of the package layout, so relative imports resolve.
    package = tmp_path / "harbor_pg"
    (package / "tiers").mkdir(parents=True)
    probe = package / "tiers" / "probe.py"
    probe.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert expected in _imports(probe)
