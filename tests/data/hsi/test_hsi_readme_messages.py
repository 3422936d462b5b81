"""The hyperspectral messages the READMEs quote are the ones the code prints for that input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer.data.hsi.nodata import refuse_labelled_nodata
from sciformer.data.hsi.readers import read_scene
from sciformer.errors import DataError

ROOT = Path(__file__).resolve().parents[3]


def _readme(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())  # the README's line breaks are not the message's


def test_the_data_files_example_in_the_main_readme(tmp_path: Path) -> None:
    np.save(tmp_path / "cube.npy", np.ones((40, 40, 5), dtype=np.float32))
    np.save(tmp_path / "gt.npy", np.ones((30, 30), dtype=np.int64))
    with pytest.raises(DataError) as err:
        read_scene(tmp_path / "cube.npy", label_path=tmp_path / "gt.npy")
    message = str(err.value).replace(f"{tmp_path}/", "")
    assert message == "gt.npy [gt]: label map is 30 x 30; image cube.npy is 40 x 40"
    assert f"`{message}`" in _readme(ROOT / "README.md")


def test_the_data_readme_on_nan_pixels(tmp_path: Path) -> None:
    cube = np.ones((6, 6, 4), dtype=np.float32)  # (H, W, B)
    cube[3, 4, 1] = np.nan
    cube[5, 5] = np.inf
    gt = np.zeros((6, 6), dtype=np.int64)
    gt[3, 4] = gt[5, 5] = 1
    np.savez(tmp_path / "scene.npz", cube=cube, gt=gt)
    scene = read_scene(tmp_path / "scene.npz")  # reading refuses nothing: NaN/Inf pixels are no-data
    assert np.isnan(scene.cube[3, 4, 1]) and scene.gt[5, 5] == 1
    mask = ~np.isfinite(scene.cube).all(axis=-1)  # (H, W)
    with pytest.raises(DataError) as err:
        refuse_labelled_nodata(mask, scene.gt > 0, "scene.npz", None)
    text = _readme(ROOT / "datasets" / "hyperspectral" / "README.md")
    assert f"(`{err.value}`)" in text
    assert "NaN/Inf in the cube" not in text and "a `.npy` beside the others" not in text
