"""Memory the process can still be given (the system's MemAvailable, or less under a container limit);
OS errors of a read as one line naming the file."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from sciformer.errors import DataError
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


@pytest.mark.parametrize("raised, reason", [
    (PermissionError(errno.EACCES, "Permission denied", "x.ply"), "Permission denied"),
    (OSError(errno.EIO, "Unable to determine if file is accessible as hdf5 (file read failed: ...,\n errno = 5)"), "Input/output error"),
    (OSError("no errno, a library's own words"), "no errno, a library's own words"),
])
def test_an_os_error_while_reading_is_one_line_naming_the_file_and_the_reason(raised: OSError, reason: str) -> None:
    with pytest.raises(DataError) as e, limits.read_errors(Path("tiles") / "x.ply"):
        raise raised
    assert str(e.value) == f"{Path('tiles') / 'x.ply'}: cannot read ({reason})"


@pytest.mark.parametrize("code", [errno.ENOMEM, errno.EMFILE])
def test_running_out_of_memory_or_open_files_is_not_the_files_fault(code: int) -> None:
    with pytest.raises(OSError) as e, limits.read_errors("x.ply"):
        raise OSError(code, "machine")
    assert not isinstance(e.value, DataError) and e.value.errno == code
