"""Memory the process can still be given (the system's MemAvailable, or less under a container limit);
OS errors of a read as one line naming the file."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize("body", [b"\x93NUM", b"1 2 3\n4 5 6\n", bytes(range(256)) * 4, b""])
def test_check_npy_refuses_a_file_without_the_numpy_magic(tmp_path: Path, body: bytes) -> None:
    """A truncated, renamed text or random file is 'not a .npy file' (numpy called each one
    pickled data and advised loading it with allow_pickle)."""
    (tmp_path / "x.npy").write_bytes(body)
    with pytest.raises(DataError) as e:
        limits.check_npy(tmp_path / "x.npy")
    assert str(e.value) == f"{tmp_path / 'x.npy'}: not a .npy file (no NumPy header)"


def test_check_npy_refuses_python_objects_and_reads_numeric_headers(tmp_path: Path) -> None:
    import numpy as np

    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(DataError) as e:
        limits.check_npy(tmp_path / "obj.npy")
    msg = str(e.value)
    assert "obj.npy" in msg and "Python objects" in msg and "allow_pickle" not in msg and "\n" not in msg
    np.save(tmp_path / "ok.npy", np.zeros((4, 3), dtype="<f4"))
    assert limits.check_npy(tmp_path / "ok.npy") == ((4, 3), np.dtype("<f4"))
    np.savez(tmp_path / "objz.npz", coord=np.array([1, None], dtype=object))
    with pytest.raises(DataError, match=r"objz.npz \[coord\]: the array holds Python objects"):
        limits.npz_members(tmp_path / "objz.npz")


@pytest.mark.parametrize("chunks", [None, (1, 1000, 1000)])
def test_hdf5_dataset_never_written_is_refused(tmp_path: Path, chunks: tuple[int, ...] | None) -> None:
    """A contiguous dataset never written (fill value only: 0 bytes stored) skipped the 1000:1 check
    that chunked ones had: a 1.9 KB .mat v7.3 declaring 763 MiB was allocated in full."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("cube", shape=(200, 1000, 1000), dtype="f4", fillvalue=0.0, chunks=chunks)
        f.create_dataset("small", data=np.zeros((64, 1024), np.float32))
    with h5py.File(tmp_path / "f.h5", "r") as f:
        limits.check_hdf5_dataset(f["small"], "f.h5 [small]")  # written data passes
        with pytest.raises(DataError, match=r"^f\.h5 \[cube\]: array of 762\.9 MiB is stored in 0 B .*decompression bomb"):
            limits.check_hdf5_dataset(f["cube"], "f.h5 [cube]")


def test_the_inflation_ratio_yields_to_a_budget_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 381 MiB label map stored in 160 KiB (ZSTD tiles of zeros) is refused as a bomb by default, with
    the setting that accepts it named; once SCIFORMER_MAX_ARRAY_BYTES is set, that budget alone bounds it."""
    monkeypatch.delenv("SCIFORMER_MAX_ARRAY_BYTES", raising=False)
    nbytes, stored = 20000 * 20000, 160 * 2**10
    with pytest.raises(DataError, match=r"decompression bomb\?.*SCIFORMER_MAX_ARRAY_BYTES=4096M or more"):  # never below the budget
        limits.check_inflation(nbytes, stored, "map.tif")
    monkeypatch.setenv("SCIFORMER_MAX_ARRAY_BYTES", "382M")
    limits.check_inflation(nbytes, stored, "map.tif")  # accepted
    monkeypatch.setenv("SCIFORMER_MAX_ARRAY_BYTES", "100M")
    with pytest.raises(DataError, match="above the 100.0 MiB limit"):
        limits.check_inflation(nbytes, stored, "map.tif")  # the budget still bounds it


def test_npz_object_member_beside_arrays_is_left_out_not_refusing_the_file(tmp_path: Path) -> None:
    """An object 'meta' beside numeric members refused the whole .npz; it is left out of the listing
    (never loaded) and its refusal kept for a caller that names it."""
    import numpy as np

    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, cube=np.zeros((2, 3, 4), np.float32), meta=np.array({"sensor": "x"}, dtype=object),
             names=np.array(["a", 1, None], dtype=object))
        refused: dict[str, str] = {}
        members = limits.npz_members(path, refused)
        assert list(members) == ["cube"] and members["cube"][0] == (2, 3, 4)
        assert sorted(refused) == ["meta", "names"] and "Python objects" in refused["meta"]
