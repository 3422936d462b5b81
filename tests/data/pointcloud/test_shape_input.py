"""What the shape predictors check of a new shape (sciformer.data.pointcloud.shape_input), against
shapes whose centre and radius are known by construction."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sciformer.data.pointcloud.shape_input import (
    FEW_POINTS,
    check_degenerate,
    frame_record,
    place_in_frame,
    shape_extent,
)
from sciformer.errors import DataError
from sciformer.frontend import python_api

# Six points at +-1 on each axis: centre 0, radius 1, 6 distinct points.
STAR = np.vstack([np.eye(3), -np.eye(3)])  # (6, 3)


def star(centre: tuple[float, float, float], radius: float) -> np.ndarray:
    return STAR * radius + np.asarray(centre)  # (6, 3) centre and radius as given


def test_extent_is_the_mean_and_the_largest_distance_from_it() -> None:
    centre, radius = shape_extent(star((1.0, -2.0, 3.0), 4.0))
    np.testing.assert_allclose(centre, [1.0, -2.0, 3.0])
    assert radius == pytest.approx(4.0)


def test_frame_record_per_category() -> None:
    shapes = [("Chair", star((0.0, 0.1, 0.0), 1.0)), ("Chair", star((0.0, 0.3, 0.0), 0.8)),
              ("Chair", star((0.0, 0.2, 0.0), 1.2)), ("Table", star((0.0, 0.0, 0.0), 0.5))]
    record = frame_record(shapes)
    assert set(record) == {"Chair", "Table"}
    chair = record["Chair"]
    assert chair["shapes"] == 3
    np.testing.assert_allclose(chair["centre"], [0.0, 0.2, 0.0])  # the median centre
    assert chair["offset"] == pytest.approx(0.1)  # the farthest centre from it
    np.testing.assert_allclose(chair["radius"], [0.8, 1.0, 1.2])
    assert record["Table"]["radius"] == pytest.approx([0.5, 0.5, 0.5]) and record["Table"]["offset"] == 0.0
    assert all(type(v) is float for v in chair["centre"] + chair["radius"])  # plain floats: a checkpoint stores them


RECORD = frame_record([("Chair", star((0.0, 0.2, 0.0), r)) for r in (0.9, 1.0, 1.1)])


def _place(coord: np.ndarray, match: bool = False, record: dict | None = RECORD, category: str = "Chair") -> tuple[np.ndarray, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = place_in_frame(record, category, coord, np.arange(len(coord)), "shape.txt", match=match)
    return out, [str(w.message) for w in caught]


def test_a_shape_in_the_trained_frame_passes_unchanged() -> None:
    shape = star((0.05, 0.2, 0.0), 1.2)
    out, said = _place(shape)
    assert out is shape and said == []


@pytest.mark.parametrize(("coord", "needles"), [
    (star((0.0, 0.2, 0.0), 1000.0), ["radius 1000 (trained 0.9..1.1)"]),  # millimetres
    (star((0.0, 0.2, 0.0), 0.5), ["radius 0.5 (trained 0.9..1.1)"]),
    (star((5.0, 2.2, -3.0), 1.0), ["centre (5, 2.2, -3) (6.16 from the trained (0, 0.2, 0), whose shapes lie within 0)"]),
])
def test_a_shape_far_outside_the_frame_is_one_warning_naming_value_range_and_remedy(coord: np.ndarray, needles: list[str]) -> None:
    out, said = _place(coord)
    assert out is coord and len(said) == 1 and "\n" not in said[0]
    for needle in [*needles, "shape.txt", "Chair training shapes' frame", "--match-frame", "radius 1"]:
        assert needle in said[0], said[0]


def test_match_frame_centres_and_scales_into_the_frame() -> None:
    rng = np.random.default_rng(0)
    shape = rng.normal(size=(200, 3))  # (200, 3)
    centre, radius = shape.mean(axis=0), np.linalg.norm(shape - shape.mean(axis=0), axis=1).max()
    expected = (shape - centre) / radius * 1.0 + [0.0, 0.2, 0.0]  # median radius 1, median centre (0, 0.2, 0)
    for given in (shape, shape * 1000.0, shape + [5.0, 2.0, -3.0], shape * 0.01 - 40.0):
        out, said = _place(given, match=True)
        np.testing.assert_allclose(out, expected, atol=1e-9)
        assert said == []


def test_match_frame_centres_on_the_shape_and_moves_the_outliers_alike() -> None:
    shape = np.vstack([star((10.0, 0.0, 0.0), 100.0), [[1e6, 0.0, 0.0]]])  # (7, 3) the last row an outlier
    out = place_in_frame(RECORD, "Chair", shape, np.arange(6), "s", match=True)
    np.testing.assert_allclose(out[:6], star((0.0, 0.2, 0.0), 1.0), atol=1e-12)
    np.testing.assert_allclose(out[6], [(1e6 - 10.0) / 100.0, 0.2, 0.0])


def test_a_checkpoint_without_the_record_is_a_note_and_match_frame_is_refused(one_line_error) -> None:
    shape = star((0.0, 0.0, 0.0), 1000.0)
    out, said = _place(shape, record=None)
    assert out is shape and len(said) == 1 and "records no training frame" in said[0] and "not checked" in said[0]
    _, said = _place(shape, category="Table")
    assert len(said) == 1 and "trained on no Table shapes" in said[0]
    with pytest.raises(DataError) as err:
        _place(shape, match=True, record=None)
    one_line_error(err, "shape.txt", "--match-frame needs the Chair training shapes' frame", "records no training frame")
    with python_api(), pytest.raises(DataError) as err:
        _place(shape, match=True, record=None)
    one_line_error(err, "match_frame= needs")


def test_points_at_one_location_are_refused(one_line_error) -> None:
    with pytest.raises(DataError) as err:
        check_degenerate(np.tile([[0.5, 1.0, -2.0]], (1024, 1)), 1024, "one.txt")
    one_line_error(err, "one.txt", "all 1024 points lie at one location (0.5, 1, -2)")
    with pytest.raises(DataError):  # NaN rows do not make a shape
        check_degenerate(np.vstack([np.tile([[1.0, 1.0, 1.0]], (5, 1)), [[np.nan] * 3]]), 1024, "one.txt")


@pytest.mark.parametrize(("distinct", "num_points", "warned"), [
    (10, 1024, True), (FEW_POINTS - 1, 1024, True), (FEW_POINTS, 1024, False), (40, 48, True), (48, 48, False),
])
def test_few_distinct_points_are_a_warning_naming_the_trained_num_points(distinct: int, num_points: int, warned: bool) -> None:
    rng = np.random.default_rng(1)
    coord = rng.normal(size=(distinct, 3))[np.arange(1024) % distinct]  # (1024, 3): `distinct` points repeated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_degenerate(coord, num_points, "few.txt")
    said = [str(w.message) for w in caught]
    if not warned:
        assert said == []
        return
    assert len(said) == 1 and "\n" not in said[0]
    assert f"only {distinct} distinct points" in said[0] and f"num_points={num_points}" in said[0] and "few.txt" in said[0]
