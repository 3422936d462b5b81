"""PLY reader (ascii, binary little/big endian) and the atomic binary writer."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from synthetic import traced_peak

from sciformer.data.pointcloud.io import read_point_file, write_ply
from sciformer.errors import DataError


def _ply_header(fmt: str, n: int, faces: int = 0) -> bytes:
    lines = ["ply", f"format {fmt} 1.0", "comment made by a test", f"element vertex {n}",
             "property float x", "property float y", "property float z",
             "property float nx", "property float ny", "property float nz",
             "property uchar red", "property uchar green", "property uchar blue", "property int label"]
    if faces:
        lines += [f"element face {faces}", "property list uchar int vertex_indices"]
    return ("\n".join(lines + ["end_header"]) + "\n").encode()


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian", "binary_big_endian"])
def test_ply_formats(tmp_path: Path, cloud: dict[str, np.ndarray], fmt: str) -> None:
    n = len(cloud["coord"])
    faces = [[0, 1, 2], [2, 3, 4, 5]]  # a triangle and a quad
    path = tmp_path / f"c_{fmt}.ply"
    if fmt == "ascii":
        rows = [
            " ".join(f"{v:.7g}" for v in (*cloud["coord"][i], *cloud["normal"][i]))
            + " " + " ".join(str(int(v)) for v in (*cloud["colour"][i], cloud["label"][i]))
            for i in range(n)
        ]
        body = ("\n".join(rows) + "\n" + "".join(f"{len(f)} {' '.join(map(str, f))}\n" for f in faces)).encode()
    else:
        o = "<" if fmt == "binary_little_endian" else ">"
        dt = np.dtype([("xyz", o + "f4", (3,)), ("n", o + "f4", (3,)), ("rgb", "u1", (3,)), ("label", o + "i4")])
        table = np.empty(n, dt)
        table["xyz"], table["n"], table["rgb"], table["label"] = cloud["coord"], cloud["normal"], cloud["colour"], cloud["label"]
        body = table.tobytes() + b"".join(struct.pack(o + "B" + "i" * len(f), len(f), *f) for f in faces)
    path.write_bytes(_ply_header(fmt, n, len(faces)) + body)
    data = read_point_file(path)
    assert data["coord"].dtype == np.float64 and data["coord"].shape == (n, 3)
    np.testing.assert_allclose(data["coord"], cloud["coord"], rtol=1e-6)
    np.testing.assert_allclose(data["normal"], cloud["normal"], rtol=1e-6)
    np.testing.assert_allclose(data["colour"], cloud["colour"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data["label"], cloud["label"])
    assert data["label"].dtype == np.int64
    np.testing.assert_array_equal(data["faces"], [[0, 1, 2], [2, 3, 4], [2, 4, 5]])  # quad fan-triangulated


def test_write_ply_round_trip_and_atomic(tmp_path: Path, cloud: dict[str, np.ndarray]) -> None:
    path = tmp_path / "out" / "pred.ply"
    path.parent.mkdir()
    path.write_text("old content")
    colour_f = cloud["colour"] / 255.0
    pred = np.arange(7, dtype=np.int64)
    write_ply(path, cloud["coord"], colour_f, pred=pred, label=cloud["label"].astype(np.int64), score=np.linspace(0, 1, 7))
    assert sorted(p.name for p in path.parent.iterdir()) == ["pred.ply"]  # no temp file left behind
    assert path.read_bytes().startswith(b"ply\nformat binary_little_endian 1.0\n")
    data = read_point_file(path)
    np.testing.assert_array_equal(data["coord"], cloud["coord"])
    np.testing.assert_array_equal(np.round(data["colour"] * 255), cloud["colour"])
    np.testing.assert_array_equal(data["pred"], pred)
    np.testing.assert_array_equal(data["label"], cloud["label"])
    np.testing.assert_allclose(data["score"], np.linspace(0, 1, 7))


def test_write_ply_keeps_double_coordinates(tmp_path: Path) -> None:
    coord = np.array([[600000.123, 5000000.456, 200.01], [600001.0, 5000001.0, 201.0]])
    write_ply(tmp_path / "geo.ply", coord, normal=np.eye(3)[:2])
    data = read_point_file(tmp_path / "geo.ply")
    np.testing.assert_array_equal(data["coord"], coord)
    np.testing.assert_array_equal(data["normal"], np.eye(3)[:2])


def test_write_ply_bad_input(tmp_path: Path, one_line_error) -> None:
    with pytest.raises(DataError) as e:
        write_ply(tmp_path / "a.ply", np.zeros((4, 2)))
    one_line_error(e, "coord", "(n, 3)")
    with pytest.raises(DataError) as e:
        write_ply(tmp_path / "a.ply", np.zeros((4, 3)), pred=np.zeros(3))
    one_line_error(e, "'pred'", "(4,)")
    assert not (tmp_path / "a.ply").exists()


def test_ply_bad_files(tmp_path: Path, one_line_error) -> None:
    (tmp_path / "x.ply").write_bytes(b"plx\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "x.ply")
    one_line_error(e, "x.ply", "not a PLY")
    (tmp_path / "t.ply").write_bytes(_ply_header("binary_little_endian", 10) + b"\0" * 20)
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "t.ply")
    one_line_error(e, "t.ply", "truncated")
    (tmp_path / "e.ply").write_bytes(_ply_header("binary_little_endian", 0))
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "e.ply")
    one_line_error(e, "e.ply", "empty point cloud")


@pytest.mark.parametrize("value", ["-5", "300", "1e23", "1.5"])
def test_ply_ascii_integer_outside_its_type_refused(tmp_path: Path, one_line_error, value: str) -> None:
    """An ascii value that is no value of its property's type is refused, never wrapped
    (uchar label -5, 300, 1e23 read as 251, 44, 0)."""
    head = ("ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\n"
            "property float z\nproperty uchar label\nend_header\n")
    (tmp_path / "l.ply").write_text(head + f"0 0 0 255\n1 0 0 {value}\n0 1 0 0\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "l.ply")
    one_line_error(e, "l.ply", "property 'label'", f"holds {float(value):g}", "uint8")
    (tmp_path / "l.ply").write_text(head + "0 0 0 255\n1 0 0 7\n0 1 0 0\n")
    assert read_point_file(tmp_path / "l.ply")["label"].tolist() == [255, 7, 0]


def test_ply_ascii_face_count_disagreeing_with_indices(tmp_path: Path, one_line_error) -> None:
    """A face line whose count is not its indices' is refused (it was read as a triangle)."""
    head = ("ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 1\nproperty list uchar int vertex_indices\nend_header\n0 0 0\n1 0 0\n0 1 0\n")
    (tmp_path / "k.ply").write_text(head + "999999999999999999999 0 1 2\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "k.ply")
    one_line_error(e, "k.ply", "lists 999999999999999999999 vertices but holds 3 indices")


def _mesh_ply(order: str, polys: list[list[int]], junk: int = 0) -> bytes:
    """A binary PLY: a unit square's 4 vertices, faces with a flag byte and a second list after the
    indices, then ``junk`` entries of an unused list element."""
    fmt = "binary_little_endian" if order == "<" else "binary_big_endian"
    head = ["ply", f"format {fmt} 1.0", "element vertex 4", "property float x", "property float y", "property float z",
            f"element face {len(polys)}", "property list uchar int vertex_indices", "property uchar flags",
            "property list ushort float texcoord", f"element junk {junk}", "property list uchar int v", "end_header"]
    body = [struct.pack(order + "12f", 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0)]
    body += [struct.pack(f"{order}B{len(poly)}iBH2f", len(poly), *poly, 7, 2, 0.5, 0.25) for poly in polys]
    return ("\n".join(head) + "\n").encode() + b"".join(body) + b"\0" * junk


@pytest.mark.parametrize("order", ["<", ">"])
def test_ply_polygons_of_any_size_are_fanned(tmp_path: Path, order: str) -> None:
    polys = [[0, 1, 2], [0, 1, 2, 3], [3, 2, 1, 0, 1]]
    (tmp_path / "m.ply").write_bytes(_mesh_ply(order, polys, junk=5))
    fan = [(p[0], p[i], p[i + 1]) for p in polys for i in range(1, len(p) - 1)]  # oracle: fans around the first vertex
    np.testing.assert_array_equal(read_point_file(tmp_path / "m.ply")["faces"], fan)


def test_ply_list_elements_are_read_in_bounded_memory(tmp_path: Path) -> None:
    """Each list entry became a Python list and a numpy view: ~280x the file in memory (a 5 MB
    file peaked at 1.4 GB), read in a Python loop building objects."""
    polys = [[0, 1, 2, 3], [0, 1, 2]] * 30_000  # mixed sizes: not the all-triangle fast path
    path = tmp_path / "big.ply"
    path.write_bytes(_mesh_ply("<", polys, junk=500_000))
    size = path.stat().st_size
    with traced_peak() as peak:
        faces = read_point_file(path)["faces"]  # (90000, 3)
    assert faces.shape == (90_000, 3) and faces[:3].tolist() == [[0, 1, 2], [0, 2, 3], [0, 1, 2]]
    assert peak[0] < 8 * size, (peak, size)


@pytest.mark.parametrize("name, start", [("long.ply", b"ply\n"), ("long.pcd", b"# .PCD v0.7\n")])
def test_header_line_without_end_is_refused_unread(tmp_path: Path, name: str, start: bytes, one_line_error) -> None:
    """A header "line" with no newline was read whole (a 200 MB one peaked at 1.8 GB) before refusal."""
    (tmp_path / name).write_bytes(start + b"x" * 16 * 2**20)
    with traced_peak() as peak, pytest.raises(DataError) as e:
        read_point_file(tmp_path / name)
    assert len(one_line_error(e, name, "header line longer than 1.0 MiB; not a valid header")) < 400
    assert peak[0] < 4 * 2**20, peak


@pytest.mark.parametrize("extra", [b"comment ", b"obj_info "])
def test_a_long_header_comment_with_its_line_end_is_read(tmp_path: Path, extra: bytes) -> None:
    """A 100 kB comment or obj_info line (embedded metadata) ending in a newline was refused as
    'a header line longer than 64.0 KiB (no line end)'."""
    pts = np.arange(6, dtype="<f4").reshape(2, 3)  # (N, 3)
    head = b"ply\nformat binary_little_endian 1.0\n" + extra + b"7" * 100_000 + b"\nelement vertex 2\n"
    head += b"property float x\nproperty float y\nproperty float z\nend_header\n"
    (tmp_path / "meta.ply").write_bytes(head + pts.tobytes())
    np.testing.assert_array_equal(read_point_file(tmp_path / "meta.ply")["coord"], pts)
