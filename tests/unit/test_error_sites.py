"""Every database error the package reports passes through one map
(:mod:`harbor_pg.db.errors`), so bad input and outages read the same whatever
the path that met them.

The source is read with :mod:`ast`: each place outside the map that catches a
driver error (``except psycopg...``, SQLAlchemy's ``DBAPIError``, or
``contextlib.suppress(psycopg...)``) must either hand the error to the map, or
be one of the control-flow sites listed here with the reason it may keep its
catch. A new ad-hoc translation fails this test.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "harbor_pg"
MAP = PACKAGE / "db" / "errors.py"

#: what a handler may call to report a driver error: the map's functions
MAP_FUNCTIONS = frozenset(
    {"harbor_error", "raise_harbor_error", "connect_error", "migration_error"}
)

#: (file, enclosing function) -> (how many catches, why it may keep them).
#: These decide what to do next; none of them words a database failure.
CONTROL_FLOW: dict[tuple[str, str], tuple[int, str]] = {
    ("db/connection.py", "_alive"): (
        1,
        "a socket probe of an idle pooled connection: any failure means 'not alive'",
    ),
    ("db/connection.py", "Database._pipeline"): (
        1,
        "the rollback after a failed statement; the statement's own error is reported",
    ),
    ("db/connection.py", "Database.fetch_each_delegated_in_transaction.once"): (
        1,
        "the rollback after a failed statement; the statement's own error is reported",
    ),
    ("db/connection.py", "_exchange_retried"): (
        1,
        "prepared statements dropped under the connection: prepared anew and run once "
        "more; an error the second run meets is reported",
    ),
    ("db/migrate.py", "is_current"): (
        1,
        "any failure answers 'not current'; upgrade then migrates or reports why not",
    ),
    ("db/server.py", "_bootstrapped"): (
        2,
        "any failure answers 'not bootstrapped'; bootstrap then makes what is missing",
    ),
    ("db/server.py", "check_url"): (
        1,
        "the driver's URL parser, no database involved: a malformed URL is a "
        "configuration mistake worded by check_url",
    ),
}


def _catches_driver_error(expr: ast.expr | None) -> bool:
    if expr is None:
        return False
    text = ast.unparse(expr)
    return "psycopg" in text or "DBAPIError" in text


def _uses_the_map(body: list[ast.stmt]) -> bool:
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in MAP_FUNCTIONS:
                    return True
    return False


class _Sites(ast.NodeVisitor):
    """Driver-error catches of one file, by enclosing function."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.found: list[tuple[str, int, bool]] = []  # (function, line, uses the map)

    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if _catches_driver_error(node.type):
            self.found.append((".".join(self.scope), node.lineno, _uses_the_map(node.body)))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "suppress" and any(_catches_driver_error(arg) for arg in node.args):
            self.found.append((".".join(self.scope), node.lineno, False))
        self.generic_visit(node)


def _driver_error_sites() -> list[tuple[str, str, int, bool]]:
    sites: list[tuple[str, str, int, bool]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == MAP:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        visitor = _Sites(rel)
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        sites += [(rel, function, line, mapped) for function, line, mapped in visitor.found]
    return sites


def test_every_driver_error_catch_uses_the_map_or_is_control_flow() -> None:
    ad_hoc = [
        f"harbor_pg/{rel}:{line} in {function or '<module>'}"
        for rel, function, line, mapped in _driver_error_sites()
        if not mapped and (rel, function) not in CONTROL_FLOW
    ]
    assert not ad_hoc, (
        "these catch a driver error without passing it to harbor_pg.db.errors: report it "
        f"through the map, or list the site in {__name__}.CONTROL_FLOW with why: {ad_hoc}"
    )


def test_control_flow_sites_are_current() -> None:
    """The allowed list names sites that exist, as many catches as they have
    (a second catch added to an allowed function needs a look too)."""
    counts = Counter(
        (rel, function) for rel, function, _, mapped in _driver_error_sites() if not mapped
    )
    listed = {site: count for site, (count, _) in CONTROL_FLOW.items()}
    assert {site: counts.get(site, 0) for site in listed} == listed


def test_the_scan_sees_a_new_ad_hoc_site() -> None:
    source = (
        "def f():\n"
        "    try:\n"
        "        pass\n"
        "    except psycopg.errors.UniqueViolation as exc:\n"
        "        raise ValueError(f'duplicate: {exc}')\n"
        "    except psycopg.Error as exc:\n"
        "        raise harbor_error(exc)\n"
    )
    visitor = _Sites("x.py")
    visitor.visit(ast.parse(source))
    assert visitor.found == [("f", 4, False), ("f", 6, True)]
