"""MATLAB v5 .mat: a compressed variable's data tags are checked against its dimensions before inflating."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from synthetic import traced_peak

from sciformer.data.hsi.mat_v5 import check_v5_file
from sciformer.data.hsi.readers import read_scene
from sciformer.errors import DataError


def _tag(mtype: int, nbytes: int) -> bytes:
    return struct.pack("<II", mtype, nbytes)


def _liar_mat(path: Path, claim: int) -> None:
    """A compressed 10 x 10 x 20 double 'cube' whose real-part tag claims ``claim`` bytes of zeros."""
    body = _tag(14, 0) + _tag(6, 8) + struct.pack("<II", 6, 0)  # miMATRIX, flags: mxDOUBLE_CLASS
    body += _tag(5, 12) + struct.pack("<iii", 10, 10, 20) + b"\0" * 4  # dims (16,000 bytes of doubles)
    body += _tag(1, 4) + b"cube\0\0\0\0" + _tag(9, claim)  # name, real part
    _write_compressed(path, body, claim)


def _write_compressed(path: Path, body: bytes, zeros: int) -> None:
    """A v5 file of one compressed miMATRIX: ``body`` (its tag's size still 0) then ``zeros`` zero bytes."""
    body = _tag(14, len(body) - 8 + zeros) + body[8:]
    packer = zlib.compressobj(9)
    compressed = packer.compress(body) + b"".join(packer.compress(bytes(2**20)) for _ in range(zeros // 2**20))
    compressed += packer.flush()
    head = b"MATLAB 5.0 MAT-file".ljust(116, b" ") + b"\0" * 8 + struct.pack("<H", 0x0100) + b"IM"
    path.write_bytes(head + _tag(15, len(compressed)) + compressed)


def test_data_tag_claiming_more_than_the_dimensions_is_refused_before_inflating(tmp_path: Path) -> None:
    """scipy inflated what the tag claimed (1 GiB from a 1 MB file, 1.6 GB peak) before the shape
    mismatch; the declared 16,000 bytes passed the 1000:1 rule."""
    path = tmp_path / "liar.mat"
    _liar_mat(path, 32 * 2**20)
    with traced_peak() as peak, pytest.raises(DataError) as e:
        read_scene(path)
    msg = str(e.value)
    assert "\n" not in msg and "liar.mat [cube]" in msg and "claims 33,554,432 bytes" in msg and "at most 16,000" in msg
    assert peak[0] < 4 * 2**20, peak


@pytest.mark.parametrize("dtype", [np.float64, np.uint16, np.complex64])
def test_compressed_variables_read_as_saved(tmp_path: Path, dtype: type) -> None:
    rng = np.random.default_rng(0)
    cube = (rng.integers(0, 500, size=(6, 5, 4)) * (1 + 1j if dtype is np.complex64 else 1)).astype(dtype)  # (H, W, B)
    gt = rng.integers(0, 3, size=(6, 5)).astype(np.uint8)  # (H, W)
    scipy.io.savemat(tmp_path / "s.mat", {"cube": cube, "gt": gt, "note": "text"}, do_compression=True)
    check_v5_file(tmp_path / "s.mat")  # real and imaginary parts within their dimensions
    if dtype is not np.complex64:
        np.testing.assert_array_equal(read_scene(tmp_path / "s.mat", image_key="cube").cube, cube)


def _complex_liar(path: Path, values: int, imaginary_claim: int) -> None:
    """A compressed complex double 'z' of ``values`` values (real data in full) whose imaginary tag
    claims ``imaginary_claim`` bytes, beside nothing else."""
    body = _tag(14, 0) + _tag(6, 8) + struct.pack("<II", 6 | 0x0800, 0)  # miMATRIX, flags: complex mxDOUBLE_CLASS
    body += _tag(5, 8) + struct.pack("<ii", values, 1) + struct.pack("<I", 1 << 16 | 1) + b"z\0\0\0"  # dims, small name
    body += _tag(9, 8 * values) + bytes(8 * values) + _tag(9, imaginary_claim)
    _write_compressed(path, body, imaginary_claim)


def test_complex_variable_past_the_inflated_head_is_read_and_its_imaginary_tag_checked(tmp_path: Path) -> None:
    """A complex (100, 100) beside the cube refused the file ('a compressed element's header is longer
    than 64 KiB inflated': the imaginary tag lies after 80 kB of real data); it reads, and an imaginary
    tag there claiming more than the dimensions hold is still refused before inflating it."""
    rng = np.random.default_rng(0)
    cube = rng.random((4, 5, 6)).astype(np.float32)  # (H, W, B)
    z = rng.random((100, 100)) + 1j * rng.random((100, 100))
    scipy.io.savemat(tmp_path / "s.mat", {"cube": cube, "gt": np.ones((4, 5), np.uint8), "z": z}, do_compression=True)
    np.testing.assert_array_equal(read_scene(tmp_path / "s.mat", image_key="cube", label_key="gt").cube, cube)
    _complex_liar(tmp_path / "liar.mat", 10_000, 16 * 2**20)
    with traced_peak() as peak, pytest.raises(DataError, match=r"liar.mat \[z\]: its data element claims 16,777,216 bytes"):
        check_v5_file(tmp_path / "liar.mat")
    assert peak[0] < 4 * 2**20, peak
    _complex_liar(tmp_path / "fair.mat", 10_000, 80_000)
    check_v5_file(tmp_path / "fair.mat")  # within its dimensions
