"""The rules for applying a model to a cube of another band set (one row of the table each),
and the normaliser read at other wavelengths (oracle: the fitted statistics of the same bands)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sciformer.contracts import PredictOptions
from sciformer.data.hsi.bandmatch import EVALUATE_CENTRES, TrainedBands, input_wavelengths, plan_bands
from sciformer.data.hsi.normalize import Normalizer
from sciformer.data.predicting import start_prediction
from sciformer.errors import ConfigError, DataError, SciformerError
from sciformer.frontend import python_api

WL = np.linspace(400.0, 2500.0, 200)  # (200,) nm


def trained(source: str = "auto", wavelengths: np.ndarray | None = WL, pca: int | None = None) -> TrainedBands:
    state = {"in_bands": 200, "position_source": source, "normaliser": {"pca_components": pca}}
    if wavelengths is not None:
        state["wavelengths"] = torch.as_tensor(wavelengths, dtype=torch.float32)
    return TrainedBands.from_state(state)


def test_which_models_place_bands_by_wavelength() -> None:
    assert trained("auto").by_wavelength and trained("wavelength").by_wavelength
    assert not trained("index").by_wavelength
    assert not trained("auto", wavelengths=None).by_wavelength  # trained without centres: indices
    assert trained(pca=30, wavelengths=None).pca_components == 30


def test_wavelength_model_takes_any_band_set_with_centres(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_bands(trained(), 100, WL[::2], "half.npy")
    np.testing.assert_array_equal(plan.wavelengths, WL[::2])
    assert plan.resample
    assert "half.npy: 100 bands, 400.0-2489.4 nm placed by wavelength" in capsys.readouterr().err
    narrow = np.linspace(350.0, 1050.0, 72)  # 5 bands below the trained 400 nm
    plan = plan_bands(trained(), 72, narrow, "muufl.mat")
    assert "note: 5 of 72 bands of muufl.mat (350.0-389.4 nm) lie outside the trained 400.0-2500.0 nm" in capsys.readouterr().err
    np.testing.assert_array_equal(plan.keep, narrow >= 399.0)  # left out: the 5 below
    np.testing.assert_array_equal(plan.wavelengths, narrow[narrow >= 399.0])
    same = plan_bands(trained(), 200, WL + 0.4, "same.npy")  # within the 1 nm tolerance: the same band set
    assert not same.resample and capsys.readouterr().err == ""


def test_wavelength_model_without_input_centres(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_bands(trained(), 200, None, "cube.npy")  # same sensor: the checkpoint's centres
    np.testing.assert_allclose(plan.wavelengths, WL, atol=1e-3)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "note: cube.npy carries no wavelengths; using the model's (200 bands" in err
    with pytest.raises(DataError, match=r"cube.npy: the cube has 100 bands and no wavelengths; the model was trained "
                                        r"on 200 bands placed by wavelength: give the cube's band centres") as exc:
        plan_bands(trained(), 100, None, "cube.npy")
    assert "\n" not in str(exc.value)


def test_index_model_refuses_other_band_counts() -> None:
    with pytest.raises(DataError, match=r"x.npy: the cube has 100 bands but the model was trained on 200 bands placed "
                                        r"by band index \(model.position_source=index\)"):
        plan_bands(trained("index"), 100, WL[::2], "x.npy")
    with pytest.raises(DataError, match=r"100 bands but the model was trained on 200 bands .*training scene had no wavelengths"):
        plan_bands(trained("auto", wavelengths=None), 100, None, "x.npy")
    with pytest.raises(DataError, match="takes 30 PCA components of 200-band cubes"):
        plan_bands(trained(pca=30, wavelengths=None), 100, WL[::2], "x.npy")


def test_index_model_with_other_centres_needs_the_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    shifted = WL.copy()
    shifted[7] += 25.0
    with pytest.raises(DataError, match=r"band centres differ from the model's \(band 7: 498\.\d+ vs 473\.\d+ nm\).*"
                                        r"pass --allow-band-mismatch"):
        plan_bands(trained("index"), 200, shifted, "x.npy")
    plan = plan_bands(trained("index"), 200, shifted, "x.npy", allow_mismatch=True)
    assert plan.wavelengths is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("WARNING: x.npy: band centres differ")
    assert plan_bands(trained("index"), 200, WL, "x.npy").wavelengths is None  # same centres: runs, by index
    assert plan_bands(trained("index"), 200, None, "x.npy").wavelengths is None
    assert capsys.readouterr().err == ""


def test_given_centres_against_the_file() -> None:
    np.testing.assert_array_equal(input_wavelengths(None, WL, 200, "x", "--wavelengths"), WL)
    np.testing.assert_array_equal(input_wavelengths(WL, None, 200, "x", "--wavelengths"), WL)
    np.testing.assert_array_equal(input_wavelengths(WL, WL + 0.5, 200, "x", "--wavelengths"), WL + 0.5)
    with pytest.raises(DataError, match=r"--wavelengths: 100 wavelengths for x, a cube of 200 bands"):
        input_wavelengths(None, WL[::2], 200, "x", "--wavelengths")
    with pytest.raises(ConfigError, match=r"data.wavelengths differ from the band centres x carries \(band 0: 410 vs 400"):
        input_wavelengths(WL, WL + 10, 200, "x", "data.wavelengths", ConfigError)


def test_normaliser_read_at_other_wavelengths() -> None:
    rng = np.random.default_rng(0)
    wl = np.concatenate([np.linspace(400, 1300, 12), np.linspace(1250, 2500, 12)])  # overlapping spectrometers
    cube = rng.normal(50, 7, (9, 8, 24)) * np.linspace(1, 3, 24)  # (H, W, B)
    for method in ("standard", "minmax", "none"):
        norm = Normalizer(method).fit(cube, np.ones((9, 8), bool))
        half = norm.at_wavelengths(wl, wl[::2])
        np.testing.assert_allclose(half.transform(cube[:, :, ::2]), norm.transform(cube)[:, :, ::2], rtol=1e-5, atol=1e-5)
    norm = Normalizer("standard").fit(cube, np.ones((9, 8), bool))
    between = norm.at_wavelengths(wl, np.array([450.0]))
    expect = np.interp(450.0, wl[:2], cube.reshape(-1, 24)[:, :2].mean(axis=0))  # linear between bands 0 and 1
    np.testing.assert_allclose(between.shift, [expect])
    with pytest.raises(DataError, match="PCA basis is tied to the fitted bands"):
        Normalizer("standard", 3).fit(cube, np.ones((9, 8), bool)).at_wavelengths(wl, wl[::2])


def test_band_options_are_refused_by_other_predictors(tmp_path: Path) -> None:
    for opts in (PredictOptions(wavelengths=[500.0, 600.0]), PredictOptions(allow_band_mismatch=True)):
        with pytest.raises(SciformerError, match="does not apply to 'modelnet' predictions"):
            start_prediction("modelnet", opts, tmp_path / "a.ply", tmp_path / "b.json", (".json",))
        start_prediction("hsi_scene", opts, tmp_path / "a.npy", tmp_path / "b.npy", (".npy",),
                         accept=("wavelengths", "allow_band_mismatch"))
    assert PredictOptions(wavelengths=np.array([[500.0], [600.0]])).wavelengths == (500.0, 600.0)


def test_an_older_checkpoint_out_of_order_gets_its_own_order_back() -> None:
    """Checkpoints written before bands were sorted hold the file's order (AVIRIS overlaps near
    700 nm); an input of that band set, sorted, is put back in that order."""
    from sciformer.data.hsi.bandmatch import checkpoint_order

    trained = np.array([400.0, 410.0, 696.5, 686.9, 700.0, 1000.0])
    back = checkpoint_order(trained, np.sort(trained))
    np.testing.assert_array_equal(np.sort(trained)[back], trained)
    assert checkpoint_order(np.sort(trained), np.sort(trained)) is None  # sorted checkpoints: nothing to do
    assert checkpoint_order(trained, np.sort(trained) + 50.0) is None  # another band set: ascending order


def test_pca_model_checks_centres_only_when_its_checkpoint_recorded_them(capsys: pytest.CaptureFixture[str]) -> None:
    other = np.linspace(400.0, 1000.0, 200)  # same count, another sensor
    assert not trained(pca=30).by_wavelength and trained(pca=30).placement == "PCA component"
    with pytest.raises(DataError, match="band centres differ from the model's.*PCA.*--allow-band-mismatch"):
        plan_bands(trained(pca=30), 200, other, "x.npy")
    plan = plan_bands(trained(pca=30), 200, other, "x.npy", allow_mismatch=True)
    assert plan.wavelengths is None and capsys.readouterr().err.startswith("WARNING: ")
    assert plan_bands(trained(pca=30), 200, WL, "x.npy").wavelengths is None  # the same centres: runs, by index
    assert plan_bands(trained(pca=30, wavelengths=None), 200, other, "x.npy").notes == []  # an older checkpoint: as before


def test_messages_name_the_options_of_the_running_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DataError, match=r"no wavelengths.*or data\.wavelengths=\[\.\.\.\]\)$"):
        plan_bands(trained(), 100, None, "x.npy", given_as=EVALUATE_CENTRES)  # evaluate has no --wavelengths
    plan_bands(trained(), 200, None, "x.npy", given_as=EVALUATE_CENTRES)
    assert capsys.readouterr().err.rstrip().endswith("give data.wavelengths=[...] if it is another")
    with pytest.raises(DataError, match=r"or --wavelengths\)$"):
        plan_bands(trained(), 100, None, "x.npy")  # predict
    with python_api(), pytest.raises(DataError, match=r"or wavelengths=\)$"):
        plan_bands(trained(), 100, None, "x.npy")


def test_python_messages_name_the_keyword_of_the_mismatch_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    shifted = WL + 5.0
    with python_api():
        with pytest.raises(DataError, match=r"pass allow_band_mismatch=True to run anyway$"):
            plan_bands(trained("index"), 200, shifted, "x.npy")
        plan_bands(trained("index"), 200, shifted, "x.npy", allow_mismatch=True)
    err = capsys.readouterr().err
    assert err.rstrip().endswith("(allow_band_mismatch=True)") and "--allow" not in err


GAPPED = np.concatenate([np.arange(400.0, 1350.0, 10.0), np.arange(1420.0, 1820.0, 10.0),
                         np.arange(1950.0, 2200.0, 10.0), np.arange(2230.0, 2500.0, 10.0)])  # Indian Pines-like gaps


def test_bands_in_the_trained_gaps_are_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    """Oracle: the input centres with no trained band within 5 nm (half the 10 nm step; inside a
    regular step every centre has one)."""
    model = trained(wavelengths=GAPPED)
    wl = np.arange(365.0, 2500.0, 9.7)  # (221,) another sensor, 10 nm-ish steps straight through the gaps
    by_hand = np.abs(wl[:, None] - GAPPED[None, :]).min(axis=1) > 5.0
    plan = plan_bands(model, wl.size, wl, "av.mat")
    np.testing.assert_array_equal(plan.keep, ~by_hand)
    np.testing.assert_array_equal(plan.wavelengths, wl[~by_hand])
    err = capsys.readouterr().err.splitlines()
    ranges = "(365.0-394.1, 1354.4-1412.6, 1820.0-1936.4, 2198.3-2217.7, 2499.0 nm) lie outside"
    assert len(err) == 2 and err[1].startswith(f"note: {int(by_hand.sum())} of 221 bands of av.mat {ranges}")
    assert "left out (--allow-band-mismatch keeps them)" in err[1]
    kept = plan_bands(model, wl.size, wl, "av.mat", allow_mismatch=True)  # the opt-in: every band, with a warning
    assert kept.keep is None and np.array_equal(kept.wavelengths, wl)
    assert capsys.readouterr().err.splitlines()[1].startswith(f"WARNING: {int(by_hand.sum())} of 221 bands")
    near = plan_bands(model, 4, np.array([395.5, 1344.5, 1415.5, 1814.8]), "x")  # within half a step of a trained band
    assert near.keep is None


@pytest.mark.parametrize("shift", [-4.5, -1.5, 1.5, 4.5])
def test_a_recalibrated_sensor_keeps_every_band(shift: float) -> None:
    """The same sensor shifted by under half its 10 nm step: every band is next to a trained one."""
    assert plan_bands(trained(wavelengths=GAPPED), GAPPED.size, GAPPED + shift, "x", quiet=True).keep is None


def test_a_shift_over_half_a_step_leaves_out_the_bands_at_the_gap_edges() -> None:
    plan = plan_bands(trained(wavelengths=GAPPED), GAPPED.size, GAPPED + 6.0, "x", quiet=True)
    assert plan.keep is not None
    np.testing.assert_array_equal((GAPPED + 6.0)[~plan.keep], [1346.0, 1816.0, 2196.0, 2496.0])  # 6 nm past an edge


S2A = np.array([442.7, 492.4, 559.8, 664.6, 704.1, 740.5, 782.8, 832.8, 864.7, 945.1, 1613.7, 2202.4])  # Sentinel-2A L2A
S2B = np.array([442.2, 492.1, 559.0, 664.9, 703.8, 739.1, 779.7, 832.9, 864.0, 943.2, 1610.4, 2185.7])  # Sentinel-2B


def test_a_sparse_sensor_has_no_gaps_and_its_twin_keeps_every_band() -> None:
    """Sentinel-2's steps run 32-669 nm: its wide SWIR steps are its spacing, not gaps (2B's B12 lies 16.7 nm
    from 2A's). Beyond the ends a band reaches half the widest step within two bands, at most 25 nm."""
    model = trained(wavelengths=S2A)
    assert plan_bands(model, 12, S2B, "s2b", quiet=True).keep is None
    probe = np.array([408.0, 420.0, 1375.0, 2220.0, 2536.0])  # (5,) B10's cirrus band lies within a covered step
    np.testing.assert_array_equal(plan_bands(model, 5, probe, "x", quiet=True).keep, [False, True, True, True, False])


