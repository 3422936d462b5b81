"""Point-cloud transforms: behaviour, seeding, repr and YAML construction."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import pytest
import torch
from pydantic import AfterValidator, BaseModel, ValidationError

from sciformer.data.transforms import (
    CenterShift,
    ChromaticAutoContrast,
    ChromaticJitter,
    Compose,
    FixedPoints,
    GridSample,
    NormalizeScale,
    RandomDropout,
    RandomFlip,
    RandomJitter,
    RandomRotate,
    RandomSample,
    RandomScale,
    ShufflePoints,
    SphereCrop,
    ToTensor,
    build_transforms,
    check_transform_specs,
    grid_sample_indices,
    transform_names,
)
from sciformer.errors import ConfigError, DataError


def make_sample(n: int = 200, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    normal = rng.normal(size=(n, 3))
    return {
        "coord": (rng.normal(size=(n, 3)) * 2 + 5).astype(np.float32),
        "normal": (normal / np.linalg.norm(normal, axis=1, keepdims=True)).astype(np.float32),
        "colour": rng.uniform(0.2, 0.6, size=(n, 3)).astype(np.float32),
        "label": np.arange(n, dtype=np.int64),
        "category": np.int64(3),
    }


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_center_shift_modes() -> None:
    s = make_sample()
    lo, hi = s["coord"].min(0), s["coord"].max(0)
    out = CenterShift()(s)
    np.testing.assert_allclose(out["coord"].min(0) + out["coord"].max(0), 0, atol=1e-5)
    out = CenterShift(z="min")(s)
    assert out["coord"][:, 2].min() == pytest.approx(0.0, abs=1e-6)
    out = CenterShift(z="keep")(s)
    np.testing.assert_allclose(out["coord"][:, 2], s["coord"][:, 2])
    np.testing.assert_allclose(out["coord"][:, :2].max(0), (hi - lo)[:2] / 2, rtol=1e-5)
    with pytest.raises(ConfigError):
        CenterShift(z="top")  # type: ignore[arg-type]


def test_center_shift_keeps_float64_precision() -> None:
    coord = np.array([[600000.01, 5000000.02, 200.0], [600010.03, 5000010.04, 210.0]])
    out = CenterShift(z="min")({"coord": coord})
    assert out["coord"].dtype == np.float64
    np.testing.assert_allclose(out["coord"], [[-5.01, -5.01, 0.0], [5.01, 5.01, 10.0]], atol=1e-9)


def test_normalize_scale_unit_sphere() -> None:
    out = NormalizeScale()(make_sample())
    np.testing.assert_allclose(out["coord"].mean(0), 0, atol=1e-5)
    assert np.linalg.norm(out["coord"], axis=1).max() == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(DataError) as e:
        NormalizeScale()({"coord": np.zeros((0, 3), np.float32)})
    assert "empty point cloud" in str(e.value)


@pytest.mark.parametrize("axis", ["x", "y", "z"])
def test_random_rotate_preserves_norms_and_axis(axis: str) -> None:
    s = make_sample()
    out = RandomRotate(axis=axis, angle=(10, 350))(s, rng(1))
    np.testing.assert_allclose(np.linalg.norm(out["coord"], axis=1), np.linalg.norm(s["coord"], axis=1), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out["normal"], axis=1), 1.0, rtol=1e-5)
    i = "xyz".index(axis)
    np.testing.assert_allclose(out["coord"][:, i], s["coord"][:, i], rtol=1e-6)  # the axis itself is fixed
    assert not np.allclose(out["coord"], s["coord"])
    # normals rotate with the points: the angle between a point and its normal is kept
    dot_before = np.sum(s["coord"] * s["normal"], axis=1)
    np.testing.assert_allclose(np.sum(out["coord"] * out["normal"], axis=1), dot_before, rtol=1e-4, atol=1e-4)


def test_random_rotate_exact_angle() -> None:
    out = RandomRotate(axis="z", angle=(90, 90))({"coord": np.array([[1.0, 0.0, 0.0]])}, rng())
    np.testing.assert_allclose(out["coord"], [[0.0, 1.0, 0.0]], atol=1e-12)
    same = RandomRotate(p=0.0)({"coord": np.ones((2, 3))}, rng())
    np.testing.assert_array_equal(same["coord"], np.ones((2, 3)))


def test_random_scale_range_and_seed() -> None:
    s = make_sample()
    t = RandomScale(scale=(0.8, 1.25))
    for seed in range(20):
        ratio = t(s, rng(seed))["coord"] / s["coord"]
        assert np.allclose(ratio, ratio[0, 0], rtol=1e-5)  # isotropic
        assert 0.8 - 1e-6 <= ratio[0, 0] <= 1.25 + 1e-6
    np.testing.assert_array_equal(t(s, rng(5))["coord"], t(s, rng(5))["coord"])
    ratio = RandomScale(scale=(0.5, 2.0), anisotropic=True)(s, rng(3))["coord"] / s["coord"]
    assert len(np.unique(np.round(ratio[0], 5))) == 3
    with pytest.raises(ConfigError):
        RandomScale(scale=(1.2, 1.0))


def test_random_jitter_clip() -> None:
    s = make_sample()
    out = RandomJitter(sigma=1.0, clip=0.05)(s, rng())
    delta = np.abs(out["coord"] - s["coord"])
    assert delta.max() <= 0.05 + 1e-6 and delta.max() > 0.04


def test_random_flip_flips_normals() -> None:
    s = make_sample()
    out = RandomFlip(axes=("x",), p=1.0)(s, rng())
    np.testing.assert_allclose(out["coord"][:, 0], -s["coord"][:, 0])
    np.testing.assert_allclose(out["normal"][:, 0], -s["normal"][:, 0])
    np.testing.assert_allclose(out["coord"][:, 1:], s["coord"][:, 1:])


def test_chromatic_transforms() -> None:
    s = make_sample()
    out = ChromaticAutoContrast(p=1.0, blend_factor=1.0)(s, rng())
    np.testing.assert_allclose(out["colour"].min(0), 0.0, atol=1e-6)
    np.testing.assert_allclose(out["colour"].max(0), 1.0, atol=1e-6)
    out = ChromaticJitter(p=1.0, std=0.05)(s, rng())
    assert 0.0 <= out["colour"].min() and out["colour"].max() <= 1.0
    assert 0.01 < np.std(out["colour"] - s["colour"]) < 0.1
    no_colour = {"coord": s["coord"]}
    assert ChromaticJitter(p=1.0)(no_colour, rng()) is no_colour


def test_point_subsets_move_every_point_array() -> None:
    s = make_sample(100)
    for t in (RandomDropout(ratio=0.3, p=1.0), ShufflePoints(), RandomSample(40), SphereCrop(25)):
        out = t(s, rng(2))
        idx = out["label"]  # labels are the original indices
        np.testing.assert_array_equal(out["coord"], s["coord"][idx])
        np.testing.assert_array_equal(out["colour"], s["colour"][idx])
        assert out["category"] == 3  # per-sample values untouched
    assert len(RandomDropout(ratio=0.3, p=1.0)(s, rng())["label"]) == 70
    assert sorted(ShufflePoints()(s, rng())["label"].tolist()) == list(range(100))
    assert len(np.unique(RandomSample(40)(s, rng())["label"])) == 40  # without replacement
    assert len(RandomSample(150)(s, rng())["label"]) == 150  # with replacement when fewer
    np.testing.assert_array_equal(FixedPoints(5)(s)["label"], np.arange(5))
    np.testing.assert_array_equal(FixedPoints(5)({"coord": np.zeros((2, 3)), "label": np.arange(2)})["label"], [0, 1, 0, 1, 0])


def test_sphere_crop_keeps_nearest() -> None:
    coord = np.array([[0, 0, 0], [10, 0, 0], [0.5, 0, 0], [9, 0, 0], [1, 0, 0], [4.6, 0, 0]], float)
    for seed in range(5):
        out = SphereCrop(3, mode="random")({"coord": coord, "label": np.arange(6)}, np.random.default_rng(seed))
        picked = sorted(out["label"].tolist())
        # the kept points are the 3 nearest neighbours of one of the points
        nearest = [sorted(np.argsort(np.abs(coord[:, 0] - c))[:3].tolist()) for c in coord[:, 0]]
        assert picked in nearest
    out = SphereCrop(3, mode="center")({"coord": coord, "label": np.arange(6)})
    assert sorted(out["label"].tolist()) == [3, 4, 5]  # nearest to the bbox centre x = 5
    small = {"coord": coord[:2], "label": np.arange(2)}
    assert SphereCrop(3)(small, rng()) is small


def test_grid_sample_inverse_maps_back() -> None:
    s = make_sample(500)
    t = GridSample(size=0.5, mode="test")
    out = t(s)
    keep = out["label"]
    # one point per voxel, and the inverse points every original point to its voxel's point
    vox = np.floor((s["coord"] - s["coord"].min(0)) / 0.5).astype(int)
    assert len(keep) == len(np.unique(vox, axis=0))
    np.testing.assert_array_equal(vox[keep][out["inverse"]], vox)
    # test mode is deterministic and keeps the point nearest each voxel's centre
    np.testing.assert_array_equal(GridSample(0.5, "test")(s)["label"], keep)
    c64 = s["coord"].astype(np.float64)
    dist = ((c64 - (c64.min(0) + (vox + 0.5) * 0.5)) ** 2).sum(1)  # (n,) to the voxel's centre
    for v in np.unique(out["inverse"]):
        members = np.flatnonzero(out["inverse"] == v)
        assert keep[v] == members[np.argmin(dist[members])]
    # train mode picks random points, same voxels
    tr = GridSample(0.5, "train")(s, rng(1))
    assert len(tr["label"]) == len(keep) and not np.array_equal(tr["label"], keep)
    # composition: a second, coarser grid maps original points through both inverses
    twice = GridSample(1.0, "test")(out)
    _, second = grid_sample_indices(out["coord"], 1.0)
    np.testing.assert_array_equal(twice["inverse"], second[out["inverse"]])
    assert twice["inverse"].shape == (500,)


def test_grid_sample_indices_empty_and_bad() -> None:
    keep, inv = grid_sample_indices(np.zeros((0, 3)), 0.1)
    assert keep.shape == (0,) and inv.shape == (0,)
    with pytest.raises(ConfigError):
        grid_sample_indices(np.zeros((3, 3)), 0.0)
    with pytest.raises(DataError):
        GridSample(0.1)({"coord": np.zeros((0, 3))})


def test_to_tensor() -> None:
    out = ToTensor()(make_sample(10))
    assert isinstance(out["coord"], torch.Tensor) and out["coord"].dtype == torch.float32
    assert out["label"].dtype == torch.int64
    assert ToTensor()({"coord": np.zeros((2, 3))})["coord"].dtype == torch.float32


def test_compose_seeded_and_repr() -> None:
    t = Compose([RandomRotate(axis="z", angle=(-180, 180)), RandomScale((0.9, 1.1)), RandomJitter(0.01, 0.05)])
    s = make_sample()
    np.testing.assert_array_equal(t(s, rng(4))["coord"], t(s, rng(4))["coord"])
    assert not np.array_equal(t(s, rng(4))["coord"], t(s, rng(5))["coord"])
    assert repr(t) == (
        "Compose([\n"
        "  RandomRotate(axis='z', angle=(-180.0, 180.0), p=1.0),\n"
        "  RandomScale(scale=(0.9, 1.1), anisotropic=False),\n"
        "  RandomJitter(sigma=0.01, clip=0.05)\n"
        "])"
    )
    assert repr(GridSample(0.04, "test")) == "GridSample(size=0.04, mode='test')"
    assert repr(NormalizeScale()) == "NormalizeScale()"
    assert repr(Compose([])) == "Compose([])"


def test_build_transforms_from_yaml_list() -> None:
    specs = [
        {"name": "random_rotate", "axis": "z", "angle": [-30, 30]},
        {"name": "RandomScale", "scale": [0.9, 1.1], "anisotropic": True},
        {"name": "grid_sample", "size": 0.05},
    ]
    t = build_transforms(specs)
    assert [type(x).__name__ for x in t.transforms] == ["RandomRotate", "RandomScale", "GridSample"]
    assert t.transforms[0].angle == (-30.0, 30.0) and t.transforms[1].anisotropic is True
    assert len(build_transforms(None)) == 0
    assert "random_rotate" in transform_names() and "grid_sample" in transform_names()


@pytest.mark.parametrize(
    ("specs", "needles"),
    [
        (
            [{"name": "random_rotat"}],
            ["data.t[0].name", "unknown transform 'random_rotat'", "did you mean 'random_rotate'", "valid transforms:"],
        ),
        ([{"name": "random_scale", "scal": [1, 2]}], ["data.t[0].scal", "did you mean 'scale'", "valid: scale, anisotropic"]),
        ([{"axis": "z"}], ["data.t[0]", "'name'"]),
        ([{"name": "random_jitter"}, {"name": "random_scale", "scale": "big"}], ["data.t[1].scale"]),
        ([{"name": "random_scale", "scale": [2, 1]}], ["data.t[0]", "0 < low <= high"]),
        ({"name": "random_scale"}, ["data.t", "list"]),
    ],
)
def test_build_transforms_errors(specs: Any, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        build_transforms(specs, key="data.t")
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_transform_specs_validate_inside_pydantic() -> None:
    class Cfg(BaseModel):
        train_transforms: Annotated[list[dict[str, Any]] | None, AfterValidator(check_transform_specs)] = None

    assert Cfg(train_transforms=[{"name": "shuffle_points"}]).train_transforms == [{"name": "shuffle_points"}]
    with pytest.raises(ValidationError) as e:
        Cfg(train_transforms=[{"name": "shufle_points"}])
    assert "did you mean 'shuffle_points'" in str(e.value)


def _lattice_cloud(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points on a 1/8 lattice (exact distances: many equally near a 0.5 voxel's centre),
    some rows repeated exactly and some at one place with other features."""
    g = np.random.default_rng(seed)
    coord = g.integers(0, 24, size=(300, 3)) / 8.0  # (300, 3)
    intensity = g.integers(0, 3, size=300).astype(np.float32)  # (300,) few values: ties
    colour = g.integers(0, 2, size=(300, 3)).astype(np.uint8)  # (300, 3)
    twins = g.integers(0, 300, 40)
    coord = np.vstack([coord, coord[twins], coord[twins[:20]]])  # repeated rows, and ...
    intensity = np.concatenate([intensity, intensity[twins], intensity[twins[:20]] + 1])  # ... other features
    colour = np.vstack([colour, colour[twins], colour[twins[:20]]])
    return coord, intensity, colour


