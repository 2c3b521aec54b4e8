"""harbor-pg up prints URLs: connection strings are turned into postgresql:// URLs."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from harbor_pg.cli import as_url


@pytest.mark.parametrize(
    ("conninfo", "url"),
    [
        (
            "user=harbor_app dbname=harbor host=/tmp/x/pgdata",
            "postgresql://harbor_app@/harbor?host=%2Ftmp%2Fx%2Fpgdata",
        ),
        (
            "host=db.example.com port=6543 user=a password='p w' dbname=h sslmode=require",
            "postgresql://a:p%20w@db.example.com:6543/h?sslmode=require",
        ),
        ("user=u dbname=d host=/s port=5433", "postgresql://u@/d?host=%2Fs&port=5433"),
        (
            "user=u dbname=d host=/s options='-c lock_timeout=200'",
            "postgresql://u@/d?options=-c%20lock_timeout%3D200&host=%2Fs",
        ),
    ],
)
def test_connection_strings_become_equivalent_urls(conninfo: str, url: str) -> None:
    assert as_url(conninfo) == url
    assert conninfo_to_dict(as_url(conninfo)) == conninfo_to_dict(conninfo)


def test_a_url_is_kept() -> None:
    assert (
        as_url("postgresql://u:p@h:5/d?sslmode=disable") == "postgresql://u:p@h:5/d?sslmode=disable"
    )


def test_a_connection_string_reaches_sqlalchemy_whole() -> None:
    """A quoted value with spaces stays one value on the migrations' engine URL."""
    from sqlalchemy.engine import make_url

    from harbor_pg.db.migrate import _sqlalchemy_url

    url = make_url(_sqlalchemy_url("user=u dbname=d host=/s options='-c lock_timeout=200'"))
    assert dict(url.query) == {
        "user": "u",
        "dbname": "d",
        "host": "/s",
        "options": "-c lock_timeout=200",
    }
