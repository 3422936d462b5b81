"""PCD reader: ascii, binary, binary_compressed (LZF) and files written by open3d."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest

from sciformer.data.pointcloud.io import read_point_file
from sciformer.data.pointcloud.pcd import lzf_decompress
from sciformer.errors import DataError


def test_lzf_decompress_literals_and_references() -> None:
    assert lzf_decompress(bytes([2]) + b"abc" + bytes([0x20, 2]), 6) == b"abcabc"
    # overlapping reference: distance 2, length 6 after "ab"
    assert lzf_decompress(bytes([1]) + b"ab" + bytes([(4 << 5), 1]), 8) == b"abababab"
    # long reference (length field 7 + extra byte): 'a' then 20 copies at distance 1
    assert lzf_decompress(bytes([0]) + b"a" + bytes([7 << 5, 20 - 2 - 7, 0]), 21) == b"a" * 21
    with pytest.raises(ValueError):
        lzf_decompress(bytes([0x20, 5]), 3)  # reference before the start
    with pytest.raises(ValueError):
        lzf_decompress(bytes([2]) + b"abc", 5)  # wrong size


def _lzf_literals(raw: bytes) -> bytes:
    """A valid LZF stream made of literal runs only."""
    out = bytearray()
    for i in range(0, len(raw), 32):
        chunk = raw[i : i + 32]
        out += bytes([len(chunk) - 1]) + chunk
    return bytes(out)


def _pcd_header(mode: str, n: int) -> bytes:
    return (
        "# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z rgb intensity label\n"
        "SIZE 4 4 4 4 4 4\nTYPE F F F F F U\nCOUNT 1 1 1 1 1 1\n"
        f"WIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {mode}\n"
    ).encode()


@pytest.mark.parametrize("mode", ["ascii", "binary", "binary_compressed"])
def test_pcd_modes(tmp_path: Path, cloud: dict[str, np.ndarray], mode: str) -> None:
    n = len(cloud["coord"])
    coord = cloud["coord"].copy()
    coord[3] = np.nan  # organised-cloud hole: dropped
    rgb = cloud["colour"].astype(np.uint32)
    packed = ((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]).astype(np.uint32).view(np.float32)
    intensity = np.linspace(0, 10, n, dtype=np.float32)
    label = cloud["label"].astype(np.uint32)
    if mode == "ascii":
        body = "".join(
            f"{coord[i, 0]!r} {coord[i, 1]!r} {coord[i, 2]!r} {float(packed[i])!r} {float(intensity[i])!r} {label[i]}\n"
            .replace("np.float32(", "").replace(")", "")
            for i in range(n)
        ).encode()
    else:
        dt = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("rgb", "<f4"), ("i", "<f4"), ("label", "<u4")])
        table = np.empty(n, dt)
        table["x"], table["y"], table["z"] = coord.T
        table["rgb"], table["i"], table["label"] = packed, intensity, label
        if mode == "binary":
            body = table.tobytes()
        else:  # column-major then LZF
            raw = b"".join(np.ascontiguousarray(table[name]).tobytes() for name in dt.names)
            comp = _lzf_literals(raw)
            body = struct.pack("<II", len(comp), len(raw)) + comp
    path = tmp_path / f"c_{mode}.pcd"
    path.write_bytes(_pcd_header(mode, n) + body)
    data = read_point_file(path)
    keep = np.arange(n) != 3
    np.testing.assert_allclose(data["coord"], coord[keep], rtol=1e-6)
    np.testing.assert_allclose(data["colour"], cloud["colour"][keep] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(data["intensity"], intensity[keep], rtol=1e-6)
    np.testing.assert_array_equal(data["label"], label[keep])


@pytest.mark.skipif(importlib.util.find_spec("open3d") is None, reason="open3d not installed (optional)")
def test_pcd_binary_compressed_written_by_open3d(tmp_path: Path) -> None:
    import open3d as o3d

    rng = np.random.default_rng(0)
    pts = rng.normal(size=(500, 3))
    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(pts))
    path = tmp_path / "o3d.pcd"
    assert o3d.io.write_point_cloud(str(path), pcd, write_ascii=False, compressed=True)
    assert b"binary_compressed" in path.read_bytes()[:400]
    np.testing.assert_allclose(read_point_file(path)["coord"], pts, rtol=1e-5, atol=1e-6)


def test_pcd_bad_mode(tmp_path: Path, one_line_error) -> None:
    (tmp_path / "b.pcd").write_bytes(_pcd_header("zip", 1) + b"\0" * 24)
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "b.pcd")
    one_line_error(e, "b.pcd", "DATA mode 'zip'")


def test_pcd_points_disagreeing_with_width_height(tmp_path: Path, one_line_error) -> None:
    """PCL refuses a header whose WIDTH x HEIGHT is not POINTS; reading POINTS of them guessed."""
    head = _pcd_header("binary", 5).replace(b"POINTS 5", b"POINTS 4")
    (tmp_path / "m.pcd").write_bytes(head + b"\0" * 24 * 5)
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "m.pcd")
    one_line_error(e, "m.pcd", "WIDTH x HEIGHT = 5 but POINTS 4")


def _small_pcd(fields: str, sizes: str, types: str, mode: str, n: int) -> bytes:
    count = " ".join("1" for _ in fields.split())
    return (f"# .PCD v0.7\nVERSION 0.7\nFIELDS {fields}\nSIZE {sizes}\nTYPE {types}\nCOUNT {count}\n"
            f"WIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {mode}\n").encode()


def test_pcd_binary_with_several_padding_fields(tmp_path: Path) -> None:
    """'_' may pad a record several times (PCL writes one per padded slot): the named fields
    are read at their offsets, the padding skipped."""
    rows = [(1.5, -2.0, 3.25, 7), (4.0, 5.5, -6.0, 2)]
    body = b"".join(struct.pack("<fff4sf2sH", x, y, z, b"\xff" * 4, 9.0, b"\xee" * 2, lab)
                    for x, y, z, lab in rows)
    head = _small_pcd("x y z _ _ _ label", "4 4 4 4 4 2 2", "F F F F F U U", "binary", 2)
    (tmp_path / "pad.pcd").write_bytes(head + body)
    data = read_point_file(tmp_path / "pad.pcd")
    np.testing.assert_array_equal(data["coord"], [r[:3] for r in rows])
    np.testing.assert_array_equal(data["label"], [7, 2])
    assert not any(k.strip().startswith("_") for k in data)


def test_pcd_ascii_word_names_file_and_line(tmp_path: Path, one_line_error) -> None:
    head = _small_pcd("x y z", "4 4 4", "F F F", "ascii", 3)  # 11 header lines
    (tmp_path / "w.pcd").write_bytes(head + b"0 0 0\n1 abc 1\n2 2 2\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "w.pcd")
    one_line_error(e, "w.pcd:13", "'abc'", "not a number")


@pytest.mark.parametrize(("size", "value"), [(1, "-5"), (1, "300"), (4, "1e20"), (2, "2.5"), (4, "nan")])
def test_pcd_ascii_integer_outside_its_type_refused(tmp_path: Path, one_line_error, size: int, value: str) -> None:
    """An ascii value that is no value of its field's integer type is refused, never wrapped
    (label -5 in U 1 read as 251, 300 as 44, 1e20 in U 4 as 0)."""
    head = _small_pcd("x y z label", f"4 4 4 {size}", "F F F U", "ascii", 3)
    (tmp_path / "l.pcd").write_bytes(head + f"0 0 0 1\n1 1 1 {value}\n2 2 2 1\n".encode())
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "l.pcd")
    one_line_error(e, "l.pcd", "field 'label'", f"holds {float(value):g}")


def test_pcd_ascii_integer_type_limits_read_exactly(tmp_path: Path) -> None:
    head = _small_pcd("x y z label", "4 4 4 1", "F F F U", "ascii", 2)
    (tmp_path / "ok.pcd").write_bytes(head + b"0 0 0 0\n1 1 1 255\n")
    assert read_point_file(tmp_path / "ok.pcd")["label"].tolist() == [0, 255]


def test_pcd_ascii_rgb_written_as_integers_by_pcl(tmp_path: Path, cloud: dict[str, np.ndarray]) -> None:
    """PCL's ascii writer prints an ``rgb`` field declared F 4 as its uint32 bit pattern (1193046),
    not the packed float's value (1.671834e-39): both spellings give the same colours (the integer
    text was read as a float value, its bits scrambled into other colours)."""
    n = len(cloud["coord"])
    rgb = cloud["colour"].astype(np.uint32)
    packed = ((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]).astype(np.uint32)  # (n,) oracle: the bit pattern
    head = _pcd_header("ascii", n)
    for name, text in (("ints", [str(int(p)) for p in packed]),
                       ("floats", [repr(float(p)) for p in packed.view(np.float32)])):
        body = "".join(f"{x!r} {y!r} {z!r} {t} 1.0 0\n" for (x, y, z), t in zip(cloud["coord"].tolist(), text, strict=True))
        (tmp_path / f"{name}.pcd").write_bytes(head + body.encode())
        np.testing.assert_allclose(read_point_file(tmp_path / f"{name}.pcd")["colour"], cloud["colour"] / 255.0, rtol=1e-6)


def test_pcd_ascii_integer_rgb_beside_holes(tmp_path: Path) -> None:
    """A nan hole of an organised cloud decides nothing about how rgb is spelled (it made every
    row's integer colour read as a float value again)."""
    head = _pcd_header("ascii", 2).replace(b"FIELDS x y z rgb intensity label", b"FIELDS x y z rgb intensity label")
    (tmp_path / "h.pcd").write_bytes(head + b"nan nan nan nan 1.0 0\n1 2 3 1193046 1.0 0\n")
    np.testing.assert_allclose(read_point_file(tmp_path / "h.pcd")["colour"], [[18 / 255, 52 / 255, 86 / 255]], rtol=1e-6)
