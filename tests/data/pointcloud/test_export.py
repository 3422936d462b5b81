"""Per-point prediction files: one row per input point, class names, no-data rows, LAS/LAZ copies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer.data.pointcloud.export import (
    NO_DATA,
    PointPrediction,
    asprs_codes_from_table,
    check_output_suffix,
    write_point_predictions,
)
from sciformer.data.pointcloud.io import read_point_file
from sciformer.errors import DataError


def prediction(n: int = 50, classes: int = 3, seed: int = 0) -> PointPrediction:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, classes))
    probs = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype(np.float32)  # (n, C)
    valid = rng.random(n) > 0.2
    probs[~valid] = 0.0
    return PointPrediction(probs, valid, ["ground", "tree", "roof top"])


def test_pred_and_confidence_against_numpy() -> None:
    p = prediction()
    np.testing.assert_array_equal(p.pred, np.where(p.valid, p.probs.argmax(axis=1), NO_DATA))
    np.testing.assert_allclose(p.confidence, np.where(p.valid, p.probs.max(axis=1), 0.0))


def test_npy_npz_ply(tmp_path: Path) -> None:
    p = prediction()
    coord = np.random.default_rng(1).normal(size=(50, 3)) + 1e6  # georeferenced: stays double
    sample = {"coord": coord, "label": np.arange(50) % 3}
    npy = write_point_predictions(tmp_path / "a.npy", sample, p)
    np.testing.assert_array_equal(np.load(npy), p.pred)
    npz = np.load(write_point_predictions(tmp_path / "a.npz", sample, p, probabilities=True))
    assert set(npz.files) == {"pred", "valid", "confidence", "class_names", "probabilities"}
    np.testing.assert_array_equal(npz["probabilities"], p.probs)
    assert list(npz["class_names"]) == p.class_names
    ply_path = write_point_predictions(tmp_path / "a.ply", sample, p, probabilities=True)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.npy", "a.npz", "a.ply"]  # nothing else
    ply = read_point_file(ply_path)
    np.testing.assert_array_equal(ply["coord"], coord)
    np.testing.assert_array_equal(ply["pred"], p.pred)
    np.testing.assert_array_equal(ply["label"], sample["label"])
    np.testing.assert_array_equal(ply["valid"], p.valid)
    np.testing.assert_allclose(ply["prob_2"], p.probs[:, 2])
    header = ply_path.read_bytes().split(b"end_header")[0].decode()
    assert "comment class 2 roof top\n" in header and f"comment pred {NO_DATA} = no data" in header


def test_suffix_and_row_checks(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unsupported output suffix '.csv'"):
        check_output_suffix(tmp_path / "a.csv", (".npy", ".ply"))
    with pytest.raises(DataError, match="LAS/LAZ output copies a LAS/LAZ input"):
        check_output_suffix(tmp_path / "a.laz", (".laz",), tmp_path / "in.ply")
    with pytest.raises(DataError, match="50 predictions for 49 input points"):
        write_point_predictions(tmp_path / "a.npy", {"coord": np.zeros((49, 3))}, prediction())
    assert asprs_codes_from_table({"ground": [2], "veg": [3, 4, 5], "other": []}) == [2, 3, 1]
    # 1 taken by a class: the next catch-all gets the first free spare code; no two classes share one
    assert asprs_codes_from_table({"a": [], "unclassified": [1, 19], "b": [], "c": [2]}) == [20, 1, 21, 2]


def test_las_copy_against_laspy(data_root: Path, tmp_path: Path) -> None:
    laspy = pytest.importorskip("laspy")
    source = data_root / "lidar" / "las_warsaw_small.las"
    a = laspy.read(source)
    n = len(a.points)
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(3), size=n).astype(np.float32)  # (n, 3)
    p = PointPrediction(probs, np.ones(n, bool), ["ground", "vegetation", "building"])
    out = write_point_predictions(tmp_path / "w.laz", {"coord": np.zeros((n, 3))}, p, source=source, asprs_codes=[2, 5, 6])
    b = laspy.read(out)
    np.testing.assert_array_equal(np.asarray(b.classification), np.array([2, 5, 6])[probs.argmax(axis=1)])
    np.testing.assert_array_equal(b.original_classification, a.classification)
    np.testing.assert_allclose(b.confidence, probs.max(axis=1))
    np.testing.assert_array_equal(b.X, a.X)
    assert b.header.point_format.id == a.header.point_format.id
    again = write_point_predictions(tmp_path / "w2.las", {"coord": np.zeros((n, 3))}, p, source=out, asprs_codes=[1, 1, 1])
    c = laspy.read(again)  # predicting a prediction reuses its extra dimensions and keeps the first original
    np.testing.assert_array_equal(c.original_classification, a.classification)
    np.testing.assert_array_equal(np.asarray(c.classification), np.ones(n))
    assert list(c.point_format.extra_dimension_names) == ["original_classification", "confidence"]
    if a.header.point_format.id < 6:
        with pytest.raises(DataError, match=r"ASPRS codes 2..40 do not fit point format \d of las_warsaw_small.las \(0..31\)"):
            write_point_predictions(tmp_path / "x.las", {"coord": np.zeros((n, 3))}, p, source=source, asprs_codes=[2, 40, 6])


def small_las(path: Path, **dims: np.dtype) -> Path:
    """A 50-point LAS 1.2 tile with the user's own extra dimensions ``dims`` (no description), filled with 7."""
    laspy = pytest.importorskip("laspy")
    header = laspy.LasHeader(point_format=1, version="1.2")
    for name, dtype in dims.items():
        header.add_extra_dim(laspy.ExtraBytesParams(name=name, type=dtype))
    las = laspy.LasData(header)
    las.x, las.y, las.z = np.arange(50.0), np.arange(50.0), np.zeros(50)
    for name, dtype in dims.items():
        las[name] = np.full(50, 7, dtype)
    las.write(path)
    return path


