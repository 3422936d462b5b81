"""Normaliser: statistics from training pixels only, PCA against an SVD oracle, state round trip."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from sciformer.data.hsi.normalize import Normalizer
from sciformer.errors import DataError


@pytest.fixture
def cube_and_mask(scene):
    cube, gt, _ = scene
    mask = np.zeros(gt.shape, dtype=bool)
    mask[:, : gt.shape[1] // 2] = gt[:, : gt.shape[1] // 2] > 0  # "training" = labelled left half
    return cube, mask


def test_standard_matches_numpy(cube_and_mask):
    cube, mask = cube_and_mask
    norm = Normalizer("standard").fit(cube, mask)
    px = cube[mask].astype(np.float64)
    np.testing.assert_allclose(norm.shift, px.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm.scale, px.std(0), rtol=1e-10)
    out = norm.transform(cube)  # (H, W, B)
    assert out.dtype == np.float32 and out.shape == cube.shape
    np.testing.assert_allclose(out[mask].mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out[mask].std(0), 1.0, atol=1e-4)


def test_minmax_matches_numpy(cube_and_mask):
    cube, mask = cube_and_mask
    out = Normalizer("minmax").fit(cube, mask).transform(cube)
    np.testing.assert_allclose(out[mask].min(0), 0.0, atol=1e-6)
    np.testing.assert_allclose(out[mask].max(0), 1.0, atol=1e-5)
    px = cube[mask].astype(np.float64)
    ref = (cube - px.min(0)) / (px.max(0) - px.min(0))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_none_only_casts(cube_and_mask):
    cube, mask = cube_and_mask
    out = Normalizer("none").fit(cube.astype(np.uint16), mask).transform(cube.astype(np.uint16))
    np.testing.assert_array_equal(out, cube.astype(np.uint16).astype(np.float32))


@pytest.mark.parametrize("method", ["standard", "minmax"])
@pytest.mark.parametrize("pca", [None, 3])
def test_test_pixels_do_not_change_statistics(cube_and_mask, method, pca):
    cube, mask = cube_and_mask
    a = Normalizer(method, pca).fit(cube, mask)
    other = cube.copy()
    other[~mask] = np.random.default_rng(0).normal(1e4, 1e3, size=other[~mask].shape)
    b = Normalizer(method, pca).fit(other, mask)
    sa, sb = a.state_dict(), b.state_dict()
    for key, value in sa.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, sb[key], rtol=0, atol=0)
    np.testing.assert_array_equal(a.transform(cube[mask]), b.transform(cube[mask]))


def test_pca_matches_svd_oracle(cube_and_mask):
    cube, mask = cube_and_mask
    norm = Normalizer("standard", pca_components=4).fit(cube, mask)
    px = cube[mask].astype(np.float64)
    z = (px - px.mean(0)) / px.std(0)
    zc = z - z.mean(0)
    _, sing, vt = np.linalg.svd(zc, full_matrices=False)  # oracle: SVD of the centred data
    ref = zc @ vt[:4].T  # (n, 4), signs arbitrary
    got = norm.transform(cube)[mask].astype(np.float64)  # (n, 4)
    assert got.shape == (int(mask.sum()), 4)
    for c in range(4):
        s = np.sign(np.dot(got[:, c], ref[:, c]))
        np.testing.assert_allclose(got[:, c], s * ref[:, c], rtol=1e-3, atol=1e-3)
    var = sing**2
    np.testing.assert_allclose(norm.explained_variance_ratio, var[:4] / var.sum(), rtol=1e-6)
    assert norm.out_channels == 4
    basis = norm.pca_basis  # sign rule: the largest loading of each axis is positive
    assert np.all(basis[np.abs(basis).argmax(0), np.arange(4)] > 0)


@pytest.mark.parametrize("pca", [None, 2])
def test_state_round_trip_weights_only(cube_and_mask, pca):
    cube, mask = cube_and_mask
    norm = Normalizer("standard", pca).fit(cube, mask)
    buf = io.BytesIO()
    torch.save({"data": norm.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["data"]
    again = Normalizer.from_state(state)
    np.testing.assert_array_equal(again.transform(cube), norm.transform(cube))
    as_lists = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    np.testing.assert_allclose(Normalizer.from_state(as_lists).transform(cube), norm.transform(cube))
    assert "Normalizer(method='standard'" in repr(again)


def test_constant_band_is_not_divided_by_zero(cube_and_mask):
    cube, mask = cube_and_mask
    cube = cube.copy()
    cube[..., 2] = 7.0
    out = Normalizer("standard").fit(cube, mask).transform(cube)
    assert np.all(np.isfinite(out)) and np.all(out[..., 2] == 0.0)
    out = Normalizer("minmax").fit(cube, mask).transform(cube)
    assert np.all(np.isfinite(out))


def test_errors(cube_and_mask):
    cube, mask = cube_and_mask
    with pytest.raises(DataError, match="pca_components: 99 exceeds the number of bands"):
        Normalizer("standard", 99).fit(cube, mask)
    with pytest.raises(DataError, match="normalise: expected one of"):
        Normalizer("zscore")
    with pytest.raises(DataError, match="empty mask"):
        Normalizer().fit(cube, np.zeros_like(mask))
    norm = Normalizer().fit(cube, mask)
    with pytest.raises(DataError, match="input has 3 bands; the normaliser was fitted on 8"):
        norm.transform(cube[..., :3])
    with pytest.raises(DataError, match="not fitted"):
        Normalizer().transform(cube)
    with pytest.raises(DataError, match="missing key 'shift'"):
        Normalizer.from_state({"method": "standard", "in_bands": 8})


def _reference(x: np.ndarray) -> np.ndarray:
    """Standard scaling in float64, the oracle."""
    x = x.astype(np.float64)
    return (x - x.mean(0)) / x.std(0)


@pytest.mark.parametrize("unit", [1e-12, 1e12])
def test_any_magnitude_is_scaled(unit: float) -> None:
    """Radiance in W/(cm^2 sr nm) is ~1e-9: a band's spread is tiny in absolute terms, not constant."""
    x = (np.random.default_rng(0).normal(3.0, 1.0, (500, 4)) * unit)
    out = Normalizer("standard").fit(x).transform(x)
    np.testing.assert_allclose(out, _reference(x), atol=1e-5)
    np.testing.assert_allclose(out.std(0), 1.0, rtol=1e-5)


def test_a_large_offset_keeps_its_detail() -> None:
    """Data at 1e8 with a spread of 10: subtracting in float32 leaves ~8 distinct values."""
    x = 1e8 + np.random.default_rng(1).normal(0.0, 10.0, (1000, 3))
    out = Normalizer("standard").fit(x).transform(x)
    np.testing.assert_allclose(out, _reference(x), atol=1e-5)
    assert np.unique(out[:, 0]).size == 1000


def test_a_band_constant_up_to_rounding_is_not_scaled() -> None:
    x = np.random.default_rng(2).normal(0.0, 1.0, (300, 3))
    x[:, 1] = 0.1 * 3  # one value, whose float64 mean may differ from it in the last bit
    x[:, 2] = 1e-30
    out = Normalizer("standard").fit(x).transform(x)
    assert np.abs(out[:, 1:]).max() < 1e-6  # not rounding noise blown up to +-1
