"""Which points of a new file a model can classify (the rest get the no-data row)."""

from __future__ import annotations

import numpy as np

from sciformer.contracts import PredictOptions
from sciformer.data.pointcloud.predict_file import predict_cloud, valid_points


def test_valid_points_are_within_the_models_range() -> None:
    """A float64 coordinate or feature beyond float32's range becomes inf in the model's input,
    and a coordinate whose squared distance to its mirror point leaves float32 overflows the
    distances and norms made of it: such points are no-data rows (1e300 once stopped the whole file with a non-finite query)."""
    coord = np.zeros((7, 3))
    coord[1, 0] = np.nan
    coord[2, 1] = np.inf
    coord[3, 2] = 1e300
    coord[4, 0] = -4.0e18  # squared distances to its mirror point stay within float32
    coord[6, 1] = -3.0e38  # finite in float32, but its square is not
    intensity = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 1e39, 0.0])
    ok = valid_points({"coord": coord, "intensity": intensity}, ["intensity"])
    f32 = float(np.finfo(np.float32).max)
    with np.errstate(over="ignore", invalid="ignore"):
        oracle = np.all(3 * (2 * coord) ** 2 <= f32, axis=1) & (np.abs(intensity) <= f32)  # squared span of 3 axes
    np.testing.assert_array_equal(ok, oracle)
    np.testing.assert_array_equal(ok, [True, False, False, False, True, False, False])
    # a feature the model does not use does not invalidate a point
    np.testing.assert_array_equal(valid_points({"coord": coord, "intensity": intensity}, []),
                                  [True, False, False, False, True, True, False])


def test_points_near_float32s_limit_are_no_data_rows() -> None:
    """A cloud with points spread over +-3e38 (finite float32): those points get the no-data
    row and the model sees finite inputs only, without a numpy warning (they once overflowed
    the centring into inf and stopped the file with 'query has 41 rows with non-finite ...')."""
    import warnings

    import torch

    rng = np.random.default_rng(0)
    coord = rng.uniform(-1.0, 1.0, (300, 3))  # (n, 3)
    far = rng.choice(300, 40, replace=False)
    coord[far] = rng.uniform(-3e38, 3e38, (40, 3)).astype(np.float32)

    def model(batch, *args, **kwargs):
        assert torch.isfinite(batch["coord"]).all() and torch.isfinite(batch["feat"]).all()
        return torch.zeros(batch["coord"].shape[0], 2)  # (N, C)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = predict_cloud(model, {"coord": coord}, class_names=["a", "b"], features=["coord"], options=PredictOptions(),
                            grid_size=0.1, max_points=1000, part_z="min", transform=None, batch_size=2)
    expected = np.ones(300, dtype=bool)
    expected[far] = False
    np.testing.assert_array_equal(out.valid, expected)


def test_a_cloud_without_a_usable_point_gets_a_row_per_point_and_a_note(capsys) -> None:
    """Every point still gets its (no-data) row, in order, but a finished-looking file of nothing
    comes with a note on stderr; the model is never called."""
    def model(*args, **kwargs):
        raise AssertionError("the model ran on no point")

    coord = np.array([[np.nan, 0.0, 0.0], [1e300, 0.0, 0.0], [0.0, np.inf, 0.0]])
    out = predict_cloud(model, {"coord": coord}, class_names=["a", "b"], features=[], options=PredictOptions(),
                        grid_size=0.1, max_points=100, part_z="min", transform=None, batch_size=2)
    assert out.probs.shape == (3, 2) and not out.probs.any() and not out.valid.any()
    assert "none of the 3 points has finite coordinates" in capsys.readouterr().err


def test_a_missing_feature_of_a_headerless_table_suggests_naming_its_columns(tmp_path) -> None:
    """A 4-column integer .npy is read as x, y, z, label: the message says the columns were guessed
    and how to name them; a file with a header (PLY) gets no such hint."""
    import pytest

    from sciformer.data.pointcloud.io import read_point_file, write_ply
    from sciformer.data.pointcloud.predict_file import read_cloud, require_features
    from sciformer.errors import DataError

    np.save(tmp_path / "int4.npy", np.arange(40, dtype=np.int32).reshape(10, 4))
    data = read_cloud(tmp_path / "int4.npy")
    assert "intensity" not in data and "label" in data
    with pytest.raises(DataError, match=r"int4.npy: the model was trained with feature 'intensity'.*guessed from its width.*--columns x,y,z,intensity"):
        require_features(tmp_path / "int4.npy", data, ["intensity"])
    assert "intensity" in read_cloud(tmp_path / "int4.npy", "x,y,z,intensity")  # the hint works
    write_ply(tmp_path / "a.ply", np.zeros((4, 3)))
    with pytest.raises(DataError) as info:
        require_features(tmp_path / "a.ply", read_point_file(tmp_path / "a.ply"), ["intensity"])
    assert "--columns" not in str(info.value)


def test_an_empty_bin_scan_says_it_is_empty(tmp_path) -> None:
    import pytest

    from sciformer.data.pointcloud.io import read_point_file
    from sciformer.errors import DataError

    (tmp_path / "scan.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"scan.bin: the scan is empty \(0 bytes\); expected 4-column float32 records"):
        read_point_file(tmp_path / "scan.bin", "x,y,z,intensity")


def _value_model(batch, *args, **kwargs):
    """Scores made of each point's inputs and its chunk's mean position: a function of values only."""
    import torch

    coord, feat = batch["coord"].double(), batch["feat"].double()  # (N, 3), (N, F)
    w = torch.arange(1.0, 1.0 + 3 * feat.shape[1], dtype=torch.float64).reshape(feat.shape[1], 3)
    return torch.sin(feat @ w + 3.0 * coord + coord.mean(0)).float()  # (N, 3)


def test_the_order_of_the_points_changes_no_prediction() -> None:
    """Any order of a file's rows gives every point the same scores (one point per voxel once
    came from the lowest row: a tile rewritten in another order changed 7 % of its classes).
    Rows repeated exactly, rows at one place with other features, points equally near a voxel's
    centre and a far outlier are all in the cloud."""
    g = np.random.default_rng(0)
    coord = g.integers(0, 40, size=(400, 3)) / 8.0  # (400, 3) a 1/8 lattice: ties at 0.5 voxels
    coord[:, 2] /= 4
    intensity = g.integers(0, 4, size=400).astype(np.float64)  # (400,)
    twins = g.integers(0, 400, 60)
    coord = np.vstack([coord, coord[twins], [[1e4, 0.0, 0.0]]])  # repeated places, and an outlier
    intensity = np.concatenate([intensity, intensity[twins] + (np.arange(60) % 2), [1.0]])
    n = len(coord)

    def run(order: np.ndarray) -> np.ndarray:
        sample = {"coord": coord[order], "intensity": intensity[order]}
        out = predict_cloud(_value_model, sample, class_names=["a", "b", "c"], features=["coord", "intensity"],
                            options=PredictOptions(overlap=0.5, rotations=2), grid_size=0.5, max_points=60,
                            part_z="min", transform=None, batch_size=2)
        assert out.valid.all()
        return out.probs  # (n, 3)

    base = run(np.arange(n))
    assert len(np.unique(base.argmax(1))) == 3  # the scores tell the points apart
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(n)
        np.testing.assert_array_equal(run(perm), base[perm])
