"""Reading GeoTIFF (and ENVI) label maps and cubes: declared no-data labels, no stray warnings.

The oracle is rasterio itself (its masks, scales and offsets) or the array the test wrote.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from sciformer.data.hsi.readers import read_labels, read_scene

rasterio = pytest.importorskip("rasterio")


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
