"""``python -m benchmarks <name> [options]``: run one benchmark; ``--help`` lists them.

Benchmarks are found, not listed: every ``benchmarks/<name>.py`` (no leading
``_``) that defines ``main`` at top level. They are read with :mod:`ast` for
the listing, so ``--help`` imports none of them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover() -> dict[str, str]:
    """Each benchmark's name and the question it answers."""
    found: dict[str, str] = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            continue
        question = ""
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "QUESTION" for t in node.targets)
                and isinstance(node.value, ast.Constant)
            ):
                question = str(node.value.value)
        if not question:
            doc = (ast.get_docstring(tree) or "").strip()
            question = doc.splitlines()[0] if doc else ""
        found[path.stem] = question
    return found


def usage(found: dict[str, str]) -> str:
    width = max((len(n) for n in found), default=0)
    lines = [
        "usage: python -m benchmarks <name> [options]   (python -m benchmarks <name> --help)",
        "",
        "benchmarks:",
        *(f"  {name.ljust(width)}  {question}" for name, question in found.items()),
        "",
        "Common options: --record writes the run's figures into benchmarks/RESULTS.md.",
        "Data sets are kept between runs under $HARBOR_BENCH_DATA (default",
        "~/.cache/harbor-pg/benchmarks) where a benchmark keeps them.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    found = discover()
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage(found))
        return 0
    name, rest = args[0], args[1:]
    if name not in found:
        print(f"no benchmark named {name!r}\n\n{usage(found)}", file=sys.stderr)
        return 2
    # the benchmarks import the harness and each other by their bare names
    sys.path.insert(0, str(HERE))
    module = importlib.import_module(name)
    sys.argv = [f"python -m benchmarks {name}", *rest]
    run = module.main
    # a benchmark whose main() takes no argument reads sys.argv
    result = run(rest) if inspect.signature(run).parameters else run()
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
