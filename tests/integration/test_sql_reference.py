"""docs/sql.md documents exactly the public functions, views and tables of the schema."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from tests.conftest import PgDatabase

PAGE = Path(__file__).resolve().parents[2] / "docs" / "sql.md"

#: A list item that starts with a backquoted harbor name documents that object:
#: ``- `harbor.name(identity arguments)` `` for a function, ``- `harbor.name` `` otherwise.
ENTRY = re.compile(r"^- `harbor\.(?P<name>[a-z0-9_]+)(?P<args>\([^`]*\))?`", re.M)


def documented() -> tuple[set[str], set[str]]:
    """(functions as ``name(args)``, relations as ``name``) that the page lists."""
    functions: set[str] = set()
    relations: set[str] = set()
    for match in ENTRY.finditer(PAGE.read_text()):
        if match["args"] is not None:
            functions.add(match["name"] + match["args"])
        else:
            relations.add(match["name"])
    return functions, relations


def in_catalog(db: PgDatabase) -> tuple[set[str], set[str]]:
    """(public functions with their identity arguments, public views and tables) of harbor."""
    with psycopg.connect(db.superuser_url) as conn:
        functions = {
            row[0]
            for row in conn.execute(
                "select p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'"
                "  from pg_proc p"
                " where p.pronamespace = 'harbor'::regnamespace and p.proname !~ '^_'"
            )
        }
        relations = {
            row[0]
            for row in conn.execute(
                "select c.relname from pg_class c"
                " where c.relnamespace = 'harbor'::regnamespace"
                "   and c.relkind in ('r', 'p', 'v', 'm') and c.relname !~ '^_'"
            )
        }
    # apply_retention's OUT columns are part of its identity text; the page gives the inputs
    functions = {re.sub(r", OUT [^,)]+[^,)]*", "", f) for f in functions}
    functions = {re.sub(r"\(OUT [^)]*\)", "()", f) for f in functions}
    return functions, relations


def test_every_public_function_and_relation_is_documented(module_db: PgDatabase) -> None:
    page_functions, page_relations = documented()
    catalog_functions, catalog_relations = in_catalog(module_db)
    assert catalog_functions, "the catalog query found no functions"
    assert sorted(catalog_functions - page_functions) == [], "public but not in docs/sql.md"
    assert sorted(catalog_relations - page_relations) == [], "public but not in docs/sql.md"


def test_the_page_documents_nothing_that_does_not_exist(module_db: PgDatabase) -> None:
    page_functions, page_relations = documented()
    catalog_functions, catalog_relations = in_catalog(module_db)
    assert page_functions, "the page lists no functions: the entry pattern no longer matches"
    assert sorted(page_functions - catalog_functions) == [], "in docs/sql.md but not in the schema"
    assert sorted(page_relations - catalog_relations) == [], "in docs/sql.md but not in the schema"
