"""A statement's placeholders converted once to the server's ``$n`` form."""

from harbor_pg.db.connection import _server_form
from harbor_pg.db.sqlfiles import query


def test_named_placeholders_become_numbered_once_each() -> None:
    text, names = _server_form("select %(a)s, %(b)s::text, %(a)s || 'x%%'") or ("", ())
    assert text == "select $1, $2::text, $1 || 'x%'"
    assert names == ("a", "b")


def test_a_statement_without_placeholders_keeps_its_text() -> None:
    assert _server_form("select 1") == ("select 1", ())


def test_other_placeholders_are_left_to_psycopg() -> None:
    assert _server_form("select %s") is None
    assert _server_form("select %(a)b") is None
    assert _server_form("select 'a%b' || %(a)s") is None


def test_save_memory_names_each_parameter_once() -> None:
    form = _server_form(query("save_memory"))
    assert form is not None
    text, names = form
    assert "%(" not in text
    assert len(names) == len(set(names))
    assert {"tenant_id", "content", "embedding", "context_embedding", "model_id"} <= set(names)
