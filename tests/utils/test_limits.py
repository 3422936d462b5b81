"""Memory the process can still be given: the system's MemAvailable, or less under a container limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer.utils import limits


def _meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


@pytest.mark.skipif(not Path("/proc/meminfo").is_file(), reason="Linux /proc/meminfo")
@pytest.mark.parametrize("limit, usage, expect", [
    ("max", "123", "system"),  # cgroup v2 without a limit
    (str(2**63 - 4096), "5", "system"),  # cgroup v1 without a limit
    (str(2**30), str(2**28), 2**30 - 2**28),  # a container limit that leaves less than the system
    (str(2**20), str(2**21), 0),  # over its limit already
])
def test_available_memory_is_the_least_of_the_system_and_the_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       limit: str, usage: str, expect: object) -> None:
    (tmp_path / "max").write_text(limit + "\n")
    (tmp_path / "current").write_text(usage + "\n")
    monkeypatch.setattr(limits, "_CGROUP_FILES", ((str(tmp_path / "max"), str(tmp_path / "current")),))
    got = limits.available_memory()
    if expect == "system":
        assert abs(got - _meminfo_available()) < 2**28  # MemAvailable moves a little between the two reads
    else:
        assert got == expect
