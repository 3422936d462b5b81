"""read_point_file: text tables, numpy files, suffix dispatch."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from synthetic import eio_link, traced_peak

from sciformer.data.pointcloud.io import las_has_rgb, parse_text_table, read_point_file
from sciformer.errors import DataError


def test_text_tables(tmp_path: Path, cloud: dict[str, np.ndarray]) -> None:
    xyz, nrm = cloud["coord"], cloud["normal"]
    np.savetxt(tmp_path / "a.xyz", xyz, fmt="%.6f")
    np.testing.assert_allclose(read_point_file(tmp_path / "a.xyz")["coord"], xyz, atol=1e-6)
    # ModelNet normal_resampled style: comma separated, normals detected by unit norm
    np.savetxt(tmp_path / "b.txt", np.hstack([xyz, nrm]), fmt="%.6f", delimiter=",")
    data = read_point_file(tmp_path / "b.txt")
    np.testing.assert_allclose(data["normal"], nrm, atol=1e-6)
    # S3DIS style colour, 7th column a label
    table = np.hstack([xyz, cloud["colour"], cloud["label"][:, None]])
    np.savetxt(tmp_path / "c.txt", table, fmt="%.6f")
    data = read_point_file(tmp_path / "c.txt")
    np.testing.assert_allclose(data["colour"], cloud["colour"] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(data["label"], cloud["label"])
    # CloudCompare header row and a count line
    (tmp_path / "d.txt").write_text("//X,Y,Z,Intensity\n1,2,3,0.5\n4,5,6,0.25\n")
    data = read_point_file(tmp_path / "d.txt")
    np.testing.assert_array_equal(data["intensity"], [0.5, 0.25])
    (tmp_path / "e.pts").write_text("2\n1 2 3\n4 5 6\n")
    np.testing.assert_array_equal(read_point_file(tmp_path / "e.pts")["coord"], [[1, 2, 3], [4, 5, 6]])
    # explicit columns
    (tmp_path / "f.xyz").write_text("1 2 3 9 7\n4 5 6 8 1\n")
    data = read_point_file(tmp_path / "f.xyz", columns=["x", "y", "z", "_", "class"])
    np.testing.assert_array_equal(data["label"], [7, 1])


def test_leica_pts_and_a_csv_with_a_byte_order_mark(tmp_path: Path) -> None:
    """Leica PTS: a point-count line, then x y z intensity (-2048..2047) [r g b], an integer
    intensity column not a label; Excel writes a UTF-8 byte-order mark before the header."""
    (tmp_path / "scan.pts").write_text("2\n1.0 2.0 3.0 -1200 10 20 30\n4.0 5.0 6.0 850 40 50 60\n")
    data = read_point_file(tmp_path / "scan.pts")
    assert "label" not in data
    np.testing.assert_array_equal(data["coord"], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(data["intensity"], [-1200, 850])
    np.testing.assert_allclose(data["colour"], np.array([[10, 20, 30], [40, 50, 60]]) / 255.0, atol=1e-6)
    (tmp_path / "grey.pts").write_text("2\n1 2 3 7\n4 5 6 9\n")
    grey = read_point_file(tmp_path / "grey.pts")
    assert "label" not in grey and grey["intensity"].tolist() == [7, 9]
    (tmp_path / "excel.csv").write_text("x,y,z,label\n1,2,3,1\n4,5,6,2\n", encoding="utf-8-sig")
    np.testing.assert_array_equal(read_point_file(tmp_path / "excel.csv")["label"], [1, 2])
    (tmp_path / "bare.xyz").write_text("1 2 3\n4 5 6\n", encoding="utf-8-sig")  # a mark before a number
    np.testing.assert_array_equal(read_point_file(tmp_path / "bare.xyz")["coord"], [[1, 2, 3], [4, 5, 6]])


def test_a_nan_row_does_not_turn_normals_into_colours(tmp_path: Path, cloud: dict[str, np.ndarray]) -> None:
    """x y z nx ny nz label with one NaN normal: the columns are still normals (the NaN row is kept
    when predicting and becomes an invalid point there), not red green blue."""
    table = np.hstack([cloud["coord"], cloud["normal"], cloud["label"][:, None]])
    table[3, 5] = np.nan
    np.savetxt(tmp_path / "shape.txt", table, fmt="%.6f")
    data = read_point_file(tmp_path / "shape.txt", keep_invalid=True)
    assert "normal" in data and "colour" not in data
    np.testing.assert_allclose(np.delete(data["normal"], 3, axis=0), np.delete(cloud["normal"], 3, axis=0), atol=1e-6)


def test_text_malformed_and_empty(tmp_path: Path, one_line_error) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1 2 3 4 5 6\n1 2 3 4 5 6\n1 2 3 4\x105 6\n1 2 3 4 5 6\n")
    with pytest.raises(DataError) as e:
        read_point_file(path)
    one_line_error(e, "bad.txt:3", "expected 6 numbers")
    rows, skipped = parse_text_table(path, 6, malformed="skip")
    assert rows.shape == (3, 6) and skipped == [3]
    (tmp_path / "empty.xyz").write_text("# nothing here\n\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "empty.xyz")
    one_line_error(e, "empty.xyz", "empty point cloud")
    (tmp_path / "wide.txt").write_text("1 2 3 4 5 6 7 8 9\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "wide.txt")
    one_line_error(e, "wide.txt", "columns=")


def test_text_comment_line_is_not_a_header(tmp_path: Path) -> None:
    (tmp_path / "c.xyz").write_text("# exported points\n1 2 3\n4 5 6\n")
    np.testing.assert_array_equal(read_point_file(tmp_path / "c.xyz")["coord"], [[1, 2, 3], [4, 5, 6]])


def test_numpy_files(tmp_path: Path, cloud: dict[str, np.ndarray], one_line_error) -> None:
    np.save(tmp_path / "a.npy", np.hstack([cloud["coord"], cloud["normal"]]))
    np.testing.assert_allclose(read_point_file(tmp_path / "a.npy")["normal"], cloud["normal"], rtol=1e-6)
    np.savez(tmp_path / "b.npz", xyz=cloud["coord"], rgb=cloud["colour"], segment=cloud["label"], extra=np.arange(7))
    data = read_point_file(tmp_path / "b.npz")
    np.testing.assert_allclose(data["colour"], cloud["colour"] / 255.0)
    np.testing.assert_array_equal(data["label"], cloud["label"])
    np.testing.assert_array_equal(data["extra"], np.arange(7))
    np.savez(tmp_path / "c.npz", a=np.zeros((3, 3)), b=np.zeros(3))
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "c.npz")
    one_line_error(e, "c.npz", "coord")


def test_unknown_suffix_and_missing_file(tmp_path: Path, one_line_error) -> None:
    (tmp_path / "a.obj").write_text("v 1 2 3\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "a.obj")
    one_line_error(e, "a.obj", ".ply")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "none.ply")
    one_line_error(e, "none.ply", "no such file")


@pytest.mark.parametrize("name, arrays, needle", [
    ("c.npy", np.zeros((5, 3), np.complex64), "array has dtype complex64"),
    ("d.npy", np.zeros((5, 3), "M8[s]"), "array has dtype datetime64[s]"),
    ("s.npz", {"coord": np.zeros((5, 3)).astype(str)}, "array 'coord' has dtype <U32"),
    ("r.npz", {"coord": np.zeros((5, 3)), "rgb": np.full((5, 3), "a")}, "array 'rgb' has dtype <U1"),
    ("i.npz", {"coord": np.zeros((5, 3)), "intensity": np.full(5, "a")}, "array 'intensity' has dtype <U1"),
])
def test_numpy_arrays_of_non_numbers_are_refused(tmp_path: Path, name, arrays, needle) -> None:
    """Complex values lost their imaginary part, dates and number strings were cast, and text
    colour or intensity ended in a traceback."""
    path = tmp_path / name
    if isinstance(arrays, dict):
        np.savez(path, **arrays)
    else:
        np.save(path, arrays)
    with pytest.raises(DataError) as e:
        read_point_file(path)
    msg = str(e.value)
    assert "\n" not in msg and name in msg and needle in msg and "expected real numbers" in msg


@pytest.mark.parametrize("name", ["scan.ply", "scan.pcd", "scan.las", "scan.txt", "scan.xyz", "scan.off", "scan.npy"])
def test_a_read_that_fails_in_the_os_is_a_data_error_naming_the_file(tmp_path: Path, name: str, one_line_error) -> None:
    """A read failing with EIO in the PLY, PCD, LAS and text readers escaped as a bare OSError
    (the command line printed "error: Input/output error", naming no file)."""
    path = eio_link(tmp_path, name)
    with pytest.raises(DataError) as e:
        read_point_file(path)
    one_line_error(e, name, os.strerror(errno.EIO))
    if name.endswith(".las"):  # the header alone, as LAS tiles are probed for colour
        with pytest.raises(DataError) as e:
            las_has_rgb(path)
        one_line_error(e, name, os.strerror(errno.EIO))


def test_npy_without_the_numpy_magic_is_not_called_pickled(tmp_path: Path, one_line_error) -> None:
    """A text file renamed .npy is 'not a .npy file', not 'pickled (object) data' with advice
    to load it with allow_pickle; an object array says it holds Python objects."""
    (tmp_path / "text.npy").write_text("1 2 3\n4 5 6\n7 8 9\n")
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "text.npy")
    one_line_error(e, "text.npy", "not a .npy file (no NumPy header)")
    assert "pickle" not in str(e.value)
    np.save(tmp_path / "obj.npy", np.array([[0.0, 1.0, None]], dtype=object), allow_pickle=True)
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "obj.npy")
    one_line_error(e, "obj.npy", "Python objects")
    assert "allow_pickle" not in str(e.value)


def _npz_with(path: Path, members: dict[str, bytes]) -> None:
    """An .npz whose members are named and filled verbatim (deflated), as np.savez never names them."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_npz_member_not_named_npy_is_checked_or_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          one_line_error) -> None:
    """Members without the .npy suffix skipped the budget check and were all inflated: an .npy-format
    ``coord`` was read whatever its declared size, and a ``readme`` ended in AttributeError."""
    coord = np.arange(30, dtype=np.float64).reshape(10, 3)  # (10, 3)
    _npz_with(tmp_path / "a.npz", {"coord.npy": _npy_bytes(coord), "readme": b"hello"})
    np.testing.assert_array_equal(read_point_file(tmp_path / "a.npz")["coord"], coord)  # the readme is no array
    monkeypatch.setenv("SCIFORMER_MAX_ARRAY_BYTES", "1M")
    big = _npy_bytes(np.zeros((2**20 // 3, 3)))  # 8 MiB declared, over the 1 MiB budget
    _npz_with(tmp_path / "b.npz", {"coord": big})
    with pytest.raises(DataError) as e:
        read_point_file(tmp_path / "b.npz")
    one_line_error(e, "b.npz [coord]", "above the 1.0 MiB limit")
    _npz_with(tmp_path / "c.npz", {"coord.npy": _npy_bytes(coord), "readme": bytes(8 * 2**20)})
    with traced_peak() as peak:
        np.testing.assert_array_equal(read_point_file(tmp_path / "c.npz")["coord"], coord)
    assert peak[0] < 2**20, peak  # the 8 MiB non-array member is never inflated


def test_a_text_table_is_parsed_without_holding_its_text(tmp_path: Path) -> None:
    """The table's float64 rows are what a well-formed text file costs: the whole text, its lines
    and the table were held at once (about 5x the file; 945 MB peak RSS for a 142 MB .xyz)."""
    rows = np.random.default_rng(1).uniform(0, 100, size=(100_000, 4))  # (n, 4)
    path = tmp_path / "mid.xyz"
    np.savetxt(path, rows, fmt="%.5f", header="x y z intensity")  # a '#' comment line first
    with traced_peak() as peak:
        table, skipped = parse_text_table(path)
    np.testing.assert_allclose(table, np.round(rows, 5), rtol=0, atol=1e-9)  # oracle: the written values
    assert skipped == [] and peak[0] < 1.6 * rows.nbytes, (peak[0], rows.nbytes)  # was 5.4x
    (tmp_path / "ff.txt").write_text("# a\x0cb\n1 2 3\n4 5 6\n")  # a form feed inside a comment is no line break
    np.testing.assert_array_equal(parse_text_table(tmp_path / "ff.txt")[0], [[1, 2, 3], [4, 5, 6]])


def test_npz_points_beside_an_object_member_are_read(tmp_path: Path) -> None:
    """A 'meta' dict saved beside coord and label refused the whole point file (Python objects);
    it is left out and never loaded."""
    pts = np.arange(30, dtype=np.float32).reshape(10, 3)
    np.savez_compressed(tmp_path / "p.npz", coord=pts, label=np.arange(10), meta=np.array({"a": 1}, dtype=object))
    out = read_point_file(tmp_path / "p.npz")
    assert sorted(out) == ["coord", "label"]
    np.testing.assert_array_equal(out["coord"], pts)


def test_both_table_paths_end_lines_at_the_same_characters(tmp_path: Path) -> None:
    """A form feed inside a comment is no line break on the fast path; the slow path (a malformed
    line) split there too, so it reported comment text at the wrong line and skipped the wrong one."""
    (tmp_path / "p.txt").write_bytes(b"# page\x0c1 2\r\n1 2 3\r4 5\n6 7 8\n")
    table, skipped = parse_text_table(tmp_path / "p.txt", malformed="skip")
    assert skipped == [3] and table.tolist() == [[1, 2, 3], [6, 7, 8]]  # oracle: lines as \n, \r\n and \r end them
    with pytest.raises(DataError, match=r"p\.txt:3: expected 3 numbers, got '4 5'"):
        parse_text_table(tmp_path / "p.txt")
