"""open3d and the pure readers give identical arrays on PLY / PCD files of real scans
(SemanticKITTI points, a LiDAR tile's RGB), in every encoding; files open3d cannot read
exactly go to the pure readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer.data.pointcloud import io as point_io
from sciformer.data.pointcloud.open3d_io import read_with_open3d
from sciformer.data.pointcloud.pcd import read_pcd
from sciformer.data.pointcloud.ply import read_ply, write_ply

o3d = pytest.importorskip("open3d", reason="open3d is optional and not installed (pip install open3d; needs libusb-1.0-0)")


@pytest.fixture(scope="module")
def scan(data_root: Path) -> dict[str, np.ndarray]:
    """A real scan's points with the colours of a real LiDAR tile and unit normals."""
    import laspy

    scans, tile = data_root / "semantickitti_scans" / "demo_000700_points.npy", data_root / "lidar" / "autzen_trim.laz"
    if not scans.is_file() or not tile.is_file():
        pytest.skip("real scans absent (set SCIFORMER_DATA)")
    coord = np.load(scans).astype(np.float64)[:20000]  # (n, 3)
    las = laspy.read(tile)
    rgb = (np.stack([las.red, las.green, las.blue], axis=1)[: len(coord)] >> 8).astype(np.uint8)  # (n, 3) 16 -> 8 bit
    normal = (coord / np.linalg.norm(coord, axis=1, keepdims=True)).astype(np.float32)  # (n, 3)
    return {"coord": coord, "colour": rgb, "normal": normal}


def assert_same(fast: dict | None, pure: dict) -> None:
    assert fast is not None, "open3d did not take the file"
    assert sorted(fast) == sorted(pure)
    for key in pure:
        assert fast[key].dtype == pure[key].dtype, key
        np.testing.assert_array_equal(fast[key], pure[key], err_msg=key)


def test_ply_binary_and_ascii(scan: dict[str, np.ndarray], tmp_path: Path) -> None:
    binary = write_ply(tmp_path / "scan.ply", scan["coord"], scan["colour"], normal=scan["normal"])
    assert_same(read_with_open3d(binary), read_ply(binary))
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(scan["coord"]))
    cloud.colors = o3d.utility.Vector3dVector(scan["colour"] / 255.0)
    ascii_path = tmp_path / "scan_ascii.ply"
    o3d.io.write_point_cloud(str(ascii_path), cloud, write_ascii=True)
    assert read_with_open3d(ascii_path) is None  # ASCII stays with the pure reader (it tells a short file)


@pytest.mark.parametrize(("ascii", "compressed"), [(False, False), (False, True)], ids=["binary", "binary_compressed"])
def test_pcd_every_encoding(scan: dict[str, np.ndarray], tmp_path: Path, ascii: bool, compressed: bool) -> None:
    coord = scan["coord"].copy()
    coord[5] = np.nan  # an organised cloud's hole
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(coord))
    cloud.colors = o3d.utility.Vector3dVector(scan["colour"] / 255.0)
    cloud.normals = o3d.utility.Vector3dVector(scan["normal"].astype(np.float64))
    path = tmp_path / "scan.pcd"
    assert o3d.io.write_point_cloud(str(path), cloud, write_ascii=ascii, compressed=compressed)
    assert_same(read_with_open3d(path), read_pcd(path))
    kept = read_with_open3d(path, keep_invalid=True)
    assert_same(kept, read_pcd(path, keep_invalid=True))
    assert len(kept["coord"]) == len(coord) and np.isnan(kept["coord"][5]).all()


def test_read_point_file_takes_open3d_and_falls_back(scan: dict[str, np.ndarray], tmp_path: Path, monkeypatch) -> None:
    plain = write_ply(tmp_path / "plain.ply", scan["coord"][:500], scan["colour"][:500])
    labelled = write_ply(tmp_path / "labelled.ply", scan["coord"][:500], label=np.arange(500) % 3)
    calls = []
    real = point_io.read_ply
    monkeypatch.setattr(point_io, "read_ply", lambda p: calls.append(Path(p).name) or real(p))
    fast = point_io.read_point_file(plain)
    assert calls == [] and fast["colour"].shape == (500, 3)
    slow = point_io.read_point_file(labelled)  # a field open3d would drop
    assert calls == ["labelled.ply"] and slow["label"].tolist()[:4] == [0, 1, 2, 0]
    monkeypatch.setenv("SCIFORMER_NO_OPEN3D", "1")
    assert read_with_open3d(plain) is None
    truncated = tmp_path / "cut.ply"
    truncated.write_bytes(plain.read_bytes()[:-100])
    monkeypatch.delenv("SCIFORMER_NO_OPEN3D")
    assert read_with_open3d(truncated) is None  # the pure reader reports it in one line
