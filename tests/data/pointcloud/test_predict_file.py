"""Which points of a new file a model can classify (the rest get the no-data row)."""

from __future__ import annotations

import numpy as np

from sciformer.contracts import PredictOptions
from sciformer.data.pointcloud.predict_file import predict_cloud, valid_points


def test_valid_points_are_finite_in_float32() -> None:
    """A float64 coordinate or feature beyond float32's range becomes inf in the model's input:
    such points are no-data rows (1e300 once stopped the whole file with a non-finite query)."""
    coord = np.zeros((6, 3))
    coord[1, 0] = np.nan
    coord[2, 1] = np.inf
    coord[3, 2] = 1e300
    coord[4, 0] = -3.0e38  # within float32
    intensity = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 1e39])
    ok = valid_points({"coord": coord, "intensity": intensity}, ["intensity"])
    f32 = np.abs(np.concatenate([coord, intensity[:, None]], axis=1)) <= np.finfo(np.float32).max  # oracle
    np.testing.assert_array_equal(ok, f32.all(axis=1))
    np.testing.assert_array_equal(ok, [True, False, False, False, True, False])
    # a feature the model does not use does not invalidate a point
    np.testing.assert_array_equal(valid_points({"coord": coord, "intensity": intensity}, []),
                                  [True, False, False, False, True, True])


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
