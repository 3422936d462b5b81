"""The cross-layer contract: typed DataInfo, its checkpoint form, the patch-size rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer import config
from sciformer.contracts import DataInfo, check_patch_size
from sciformer.engine.builders import data_info_from_dict, data_info_to_dict
from sciformer.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]


def test_data_info_round_trips_through_a_checkpoint_dict() -> None:
    info = DataInfo(3, ["a", "b", "c"], 8, patch_size=5, wavelengths=[400.0, 500.0])
    raw = data_info_to_dict(info)
    assert raw["patch_size"] == 5 and raw["task"] is None and "extras" not in raw
    assert data_info_from_dict(raw) == info


def test_old_checkpoints_with_extras_still_load() -> None:
    old = {"num_classes": 2, "class_names": ["x", "y"], "in_channels": 4,
           "extras": {"task": "segmentation", "features": ["colour"], "grid_size": 0.04, "num_categories": 16,
                      "category_names": ["Bag"], "category_parts": {"Bag": [0, 1]}}}
    info = data_info_from_dict(old)
    assert info == DataInfo(2, ["x", "y"], 4, task="segmentation", features=["colour"], category_names=["Bag"],
                            category_parts={"Bag": [0, 1]})
    hsi = data_info_from_dict({"num_classes": 2, "class_names": ["x", "y"], "in_channels": 4,
                               "extras": {"patch_size": 7, "wavelengths": None}})
    assert hsi.patch_size == 7 and hsi.wavelengths is None


@pytest.mark.parametrize("bad", [0, 4, -3, 2.0, True, "5", None])
def test_patch_size_rule(bad: object) -> None:
    with pytest.raises(DataError, match=r"patch_size: expected a positive odd integer"):
        check_patch_size(bad)
    if bad is not None:
        with pytest.raises(DataError, match="DataInfo.patch_size"):
            DataInfo(2, ["a", "b"], 3, patch_size=bad)  # type: ignore[arg-type]
    assert [check_patch_size(p) for p in (1, 3, np.int64(7))] == [1, 3, 7]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_heads=3", "model.num_heads: expected a divisor of dim=64, got 3"),
        ("model.band_window=2", "model.band_window: expected an odd window, got 2"),
        ("data.patch_size=4", "data.patch_size: expected a positive odd integer"),
    ],
)
def test_model_constraints_fail_when_the_config_loads(override: str, message: str) -> None:
    """Checked by config.load, which reads no data (the scene file is never opened)."""
    with pytest.raises(ConfigError) as err:
        config.load(ROOT / "experiments" / "indian_pines_demo.yaml", [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"name": "spectralformer", "stride": 4}, "model.stride: expected at most group_size=3, got 4"),
        ({"name": "spectralformer", "num_heads": 5}, "model.num_heads: expected a divisor of dim=64, got 5"),
        ({"name": "spectralformer", "dim": 15, "num_heads": 5}, "model.dim: expected an even width, got 15"),
        ({"name": "spectral_spatial", "dim": 18, "num_heads": 2}, "model.dim: expected a multiple of 4 (2D sinusoidal positions), got 18"),
    ],
)
def test_spectral_constraints_fail_when_the_config_loads(model: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.validate({"data": {"name": "hsi_scene", "source": "missing.mat"}, "model": model}, base_dir=ROOT)
    assert str(err.value) == message  # one line naming the dotted key, no section prefix doubled


def test_predict_wavelengths_keep_their_shape_so_a_table_is_refused() -> None:
    from sciformer.contracts import PredictOptions
    from sciformer.data.hsi.wavelengths import read_wavelength_spec

    wl = np.linspace(400.0, 1000.0, 20)
    for table in (np.stack([wl[::2], np.full(10, 10.0)], 1), wl.reshape(4, 5)):  # (10, 2) centre/FWHM; a (4, 5) grid
        with pytest.raises(DataError, match=rf"a table of shape \({table.shape[0]}, {table.shape[1]}\)"):
            read_wavelength_spec(PredictOptions(wavelengths=table).wavelengths)
    for column in (wl, wl[:, None], wl[None, :]):
        np.testing.assert_allclose(read_wavelength_spec(PredictOptions(wavelengths=column).wavelengths), wl)


def test_predict_wavelengths_as_a_tensor_requiring_grad_are_taken() -> None:
    import torch

    from sciformer.contracts import PredictOptions

    wl = np.linspace(400.0, 1000.0, 20)
    assert PredictOptions(wavelengths=torch.tensor(wl, requires_grad=True)).wavelengths == tuple(wl.tolist())


def test_label_ids_are_the_ids_of_the_maps_and_prediction_files() -> None:
    """A hyperspectral map writes class k as k + 1 (0 = unlabelled); a point prediction's ``pred`` writes k."""
    assert DataInfo(3, ["a", "b", "c"], 8, patch_size=5).label_ids == [1, 2, 3]
    assert DataInfo(3, ["a", "b", "c"], 4, task="segmentation").label_ids == [0, 1, 2]
    assert DataInfo(2, ["bed", "chair"], 3, task="classification").label_ids == [0, 1]