@pytest.mark.parametrize(("dims", "probabilities", "name"), [({"confidence": np.uint8}, False, "confidence"),
                                                             ({"confidence": np.float32}, False, "confidence"),
                                                             ({"prob_1": np.float32}, True, "prob_1"),
                                                             ({"prob_7": np.float32}, True, "prob_7")])
def test_las_input_with_own_prediction_named_dimension_is_refused(tmp_path: Path, dims: dict, probabilities: bool, name: str) -> None:
    """The user's own 'confidence' (any type) or, with probabilities, a prob_<k> of theirs is never
    replaced or left beside the new prob_<k> as if it were the model's: one line, nothing written."""
    source = small_las(tmp_path / "in.las", **dims)
    with pytest.raises(DataError, match=rf"in.las: the input has its own dimension '{name}'"):
        write_point_predictions(tmp_path / "out.las", {"coord": np.zeros((50, 3))}, prediction(), source=source, probabilities=probabilities)
    assert not (tmp_path / "out.las").exists()


def test_las_prediction_of_a_prediction_replaces_its_dimensions(tmp_path: Path) -> None:
    """An earlier prediction's confidence / prob_<k> (known by their descriptions) are replaced, its
    prob_<k> that the new one does not write are dropped; the user's other dimensions stay."""
    laspy = pytest.importorskip("laspy")
    source = small_las(tmp_path / "in.las", prob_7=np.float32)
    first = write_point_predictions(tmp_path / "a.las", {"coord": np.zeros((50, 3))}, prediction(), source=source)
    p4 = PointPrediction(np.full((50, 4), 0.25, np.float32), np.ones(50, bool), ["a", "b", "c", "d"])
    second = laspy.read(write_point_predictions(tmp_path / "b.las", {"coord": np.zeros((50, 3))}, p4, source=first))
    assert list(second.point_format.extra_dimension_names) == ["prob_7", "original_classification", "confidence"]
    np.testing.assert_array_equal(second.prob_7, np.full(50, 7, np.float32))  # the user's, kept without --probabilities
    np.testing.assert_allclose(second.confidence, 0.25)
    small_las(tmp_path / "plain.las")
    with_probs = write_point_predictions(tmp_path / "c.las", {"coord": np.zeros((50, 3))}, p4, source=tmp_path / "plain.las", probabilities=True)
    again = laspy.read(write_point_predictions(tmp_path / "d.las", {"coord": np.zeros((50, 3))}, prediction(), source=with_probs,
                                               probabilities=True))
    assert list(again.point_format.extra_dimension_names) == ["original_classification", "confidence", "prob_0", "prob_1", "prob_2"]
    np.testing.assert_allclose(np.column_stack([again.prob_0, again.prob_1, again.prob_2]), prediction().probs)
    without = laspy.read(write_point_predictions(tmp_path / "e.las", {"coord": np.zeros((50, 3))}, prediction(), source=with_probs))
    assert list(without.point_format.extra_dimension_names) == ["original_classification", "confidence"]  # no stale prob_3
