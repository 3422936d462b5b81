"""las_tiles dataset: tiles written with laspy, and the real LiDAR tiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from sciformer.contracts import BuildContext
from sciformer.data.pointcloud.lidar import LasTilesConfig, build_las_tiles, code_table
from sciformer.engine.metrics import label_scorer
from sciformer.errors import DataError
from sciformer.registry import DATASETS

SPLITS = {"train_files": ["a.las", "sub/b.laz"], "val_files": ["c.las"], "test_files": ["d.las"]}


@pytest.fixture
def root(tmp_path: Path, fakes) -> Path:
    root = tmp_path / "tiles"
    fakes.las(root / "a.las", n=3000, seed=1)
    fakes.las(root / "sub" / "b.laz", n=2000, seed=2, eight_bit=True)
    fakes.las(root / "c.las", n=800, seed=3)
    fakes.las(root / "d.las", n=1500, seed=4, rgb=False)
    return root


def oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.one_hot(batch["target"].clamp(min=0), 4).float()


def test_registered() -> None:
    assert DATASETS._entries["las_tiles"].config is LasTilesConfig


def test_code_table() -> None:
    classes = {"ground": [2], "vegetation": [3, 4, 5], "building": [6], "other": []}
    table = code_table(classes, "other")
    assert table[[2, 3, 5, 6, 1, 7, 255]].tolist() == [0, 1, 1, 2, 3, 3, 3]
    assert code_table(classes, "ignore")[[2, 7]].tolist() == [0, -1]


@pytest.mark.parametrize(
    ("update", "needle"),
    [
        ({"classes": {"a": [2], "b": [2, 3]}}, "code 2 is already class 'a'"),
        ({"classes": {"a": [300]}}, "outside the ASPRS range"),
        ({"unmapped": "rest"}, "neither 'ignore' nor a class"),
        ({"train_files": []}, "train_files"),
        ({"features": ["rgb", "height", "nir"]}, "unknown feature 'nir'"),
        ({"eval_transforms": [{"name": "random_dropout"}]}, "drops or reorders points"),
        ({"crop_siz": 10}, "crop_siz"),
    ],
)
def test_config_validation(update: dict, needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        LasTilesConfig(**{**SPLITS, **update})
    assert needle in str(e.value)


def test_features_auto_and_checked(root: Path, ctx: BuildContext) -> None:
    task = build_las_tiles(LasTilesConfig(root=str(root), **SPLITS), ctx)
    assert task.info.features == ["intensity"]  # d.las has no RGB
    assert task.info.in_channels == 1 and task.info.class_names == ["ground", "vegetation", "building", "other"]
    rgb_only = {**SPLITS, "test_files": ["c.las"], "val_files": ["sub/b.laz"], "train_files": ["a.las"]}
    assert build_las_tiles(LasTilesConfig(root=str(root), **rgb_only), ctx).info.in_channels == 4
    with pytest.raises(DataError) as e:
        build_las_tiles(LasTilesConfig(root=str(root), features=["colour", "intensity"], **SPLITS), ctx)
    assert "d.las has no RGB" in str(e.value)
    with pytest.raises(DataError, match="'x.las' not found"):
        build_las_tiles(LasTilesConfig(root=str(root), **{**SPLITS, "val_files": ["x.las"]}), ctx)


@pytest.mark.parametrize("spelling", ["a.las", "./a.las", "sub/../a.las", "ABS", "link.las", "hard.las"])
def test_a_tile_in_two_splits_is_refused_however_named(root: Path, ctx: BuildContext, spelling: str) -> None:
    (root / "link.las").symlink_to(root / "a.las")
    (root / "hard.las").hardlink_to(root / "a.las")
    name = str(root / "a.las") if spelling == "ABS" else spelling
    with pytest.raises(DataError, match=r"data.test_files: .* is also in data.train_files.*splits must not share tiles"):
        build_las_tiles(LasTilesConfig(root=str(root), **{**SPLITS, "test_files": [name]}), ctx)
    with pytest.raises(DataError, match=r"data.train_files: .* is listed twice"):
        build_las_tiles(LasTilesConfig(root=str(root), **{**SPLITS, "train_files": ["a.las", "sub/b.laz", name]}), ctx)


def test_no_validation_tiles(root: Path, ctx: BuildContext) -> None:
    """``val_files: []``: a refit on every labelled tile; the validation split is empty."""
    task = build_las_tiles(LasTilesConfig(root=str(root), **{**SPLITS, "train_files": ["a.las", "sub/b.laz", "c.las"], "val_files": []}), ctx)
    assert len(task.dataset("val")) == 0 and task.scene_names("test") == ["d"]
    with pytest.raises(ValidationError, match="val_files"):  # only an explicit [] means a refit, not a forgotten key
        LasTilesConfig(train_files=["a.las"], test_files=["d.las"])
    assert task.describe()["files"] == {"train": ["a.las", "sub/b.laz", "c.las"], "val": [], "test": ["d.las"]}


def test_training_crops(root: Path, ctx: BuildContext) -> None:
    cfg = LasTilesConfig(root=str(root), crop_size=30.0, crops_per_tile=3, crop_max_points=200,
                         features=["coord", "intensity", "height"], train_transforms=[], **SPLITS)
    task = build_las_tiles(cfg, ctx)
    train = task.dataset("train")
    assert len(train) == 2 * 3
    s = train[0]
    n = len(s["coord"])
    assert 100 <= n <= 200 and s["feat"].shape == (n, 5)
    assert np.abs(s["coord"][:, :2]).max() <= 15.0 + 1e-3  # recentred square crop
    assert s["coord"][:, 2].min() == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(s["feat"][:, 4], s["coord"][:, 2], atol=1e-5)  # height above crop minimum
    assert 0.0 <= s["feat"][:, 3].min() and s["feat"][:, 3].max() <= 1.0  # normalised intensity
    # recentred in float64: coordinate differences stay on the 1 cm LAS grid
    # (float32 at x = 600000 would quantise them to 6.25 cm)
    dx = (s["coord"][:, 0] - s["coord"][0, 0]).astype(np.float64) * 100
    np.testing.assert_allclose(dx, np.round(dx), atol=0.05)
    np.testing.assert_array_equal(train[0]["coord"], s["coord"])  # crops decided by (seed, epoch, item)
    train.set_epoch(1)
    assert not np.array_equal(train[0]["coord"], s["coord"])  # new crops each epoch
    assert set(np.unique(s["label"]).tolist()) <= {0, 1, 2, 3}


def test_unmapped_ignore_and_cache(root: Path, ctx: BuildContext) -> None:
    cfg = LasTilesConfig(root=str(root), unmapped="ignore", classes={"ground": [2], "building": [6]}, **SPLITS)
    task = build_las_tiles(cfg, ctx)
    full = task.dataset("test").source.load(0)
    assert full["coord"].dtype == np.float64 and full["coord"][:, 0].min() > 599999
    assert set(np.unique(full["label"]).tolist()) == {-1, 0, 1}
    before = sorted(p.name for p in root.rglob("*"))
    assert (ctx.cache_dir / "las_tiles").is_dir() and before == ["a.las", "b.laz", "c.las", "d.las", "sub"]


def test_whole_tile_evaluation(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    cfg = LasTilesConfig(root=str(root), eval_max_points=400, **SPLITS)
    task = build_las_tiles(cfg, ctx)
    test = task.dataset("test")
    assert len(test) == 4  # 1500 points in balanced parts of <= 400
    score = label_scorer(task.info.class_names, task.ignore_index)
    facts = task.export_predictions(oracle, tmp_path / "out", batch_size=3, export=None, score=score)["full_resolution"]
    assert facts["points"] == 1500 and facts["oa"] == 1.0 and facts["scenes"] == 1
    pred = np.load(tmp_path / "out" / "d_pred.npy")
    assert pred.shape == (1500,)
    from sciformer.data.pointcloud.io import read_point_file

    ply = read_point_file(tmp_path / "out" / "d.ply")
    assert ply["coord"][:, 0].min() > 599999  # georeferenced coordinates written in double
    np.testing.assert_array_equal(ply["pred"], pred)


def test_real_tiles(fakes, ctx: BuildContext) -> None:
    fakes.real_path("lidar")
    cfg = LasTilesConfig(
        train_files=["append-bug.laz", "autzen_trim.laz", "las_sample_c.las"],
        val_files=["las_warsaw_small.las"],
        test_files=["las_mvk-thin.las", "file_with_both_wkt_and_geotiff_vlrs.las"],
        crops_per_tile=1,
    )
    task = build_las_tiles(cfg, ctx)
    assert task.info.features == ["intensity"]  # two test tiles have no RGB
    tiles = task.dataset("test").source
    counts = [np.bincount(tiles.load(i)["label"], minlength=4).tolist() for i in range(2)]
    # README table, merged as ground (2) / vegetation (3, 4, 5) / building (6) / other
    assert counts[0] == [1693, 141 + 578, 0, 129 + 37 + 3702]
    assert counts[1] == [9808, 158 + 724 + 10956, 3737, 25]
    sample = task.dataset("train")[1]  # autzen: 110,000 points, capped crop
    assert 100 <= len(sample["coord"]) <= 40000


def test_predictor_writes_every_point(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    from sciformer.data.pointcloud.io import read_point_file
    from sciformer.data.pointcloud.lidar import predict_las_file

    assert DATASETS._entries["las_tiles"].predictor is predict_las_file
    cfg = LasTilesConfig(root=str(root), eval_max_points=500, **SPLITS)
    state = build_las_tiles(cfg, ctx).state()
    out = predict_las_file(cfg, state, oracle, root / "c.las", tmp_path / "pred" / "c.ply", batch_size=2)
    ply = read_point_file(out)
    assert ply["coord"].shape == (800, 3) and ply["coord"][:, 0].min() > 599999
    np.testing.assert_array_equal(ply["pred"], ply["label"])  # oracle reproduces the mapped classes
    assert sorted(p.name for p in (tmp_path / "pred").iterdir()) == ["c.ply"]  # exactly the output asked for
    with pytest.raises(DataError, match="unsupported output suffix"):
        predict_las_file(cfg, state, oracle, root / "c.las", tmp_path / "c.csv", batch_size=2)
    with pytest.raises(DataError, match="missing key '(unmapped|classes)'; not a las_tiles checkpoint"):
        predict_las_file(cfg, {"features": []}, oracle, root / "c.las", tmp_path / "c.npy", batch_size=2)


def test_state_is_weights_only_safe(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    task = build_las_tiles(LasTilesConfig(root=str(root), **SPLITS), ctx)
    torch.save({"data": task.state(), "describe": task.describe()}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert loaded["data"]["classes"] == {"ground": [2], "vegetation": [3, 4, 5], "building": [6], "other": []}
    assert loaded["data"]["class_names"] == ["ground", "vegetation", "building", "other"]
    assert loaded["describe"]["sizes"] == {"train": 16, "val": 1, "test": 1}


def test_predictor_options_views_and_overlap(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    from sciformer.contracts import PredictOptions
    from sciformer.data.pointcloud.lidar import predict_las_file
    from sciformer.errors import SciformerError

    cfg = LasTilesConfig(root=str(root), eval_max_points=300, **SPLITS)
    state = build_las_tiles(cfg, ctx).state()
    seen: list[int] = []

    def counting_oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append(int(batch["offset"][-1]))
        return oracle(batch)

    plain = np.load(predict_las_file(cfg, state, counting_oracle, root / "c.las", tmp_path / "plain.npy", batch_size=64))
    points_plain = sum(seen)
    seen.clear()
    options = PredictOptions(overlap=0.5, rotations=2, flip=True)
    voted = np.load(predict_las_file(cfg, state, counting_oracle, root / "c.las", tmp_path / "tta.npy", batch_size=64,
                                     options=options))
    np.testing.assert_array_equal(voted, plain)  # every view of the oracle agrees
    assert sum(seen) >= 4 * points_plain  # 4 views (2 turns x mirrored), each chunk with context
    with pytest.raises(SciformerError, match="--votes does not apply to 'las_tiles' predictions"):
        predict_las_file(cfg, state, oracle, root / "c.las", tmp_path / "v.npy", batch_size=2, options=PredictOptions(votes=3))


def test_predict_options_are_validated() -> None:
    from sciformer.contracts import PredictOptions
    from sciformer.errors import SciformerError

    with pytest.raises(SciformerError, match="--overlap must be between 0 and 4"):
        PredictOptions(overlap=-0.1)
    with pytest.raises(SciformerError, match="--tta-rotations must be between 1 and 100"):
        PredictOptions(rotations=0)


def test_the_intensity_scale_sets_gross_outliers_aside() -> None:
    """No-data returns (z = -9999, intensity 65535) and NaN coordinates move no other point's
    scaled intensity: the scale is the 99th percentile of the other points (numpy's, as oracle)."""
    from sciformer.data.pointcloud.lidar import intensity_p99

    rng = np.random.default_rng(3)
    coord = rng.uniform(0, 50, size=(3000, 3))  # (3000, 3)
    intensity = rng.uniform(0, 40000, size=3000)  # (3000,)
    clean = float(np.percentile(intensity, 99))
    assert intensity_p99(coord, intensity) == clean
    dirty_coord = np.vstack([coord, [[10.0, 10.0, -9999.0]] * 3, [[np.nan, 1.0, 1.0]]])  # (3004, 3)
    dirty_intensity = np.concatenate([intensity, [65535.0] * 4])
    assert intensity_p99(dirty_coord, dirty_intensity) == clean
    assert intensity_p99(coord[:0], intensity[:0]) == 1.0
