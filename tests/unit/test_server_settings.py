"""The embedded server's shared buffers: sized from the memory we may use."""

from __future__ import annotations

from pathlib import Path

import pytest

from harbor_pg.db import server
from harbor_pg.errors import MemoryConfigurationError

GB = 1024**3


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(server.SHARED_BUFFERS_ENV, raising=False)


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (24 * GB, "6144MB"),  # a quarter
        (2 * GB, "512MB"),
        (256 * 1024**2, "128MB"),  # never below the server's default
        (256 * GB, "8192MB"),  # at most 8 GB
        (int(6.3 * GB), f"{int(6.3 * GB) // 4 // 1024**2}MB"),  # whole megabytes
    ],
)
def test_a_quarter_of_memory_between_128mb_and_8gb(memory: int, expected: str) -> None:
    assert server.embedded_settings(memory) == {"shared_buffers": expected}


def test_unknown_memory_leaves_the_server_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "_memory_bytes", lambda: None)
    assert server.embedded_settings() == {}


def test_the_machine_memory_is_read() -> None:
    memory = server._memory_bytes()
    assert memory is not None and memory > 128 * 1024**2
    assert server.embedded_settings() == server.embedded_settings(memory)


@pytest.mark.parametrize(
    ("value", "expected"), [("2GB", "2GB"), (" 512MB ", "512MB"), ("1 TB", "1TB")]
)
def test_the_environment_chooses_the_size(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv(server.SHARED_BUFFERS_ENV, value)
    assert server.embedded_settings(64 * GB) == {"shared_buffers": expected}


@pytest.mark.parametrize("value", ["lots", "2", "2G", "-1GB", "64MB", "1.5GB"])
def test_a_bad_size_in_the_environment_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(server.SHARED_BUFFERS_ENV, value)
    with pytest.raises(MemoryConfigurationError, match=r"HARBOR_SHARED_BUFFERS=.* at least 128MB"):
        server.embedded_settings()


def _tree(base: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_container_limit_counts_at_every_level_of_a_v2_group(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _tree(
        root,
        {
            "memory.max": "max\n",
            "app/memory.max": "4294967296\n",  # the container: 4 GB
            "app/worker/memory.max": "max\n",  # the process's own group: no limit
        },
    )
    membership = tmp_path / "self"
    membership.write_text("0::/app/worker\n")
    assert server._cgroup_limits(membership, root) == [4 * GB]


def test_a_v1_memory_group_limit_is_read(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _tree(
        root,
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
            "memory/box/memory.limit_in_bytes": "2147483648\n",
        },
    )
    membership = tmp_path / "self"
    membership.write_text("5:cpu,cpuacct:/box\n4:memory:/box\n0::/\n")
    assert server._cgroup_limits(membership, root) == [2 * GB]


def test_unreadable_groups_mean_no_limit(tmp_path: Path) -> None:
    membership = tmp_path / "self"
    membership.write_text("garbage\n")
    assert server._cgroup_limits(membership, tmp_path) == []
    assert server._cgroup_limits(tmp_path / "missing", tmp_path) == []
