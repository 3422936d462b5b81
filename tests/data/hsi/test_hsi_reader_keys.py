"""Automatic keys of .mat / .npz scenes: band centres only from arrays of a known wavelength
name (never a wavenumber, a width or an index), label maps by name (never a valid-pixel mask),
a valid-pixel mask by name and 0/1 values, and training refused when the labels hold fewer than two classes."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io

from sciformer.contracts import BuildContext
from sciformer.data.hsi.readers import read_scene, read_valid_mask
from sciformer.data.hsi.task import HSISceneConfig, build_hsi_scene
from sciformer.errors import DataError

WL = np.array([400.0, 500.0, 600.0, 700.0, 800.0])


def _scene(tmp_path, **extra) -> str:
    rng = np.random.default_rng(0)
    arrays = {"img": rng.random((6, 7, 5)).astype(np.float32), **extra}
    path = tmp_path / "s.mat"
    scipy.io.savemat(path, arrays)
    return str(path)


@pytest.mark.parametrize("name", ["wavenumbers", "waveband_index", "wavelength_fwhm", "band_width", "wave_number"])
def test_an_array_that_is_not_band_centres_is_not_taken(tmp_path, name: str) -> None:
    s = read_scene(_scene(tmp_path, **{name: np.arange(1.0, 6.0)}))
    assert s.wavelengths is None


def test_the_wavelength_array_beats_its_fwhm(tmp_path) -> None:
    s = read_scene(_scene(tmp_path, wavelength_fwhm=np.full(5, 10.0), Wavelength=WL))
    np.testing.assert_array_equal(s.wavelengths, WL)


def test_two_wavelength_arrays_ask_for_the_key(tmp_path) -> None:
    path = _scene(tmp_path, wavelength_um=WL / 1000, wavelength_nm=WL)
    with pytest.raises(DataError, match="wavelength_um, wavelength_nm.*data.wavelength_key"):
        read_scene(path)
    np.testing.assert_array_equal(read_scene(path, wavelength_key="wavelength_nm").wavelengths, WL)


def _maps() -> tuple[np.ndarray, np.ndarray]:
    gt = np.zeros((6, 7), np.uint8)
    gt[:3, :3], gt[3:, 3:] = 1, 2
    return gt, np.ones((6, 7), np.uint8)


@pytest.mark.parametrize("gt_name", ["gt", "Indian_pines_gt", "labels", "ground_truth", "class_map"])
def test_the_label_map_is_found_by_name_beside_a_mask(tmp_path, gt_name: str) -> None:
    gt, mask = _maps()
    s = read_scene(_scene(tmp_path, **{gt_name: gt.astype(np.float64), "valid_mask": mask}))
    np.testing.assert_array_equal(s.gt, gt)


def test_a_mask_is_never_the_label_map(tmp_path) -> None:
    _, mask = _maps()
    assert read_scene(_scene(tmp_path, mask_sub=mask)).gt is None
    with pytest.raises(DataError, match="data.label_key"):
        read_scene(_scene(tmp_path, mask_sub=mask), labels="required")


def test_several_unnamed_candidates_are_listed(tmp_path) -> None:
    gt, _ = _maps()
    with pytest.raises(DataError, match=r"several candidate label maps \(a, b\).*data.label_key"):
        read_scene(_scene(tmp_path, a=gt, b=gt))


def test_training_on_one_class_is_refused(tmp_path) -> None:
    rng = np.random.default_rng(3)
    scipy.io.savemat(tmp_path / "one.mat", {"img": rng.random((20, 20, 5)).astype(np.float32),
                                           "gt": np.ones((20, 20), np.uint8)})
    cfg = HSISceneConfig(source="one.mat", split={"kind": "stratified", "train_per_class": 10})
    with pytest.raises(DataError, match="1 class.*at least 2"):
        build_hsi_scene(cfg, BuildContext(base_dir=tmp_path, seed=0))


def test_a_valid_pixel_mask_is_found_by_name_and_values(tmp_path) -> None:
    keep = np.ones((6, 7), np.uint8)
    keep[0, :3] = 0
    mask, note = read_valid_mask(_scene(tmp_path, mask_sub=keep, cloud_mask=1 - keep, roi=np.arange(42).reshape(6, 7) % 3), (6, 7))
    np.testing.assert_array_equal(mask, keep.astype(bool))  # cloud_mask (pixels to drop) and a 0..2 roi: not valid-pixel masks
    assert "'mask_sub' marks 3 of 42 pixels" in note


@pytest.mark.parametrize(("extra", "words"), [({"roi": np.ones((6, 7)), "valid": np.eye(6, 7)}, "several valid-pixel masks (roi, valid)"),
                                              ({"valid_mask": np.zeros((6, 7), np.uint8)}, "marks no pixel as valid"),
                                              ({"valid": np.ones((6, 7), bool)}, None), ({"valid": np.ones((5, 7), bool)}, None)])
def test_no_mask_is_applied_where_it_is_not_one_that_leaves_pixels(tmp_path, extra: dict, words: str | None) -> None:
    mask, note = read_valid_mask(_scene(tmp_path, **extra), (6, 7))
    assert mask is None and (note is None if words is None else words in note)


@pytest.mark.parametrize("name", ["mask", "train_mask", "test_mask", "water_mask", "gt_mask", "label_mask", "class_mask"])
def test_a_0_1_array_merely_named_mask_is_not_a_valid_pixel_mask(tmp_path, name: str) -> None:
    """Training pixels, a class's pixels, or numpy's masked-array mask (True = invalid) are no
    pixels to keep: predict blanked 1,497 of 1,600 pixels of a crop beside a train_mask."""
    keep = np.ones((6, 7), np.uint8)
    keep[0, :3] = 0
    assert read_valid_mask(_scene(tmp_path, **{name: keep}), (6, 7)) == (None, None)
