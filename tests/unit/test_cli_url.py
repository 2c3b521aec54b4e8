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
    ],
)
def test_connection_strings_become_equivalent_urls(conninfo: str, url: str) -> None:
    assert as_url(conninfo) == url
    assert conninfo_to_dict(as_url(conninfo)) == conninfo_to_dict(conninfo)


def test_a_url_is_kept() -> None:
    assert (
        as_url("postgresql://u:p@h:5/d?sslmode=disable") == "postgresql://u:p@h:5/d?sslmode=disable"
    )