def test_grid_sample_test_mode_picks_by_value_not_by_row() -> None:
    """Each voxel keeps the point nearest its centre, equal distances going to the smallest
    (x, y, z, ties...) lexicographically; any order of the rows keeps points of the same values
    (the lowest row once represented the voxel: 7 % of a LAS tile's points changed class
    when the file's points came in another order)."""
    for seed in range(4):
        coord, intensity, colour = _lattice_cloud(seed)
        keep, inverse = grid_sample_indices(coord, 0.5, ties=[intensity, colour])
        rows = np.column_stack([coord, intensity, colour])  # (n, 7) the values, in tie order
        cell = np.floor((coord - coord.min(0)) / 0.5)
        dist = ((coord - (coord.min(0) + (cell + 0.5) * 0.5)) ** 2).sum(1)  # exact on the lattice
        for v, k in enumerate(keep):
            members = np.flatnonzero(inverse == v)
            best = min(members, key=lambda i: (dist[i], *rows[i]))
            np.testing.assert_array_equal(rows[k], rows[best])
        for p in range(3):
            perm = np.random.default_rng([seed, p]).permutation(len(coord))
            k2, inv2 = grid_sample_indices(coord[perm], 0.5, ties=[intensity[perm], colour[perm]])
            np.testing.assert_array_equal(rows[perm][k2], rows[keep])  # the same kept values, same voxel order
            np.testing.assert_array_equal(rows[perm][k2][inv2], rows[keep][inverse][perm])  # per point
            t = GridSample(0.5, "test")({"coord": coord[perm], "intensity": intensity[perm], "colour": colour[perm]})
            u = GridSample(0.5, "test")({"coord": coord, "intensity": intensity, "colour": colour})
            for name in ("coord", "intensity", "colour"):
                np.testing.assert_array_equal(t[name], u[name])
