"""LiDAR tiles from the command line on the real LAS/LAZ files: a LAZ written by ``predict``
reads back with laspy with the input's points, CRS, scales, offsets and dimensions; and
``evaluate`` on a new tile takes the trained features from the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sciformer.cli import main

laspy = pytest.importorskip("laspy")
CODES = {0: 2, 1: 3, 2: 6, 3: 1}  # ground [2], vegetation [3, 4, 5], building [6], other [] -> unclassified


@pytest.fixture(scope="module")
def run(tiny_lidar_run: Path) -> Path:
    return tiny_lidar_run  # trained once for the suite (tests/conftest.py)


def _vlrs(header) -> list[tuple[str, int, bytes]]:
    return [(v.user_id, v.record_id, bytes(v.record_data_bytes())) for v in header.vlrs]


@pytest.mark.parametrize("suffix", [".laz", ".las"])
def test_laz_output_keeps_the_tile(run: Path, data_root: Path, tmp_path: Path, suffix: str) -> None:
    source = data_root / "lidar" / "file_with_both_wkt_and_geotiff_vlrs.las"  # WKT and GeoTIFF CRS records
    out = tmp_path / f"tile{suffix}"
    assert main(["predict", "--checkpoint", str(run), "-i", str(source), "-o", str(out), "--probabilities"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    a, b = laspy.read(source), laspy.read(out)
    assert len(b.points) == len(a.points) == 25408
    assert b.header.point_format.id == a.header.point_format.id
    np.testing.assert_array_equal(b.header.scales, a.header.scales)
    np.testing.assert_array_equal(b.header.offsets, a.header.offsets)
    assert b.header.are_points_compressed == (suffix == ".laz")
    crs_records = [v for v in _vlrs(a.header) if v[0] == "LASF_Projection"]
    assert len(crs_records) == 4 and all(v in _vlrs(b.header) for v in crs_records)  # GeoKeys, doubles, ascii, WKT
    assert b.header.global_encoding.wkt == a.header.global_encoding.wkt
    for dim in a.point_format.dimension_names:
        if dim != "classification":
            np.testing.assert_array_equal(np.asarray(b[dim]), np.asarray(a[dim]), err_msg=dim)
    np.testing.assert_array_equal(b.original_classification, a.classification)
    probs = np.stack([np.asarray(b[f"prob_{k}"]) for k in range(4)], axis=1)  # (n, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    np.testing.assert_allclose(b.confidence, probs.max(axis=1), atol=1e-6)
    expected = np.vectorize(CODES.get)(probs.argmax(axis=1))  # class -> ASPRS code through the run's table
    np.testing.assert_array_equal(np.asarray(b.classification), expected)


def test_evaluate_new_tile_by_absolute_path_with_trained_features(run: Path, data_root: Path, tmp_path: Path) -> None:
    """Trained with intensity only (one tile lacks RGB); a test set of RGB tiles would otherwise
    pick colour + intensity and fail with batch['feat']: expected shape (n, 1), got (n, 4)."""
    import shutil

    tile = tmp_path / "elsewhere" / "autzen_trim.laz"  # RGB, outside data.root: today a raw ValueError traceback
    tile.parent.mkdir()
    shutil.copy(data_root / "lidar" / "autzen_trim.laz", tile)
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev"), f"data.test_files=[{tile}]"]) == 0
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["protocol"]["files"]["test"] == [str(tile)] and metrics["protocol"]["features"] == ["intensity"]


def test_new_tile_lacking_a_trained_feature(run: Path, data_root: Path, tmp_path: Path, capsys) -> None:
    cloud = tmp_path / "xyz.ply"
    from sciformer.data.pointcloud.io import read_point_file, write_ply

    write_ply(cloud, read_point_file(data_root / "lidar" / "las_warsaw_small.las")["coord"])
    assert main(["predict", "--checkpoint", str(run), "-i", str(cloud), "-o", str(tmp_path / "p.ply")]) == 2
    err = capsys.readouterr().err
    assert "trained with feature 'intensity'" in err and err.count("\n") == 1


def test_several_inputs_are_one_set_nothing_written_when_one_fails(run: Path, data_root: Path, tmp_path: Path, capsys) -> None:
    """a.las, a truncated b.las, c.las into a folder: one line, exit 2, and no prediction file
    written or replaced (with --overwrite too), no stage left; without b, both are written and
    equal to predicting each alone."""
    source = data_root / "lidar" / "las_warsaw_small.las"
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.las", "c.las"):
        (inputs / name).write_bytes(source.read_bytes())
    (inputs / "b.las").write_bytes(source.read_bytes()[:50000])
    out = tmp_path / "out"
    assert main(["predict", "--checkpoint", str(run), "-i", str(inputs / "a.las"), "-i", str(inputs / "b.las"), "-i", str(inputs / "c.las"),
                 "-o", f"{out}/", "--format", "npz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b.las" in err[0] and not out.exists()
    out.mkdir()
    for name in ("a.npz", "c.npz"):
        (out / name).write_bytes(b"an earlier prediction")
    assert main(["predict", "--checkpoint", str(run), "-i", str(inputs), "-o", str(out), "--format", "npz", "--overwrite"]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["a.npz", "c.npz"]  # no stage left, nothing replaced
    assert all((out / n).read_bytes() == b"an earlier prediction" for n in ("a.npz", "c.npz"))
    (inputs / "b.las").unlink()
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run), "-i", str(inputs), "-o", str(out), "--format", "npz", "--overwrite"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {out / 'a.npz'}", f"wrote {out / 'c.npz'}"]
    assert main(["predict", "--checkpoint", str(run), "-i", str(inputs / "c.las"), "-o", str(tmp_path / "alone.npz")]) == 0
    np.testing.assert_array_equal(np.load(out / "c.npz")["pred"], np.load(tmp_path / "alone.npz")["pred"])
    assert sorted(p.name for p in out.iterdir()) == ["a.npz", "c.npz"]