def test_overlapping_bands_make_no_gap() -> None:
    """AVIRIS's spectrometers overlap: pairs of centres under 1 nm apart between 10 nm steps."""
    wl = np.sort(np.r_[np.arange(400.0, 1000.0, 10.0), 690.4, 700.05])  # (62,)
    assert plan_bands(trained(wavelengths=wl), wl.size, wl + 3.0, "x", quiet=True).keep is None


def test_no_band_near_the_trained_ones_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    nm_as_um = np.linspace(400.0, 950.0, 59) * 1000.0  # nm values read as micrometres
    with pytest.raises(DataError, match=r"x.hdr: none of its 59 bands, 400000.0-950000.0 nm lies within the model's trained "
                                        r"400.0-2500.0 nm .*about 1e3 times.*unit slip.*--allow-band-mismatch") as exc:
        plan_bands(trained(), 59, nm_as_um, "x.hdr")
    assert "\n" not in str(exc.value)
    with pytest.raises(DataError, match=r"none of its 2 bands, 2600.0-2700.0 nm lies within.*next to a trained band; fix"):
        plan_bands(trained(), 2, np.array([2600.0, 2700.0]), "x")  # no unit slip to name
    plan = plan_bands(trained(), 59, nm_as_um, "x.hdr", allow_mismatch=True)
    assert plan.keep is None and "WARNING: 59 of 59 bands" in capsys.readouterr().err


def test_a_sparse_sensor_reaches_at_most_25_nm_past_its_range() -> None:
    """Half a Sentinel-2 step at the range end is 300 nm: a hyperspectral input's 2210-2500 nm bands
    were all fed to an 11-band model that ends at 2202.4 nm. Past the ends the reach is 25 nm at most."""
    from sciformer.data.hsi.bandmatch import unseen_bands

    s2 = np.array([442.7, 492.4, 559.8, 664.6, 704.1, 740.5, 782.8, 832.8, 864.7, 1613.7, 2202.4])
    probes = np.array([410.0, 418.0, 420.0, 1610.4, 2185.7, 2226.0, 2228.0, 2300.0, 2500.0])
    nearest = np.abs(probes[:, None] - s2[None, :]).min(axis=1)
    outside = (probes < s2[0]) | (probes > s2[-1])
    np.testing.assert_array_equal(unseen_bands(s2, probes), outside & (nearest > 25.0))  # by hand: beyond the ends, over 25 nm
