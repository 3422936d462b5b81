"""OFF meshes (with the ModelNet header quirk) and area-weighted surface sampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer.data.pointcloud.fields import triangulate
from sciformer.data.pointcloud.io import read_point_file
from sciformer.data.pointcloud.mesh import read_off, sample_mesh_surface
from sciformer.errors import DataError

BATHTUB_COUNTS = {"bathtub_0001.off": (3514, 3546), "bathtub_0002.off": (700, 664), "bathtub_0003.off": (14963, 19985),
                  "bathtub_0004.off": (2842, 3519), "bathtub_0005.off": (18472, 30734)}


@pytest.mark.parametrize("quirk", [False, True])
def test_off_reader(tmp_path: Path, fakes, quirk: bool) -> None:
    text = "# a comment\n" + fakes.off_text(fakes.cube_vertices, fakes.cube_quads, quirk=quirk)
    (tmp_path / "cube.off").write_text(text)
    vertices, faces = read_off(tmp_path / "cube.off")
    np.testing.assert_array_equal(vertices, fakes.cube_vertices)
    assert faces.shape == (12, 3)  # 6 quads -> 12 triangles
    data = read_point_file(tmp_path / "cube.off")
    assert data["coord"].shape == (8, 3) and data["faces"].shape == (12, 3)


def test_off_bad_files(tmp_path: Path, one_line_error) -> None:
    (tmp_path / "a.off").write_text("OFF\n3 1 0\n0 0 0\n1 0 0\n")
    with pytest.raises(DataError) as e:
        read_off(tmp_path / "a.off")
    one_line_error(e, "a.off", "truncated")
    (tmp_path / "b.off").write_text("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 7\n")
    with pytest.raises(DataError) as e:
        read_off(tmp_path / "b.off")
    one_line_error(e, "b.off", "out of range")
    (tmp_path / "c.off").write_text("PLY\n")
    with pytest.raises(DataError) as e:
        read_off(tmp_path / "c.off")
    one_line_error(e, "c.off", "not an OFF")


@pytest.mark.parametrize(("face", "needle"), [
    ("99999999999999999999999 0 1 2", "lists 99999999999999999999999 vertices but holds 3 indices"),
    ("99999999999 0 1 2", "lists 99999999999 vertices but holds 3 indices"),
    ("4 0 1 2", "lists 4 vertices but holds 3 indices"),
    ("3 0 1 99999999999999999999999", "beyond int64"),
])
def test_off_face_count_disagreeing_with_indices(tmp_path: Path, one_line_error, face: str, needle: str) -> None:
    """A face whose vertex count is not its indices' (or beyond int64) is refused in one line
    (a count beyond int64 ended in an OverflowError traceback; 99999999999 read as a triangle)."""
    (tmp_path / "k.off").write_text(f"OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n{face}\n")
    with pytest.raises(DataError) as e:
        read_off(tmp_path / "k.off")
    one_line_error(e, "k.off", needle)
    (tmp_path / "ok.off").write_text("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 2 255 0 0\n")  # colour after: kept
    assert read_off(tmp_path / "ok.off")[1].tolist() == [[0, 1, 2]]


def test_real_modelnet_off_meshes(fakes) -> None:
    folder = fakes.real_path("modelnet10_off", "bathtub")
    for name, (nv, nf) in BATHTUB_COUNTS.items():
        vertices, faces = read_off(folder / name)
        assert vertices.shape == (nv, 3), name
        assert len(faces) >= nf  # polygons are fan-triangulated
        pts, nrm = sample_mesh_surface(vertices, faces, 256, seed=0, return_normals=True)
        assert pts.shape == (256, 3) and np.all(np.isfinite(pts))
        np.testing.assert_allclose(np.linalg.norm(nrm, axis=1), 1.0, rtol=1e-4)
        lo, hi = vertices.min(axis=0), vertices.max(axis=0)
        assert np.all(pts >= lo - 1e-3) and np.all(pts <= hi + 1e-3)


def test_sample_mesh_surface_area_weighted(fakes, one_line_error) -> None:
    # A box stretched 3x along x: faces normal to y and z have 3x the area of faces normal to x.
    vertices = fakes.cube_vertices * np.array([3.0, 1.0, 1.0])
    faces = triangulate("cube", fakes.cube_quads)
    pts, nrm = sample_mesh_surface(vertices, faces, 20000, seed=1, return_normals=True)
    # every point on the surface: some coordinate at its min or max
    on_face = np.isclose(pts, vertices.min(0)) | np.isclose(pts, vertices.max(0))
    assert on_face.any(axis=1).all()
    axis = np.argmax(np.abs(nrm), axis=1)
    share = np.bincount(axis, minlength=3) / len(axis)
    np.testing.assert_allclose(share, [1 / 7, 3 / 7, 3 / 7], atol=0.02)  # areas 2:6:6
    again = sample_mesh_surface(vertices, faces, 20000, seed=1)
    np.testing.assert_array_equal(again, pts)
    with pytest.raises(DataError) as e:
        sample_mesh_surface(np.zeros((3, 3)), np.array([[0, 1, 2]]), 10)
    one_line_error(e, "zero surface area")


@pytest.mark.parametrize("big", [1e308, 3e38])
def test_sample_mesh_surface_refuses_coordinates_that_overflow(tmp_path: Path, one_line_error, big: float) -> None:
    """Finite vertices too large for the area and the samples are one line naming the file and
    the cause, with no numpy warning (1e308 once printed ~10 RuntimeWarnings, then said the
    mesh had zero surface area: its area had overflowed)."""
    import warnings

    (tmp_path / "huge.off").write_text(f"OFF\n4 4 0\n{big!r} 0 0\n{-big!r} 0 0\n0 {big!r} 0\n0 0 1\n"
                                       "3 0 1 2\n3 0 1 3\n3 0 2 3\n3 1 2 3\n")
    vertices, faces = read_off(tmp_path / "huge.off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError) as e:
            sample_mesh_surface(vertices, faces, 100, seed=0, source=tmp_path / "huge.off")
    one_line_error(e, "huge.off", f"reach {big:.3g}", "overflow")
    ok = sample_mesh_surface(vertices / big, faces, 100, seed=0, source=tmp_path / "huge.off")  # same shape, scaled
    assert np.isfinite(ok).all()


def test_off_faces_with_float_colours_are_read(tmp_path: Path, one_line_error) -> None:
    """The OFF format lets a face carry a colour after its indices, as integers or as floats in
    [0, 1] (RGBA): the faces are read and the colours left (float colours were 'malformed')."""
    body = "OFF\n4 2 0\n0 0 0\n1 0 0\n0 1 0\n1 1 0\n3 0 1 2 0.5 0.25 1.0 1.0\n4 1 3 2 0 0.75 0.1 1\n"
    (tmp_path / "c.off").write_text(body)
    faces = read_off(tmp_path / "c.off")[1].tolist()
    assert faces == triangulate("c.off", [[0, 1, 2], [1, 3, 2, 0]]).tolist()  # oracle: the fans of the two polygons
    (tmp_path / "d.off").write_text(body.replace("3 0 1 2", "3 0 1.5 2"))  # a fractional index is no index
    with pytest.raises(DataError) as e:
        read_off(tmp_path / "d.off")
    one_line_error(e, "d.off", "malformed OFF face line")
