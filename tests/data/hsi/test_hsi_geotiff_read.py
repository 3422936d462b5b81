"""Reading GeoTIFF (and ENVI) label maps and cubes: declared no-data labels, no stray warnings.

The oracle is rasterio itself (its masks, scales and offsets) or the array the test wrote.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from synthetic import traced_peak

from sciformer.data.hsi.readers import read_labels, read_scene
from sciformer.errors import DataError

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402


def _labels(h: int = 12, w: int = 10) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 4, size=(h, w)).astype(np.uint8)  # (H, W) 0..3


def _write_tif(path: Path, bands: np.ndarray, **profile: object) -> Path:
    """(H, W, B) or (H, W) -> a GeoTIFF."""
    arr = bands if bands.ndim == 3 else bands[:, :, None]
    with rasterio.open(path, "w", driver="GTiff", height=arr.shape[0], width=arr.shape[1], count=arr.shape[2],
                       dtype=arr.dtype, **profile) as dst:
        dst.write(np.moveaxis(arr, -1, 0))
    return path


def test_label_geotiff_nodata_pixels_are_unlabelled(tmp_path: Path) -> None:
    gt = _labels()
    gt[:, 7:] = 255  # outside the surveyed area
    path = _write_tif(tmp_path / "gt.tif", gt, nodata=255, transform=from_origin(0, 12, 1, 1))
    with rasterio.open(path) as src:
        valid = src.read_masks(1) > 0  # rasterio's own no-data mask: the oracle
    cube = np.random.default_rng(1).normal(size=(12, 10, 5)).astype(np.float32)
    np.save(tmp_path / "cube.npy", cube)
    scene = read_scene(tmp_path / "cube.npy", label_path=path, labels="required")
    assert 255 not in scene.gt
    np.testing.assert_array_equal(scene.gt, np.where(valid, gt, 0))
    np.testing.assert_array_equal(read_labels(path), np.where(valid, gt, 0))  # predict --labels reads it alike


def test_envi_label_data_ignore_value_is_unlabelled(tmp_path: Path) -> None:
    gt = _labels().astype(np.int16)
    gt[0, :] = -1  # declared no-data (negative: would be refused as a label)
    (tmp_path / "gt.img").write_bytes(gt.astype("<i2").tobytes())
    (tmp_path / "gt.hdr").write_text(f"ENVI\nsamples = {gt.shape[1]}\nlines = {gt.shape[0]}\nbands = 1\nheader offset = 0\n"
                                     "file type = ENVI Standard\ndata type = 2\ninterleave = bsq\nbyte order = 0\n"
                                     "data ignore value = -1\n")
    np.testing.assert_array_equal(read_labels(tmp_path / "gt.hdr"), np.where(gt == -1, 0, gt))


def test_geotiff_without_georeference_reads_without_a_warning(tmp_path: Path) -> None:
    cube = np.arange(4 * 5 * 3, dtype=np.uint16).reshape(4, 5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _write_tif(tmp_path / "cube.tif", cube)
        _write_tif(tmp_path / "gt.tif", (np.arange(20).reshape(4, 5) % 3).astype(np.uint8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scene = read_scene(tmp_path / "cube.tif", label_path=tmp_path / "gt.tif", labels="required")
        read_labels(tmp_path / "gt.tif")
    np.testing.assert_array_equal(scene.cube, cube)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("dtype", ["int16", "uint16", "float64"])
def test_scaled_geotiff_is_read_in_physical_units(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(2)
    raw = rng.integers(1, 10000, size=(6, 7, 4)).astype(dtype)  # (H, W, B) digital numbers
    raw[0, 0] = 0  # no-data in every band
    raw[1, 1, 0] = 0  # no-data value in one band only: a value
    path = _write_tif(tmp_path / "scaled.tif", raw, nodata=0, transform=from_origin(0, 6, 1, 1))
    with rasterio.open(path, "r+") as dst:
        dst.scales, dst.offsets = [1e-4, 2e-4, 1e-4, 1.0], [0.0, 0.0, -0.1, 5.0]
    with rasterio.open(path) as src:  # the oracle: GDAL's own scales and offsets
        scales, offsets = np.asarray(src.scales), np.asarray(src.offsets)
        expected = np.moveaxis(src.read(), 0, -1) * scales + offsets  # (H, W, B) float64
    cube = read_scene(path, labels="none").cube
    assert cube.dtype == (np.float64 if dtype == "float64" else np.float32)
    assert np.isnan(cube[0, 0]).all()  # no-data stays no-data
    expected[0, 0] = np.nan
    np.testing.assert_allclose(cube, expected, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize(("scale", "offset"), [(2.0, 0.0), (1.0, 1.0), (1e-4, 0.0)])
def test_a_label_geotiff_is_read_as_stored_whatever_scale_it_declares(tmp_path: Path, scale: float, offset: float) -> None:
    """One band is a label map: class ids, not a measurement (metadata copied from a reflectance product)."""
    gt = _labels()
    path = _write_tif(tmp_path / "gt.tif", gt, transform=from_origin(0, 12, 1, 1))
    with rasterio.open(path, "r+") as dst:
        dst.scales, dst.offsets = [scale], [offset]
    np.testing.assert_array_equal(read_labels(path), gt)
    np.save(tmp_path / "cube.npy", np.ones((12, 10, 3), np.float32))
    np.testing.assert_array_equal(read_scene(tmp_path / "cube.npy", label_path=path, labels="required").gt, gt)


def test_a_scaled_complex_cube_is_refused_as_an_unscaled_one(tmp_path: Path) -> None:
    raw = (np.arange(24).reshape(2, 3, 4) + 1j).astype(np.complex64)
    path = _write_tif(tmp_path / "complex.tif", raw, transform=from_origin(0, 2, 1, 1))
    with rasterio.open(path, "r+") as dst:
        dst.scales = [0.5] * 4
    from sciformer.errors import DataError

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's ComplexWarning (the imaginary part dropped) would be one
        with pytest.raises(DataError, match="complex64"):
            read_scene(path, labels="none")


def test_unscaled_geotiff_keeps_its_dtype(tmp_path: Path) -> None:
    raw = np.arange(2 * 3 * 2, dtype=np.int16).reshape(2, 3, 2)
    path = _write_tif(tmp_path / "plain.tif", raw, transform=from_origin(0, 2, 1, 1))
    cube = read_scene(path, labels="none").cube
    assert cube.dtype == np.int16
    np.testing.assert_array_equal(cube, raw)


@pytest.mark.parametrize(("origin", "crs", "refused"), [
    ((500000.0, 4000000.0), "EPSG:32633", False),  # the same grid
    ((500300.0, 4000000.0), "EPSG:32633", True),  # 10 pixels east
    ((500000.0, 4000000.0), "EPSG:32634", True),  # another UTM zone
    (None, None, False),  # a label map without georeference: paired by pixel
])
def test_label_map_on_another_grid_is_refused(tmp_path: Path, origin: tuple[float, float] | None, crs: str | None,
                                               refused: bool) -> None:
    from sciformer.data.hsi.predict import read_label_map
    from sciformer.errors import DataError

    gt = _labels(4, 5)
    cube_path = _write_tif(tmp_path / "cube.tif", np.ones((4, 5, 3), np.uint16), crs="EPSG:32633",
                           transform=from_origin(500000.0, 4000000.0, 30, 30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        placed = {} if origin is None else {"crs": crs, "transform": from_origin(*origin, 30, 30)}
        gt_path = _write_tif(tmp_path / "gt.tif", gt, **placed)
    if not refused:
        np.testing.assert_array_equal(read_scene(cube_path, label_path=gt_path, labels="required").gt, gt)
        np.testing.assert_array_equal(read_label_map(gt_path, (4, 5), 3, cube_path), gt)
        return
    with pytest.raises(DataError) as err:
        read_scene(cube_path, label_path=gt_path, labels="required")
    assert str(gt_path) in str(err.value) and str(cube_path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="--labels map"):
        read_label_map(gt_path, (4, 5), 3, cube_path)
    from sciformer.contracts import BuildContext
    from sciformer.data.hsi.config import HSISceneConfig
    from sciformer.data.hsi.scene_setup import make_split

    cfg = HSISceneConfig(source=str(cube_path), split={"kind": "fixed", "train_path": str(gt_path), "test_path": str(gt_path)})
    with pytest.raises(DataError, match="split map's"):  # a fixed split's maps: the same check
        make_split(cfg, read_scene(cube_path, labels="none"), BuildContext(base_dir=tmp_path, seed=0))


def test_sparse_geotiff_declaring_a_huge_cube_is_refused_before_reading(tmp_path: Path) -> None:
    """A 2 KB sparse tiled GeoTIFF (no tile written) declaring a 923 MiB cube was read in full (3.4 GB peak)."""
    path = tmp_path / "sparse.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(path, "w", driver="GTiff", height=1100, width=1100, count=200, dtype="float32",
                           transform=from_origin(0, 0, 1, 1), SPARSE_OK=True, tiled=True):
            pass
    assert path.stat().st_size < 64 * 2**10
    with traced_peak() as peak, pytest.raises(DataError) as e:
        read_scene(path)
    msg = str(e.value)
    assert "\n" not in msg and "sparse.tif" in msg and "923.2 MiB" in msg and "decompression bomb" in msg
    assert peak[0] < 64 * 2**20, peak
