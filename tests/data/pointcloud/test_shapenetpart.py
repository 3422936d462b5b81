"""ShapeNetPart dataset (miniature layout); its instance/category mIoU is tested in tests/engine/test_part_miou.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sciformer.contracts import BuildContext
from sciformer.data.pointcloud.shapenetpart import (
    CATEGORY_NAMES,
    CATEGORY_PARTS,
    PART_NAMES,
    ShapeNetPartConfig,
    build_shapenetpart,
)
from sciformer.errors import DataError
from sciformer.registry import DATASETS


def test_category_table() -> None:
    assert len(CATEGORY_NAMES) == 16 and len(PART_NAMES) == 50
    assert CATEGORY_PARTS["Airplane"] == [0, 1, 2, 3]
    assert CATEGORY_PARTS["Motorbike"] == [30, 31, 32, 33, 34, 35]
    assert CATEGORY_PARTS["Table"] == [47, 48, 49]
    assert DATASETS._entries["shapenetpart"].config is ShapeNetPartConfig


@pytest.fixture
def root(tmp_path: Path, fakes) -> Path:
    return fakes.shapenetpart(tmp_path / "shapenetcore_partanno_segmentation_benchmark_v0_normal")


def test_dataset_splits_and_samples(root: Path, ctx: BuildContext) -> None:
    task = build_shapenetpart(ShapeNetPartConfig(root=str(root), num_points=32), ctx)
    assert task.info.num_classes == 50 and task.info.in_channels == 6
    assert task.info.category_parts["Bag"] == [4, 5]
    assert [len(task.dataset(s)) for s in ("train", "val", "test")] == [5, 2, 3]
    tr = task.dataset("train")[0]
    assert tr["coord"].shape == (32, 3) and tr["feat"].shape == (32, 6) and tr["category"] == 0
    assert set(tr["label"].tolist()) <= set(CATEGORY_PARTS["Airplane"])
    te = [task.dataset("test")[i] for i in range(3)]
    assert all(s["coord"].shape == (50, 3) for s in te)  # evaluation keeps every point
    batch = task.collate(te)
    assert batch["category"].tolist() == [0, 0, 1]
    assert batch["offset"].tolist() == [50, 100, 150] and batch["target"].shape == (150,)


def test_category_subset(root: Path, ctx: BuildContext) -> None:
    task = build_shapenetpart(ShapeNetPartConfig(root=str(root), categories=["Bag"]), ctx)
    assert [len(task.dataset(s)) for s in ("train", "val", "test")] == [2, 1, 1]
    with pytest.raises(DataError, match="unknown"):
        build_shapenetpart(ShapeNetPartConfig(root=str(root), categories=["Boat"]), ctx)


def test_bad_layouts(root: Path, ctx: BuildContext) -> None:
    split = root / "train_test_split" / "shuffled_val_file_list.json"
    split.write_text(json.dumps(["shape_data/99999999/abc"]))
    with pytest.raises(DataError) as e:
        build_shapenetpart(ShapeNetPartConfig(root=str(root)), ctx)
    assert "synset 99999999 not in synsetoffset2category.txt" in str(e.value)
    split.unlink()
    with pytest.raises(DataError, match="shuffled_val_file_list.json: missing split file"):
        build_shapenetpart(ShapeNetPartConfig(root=str(root)), ctx)
    (root / "synsetoffset2category.txt").unlink()
    with pytest.raises(DataError, match="missing category file"):
        build_shapenetpart(ShapeNetPartConfig(root=str(root)), ctx)


def test_label_outside_category_parts(root: Path, ctx: BuildContext) -> None:
    task = build_shapenetpart(ShapeNetPartConfig(root=str(root)), ctx)
    path = task.dataset("test").files[0][0]
    table = np.loadtxt(path)
    table[0, 6] = 40  # a Pistol part in an Airplane
    np.savetxt(path, table, fmt="%.6f")
    with pytest.raises(DataError) as e:
        task.dataset("test")[0]
    assert path.name in str(e.value) and "outside Airplane parts 0..3" in str(e.value)


def test_file_predictor_restricts_to_the_category(root: Path, ctx: BuildContext, tmp_path: Path, one_line_error) -> None:
    """Today: "dataset 'shapenetpart' has no file predictor"."""
    from sciformer.contracts import PredictOptions
    from sciformer.data.pointcloud.io import read_point_file
    from sciformer.data.pointcloud.shapenetpart import predict_shapenetpart_file

    assert DATASETS.get("shapenetpart").predictor is predict_shapenetpart_file
    cfg = ShapeNetPartConfig(root=str(root))
    state = build_shapenetpart(cfg, ctx).state()
    bag = min((root / "02773838").glob("*.txt"))  # a Bag in its synset folder
    table = np.loadtxt(bag)  # (50, 7) x y z nx ny nz part

    def oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        assert batch["category"].tolist() == [1] and batch["feat"].shape == (50, 6)
        logits = torch.zeros(len(batch["coord"]), 50)
        logits[:, 49] = 9.0  # a Table part everywhere: outside the Bag's parts
        logits[:, 4] = (batch["coord"][:, 0] > 0).float() * 2  # Bag part 4 where x > 0, else part 5
        logits[:, 5] = 1.0
        return logits

    out = predict_shapenetpart_file(cfg, state, oracle, bag, tmp_path / "bag.ply", 1)
    ply = read_point_file(out)
    np.testing.assert_array_equal(ply["pred"], np.where(table[:, 0] > 0, 4, 5))
    np.testing.assert_array_equal(ply["label"], table[:, 6].astype(int))
    assert "comment class 4 bag_0" in out.read_bytes()[:1500].decode()
    elsewhere = tmp_path / "shape.txt"
    elsewhere.write_bytes(bag.read_bytes())
    with pytest.raises(DataError) as err:
        predict_shapenetpart_file(cfg, state, oracle, elsewhere, tmp_path / "x.npy", 1)
    one_line_error(err, "cannot tell the shape's category", "--category")
    pred = predict_shapenetpart_file(cfg, state, oracle, elsewhere, tmp_path / "x.npy", 1, options=PredictOptions(category="bag"))
    np.testing.assert_array_equal(np.load(pred), ply["pred"])


def test_file_predictor_keeps_a_gross_outlier_apart(root: Path, ctx: BuildContext, tmp_path: Path, one_line_error) -> None:
    """One no-data point (x = 1e6) put in a shape: every other point gets exactly the scores it
    gets without it (the oracle's scores depend on the whole cloud's centre, as a model's do);
    scores that are not finite are one line, not a map of NaN."""
    from sciformer.data.pointcloud.io import read_point_file
    from sciformer.data.pointcloud.shapenetpart import predict_shapenetpart_file

    cfg = ShapeNetPartConfig(root=str(root))
    state = build_shapenetpart(cfg, ctx).state()
    rng = np.random.default_rng(6)
    xyz = rng.normal(size=(2000, 3)) * 0.3  # (2000, 3)
    normals = xyz / np.linalg.norm(xyz, axis=1, keepdims=True)
    table = np.hstack([xyz, normals])
    bag = tmp_path / "02773838"  # the Bag's synset folder names the category
    bag.mkdir()
    np.savetxt(bag / "clean.txt", table, fmt="%.6f")
    np.savetxt(bag / "dirty.txt", np.insert(table, 77, [1e6, 0, 0, 1, 0, 0], axis=0), fmt="%.6f")

    def centred(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["coord"][:, 0] - batch["coord"][:, 0].mean()  # (m,)
        logits = torch.zeros(len(x), 50)
        logits[:, 4], logits[:, 5] = x, -x
        return logits

    clean = read_point_file(predict_shapenetpart_file(cfg, state, centred, bag / "clean.txt", tmp_path / "c.ply", 1))
    dirty = read_point_file(predict_shapenetpart_file(cfg, state, centred, bag / "dirty.txt", tmp_path / "d.ply", 1))
    others = np.arange(2001) != 77
    np.testing.assert_array_equal(dirty["pred"][others], clean["pred"])
    assert dirty["valid"].all() and dirty["pred"][77] in (4, 5)

    def diverged(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.full((len(batch["coord"]), 50), float("nan"))

    with pytest.raises(DataError) as err:
        predict_shapenetpart_file(cfg, state, diverged, bag / "clean.txt", tmp_path / "n.npz", 1)
    one_line_error(err, "non-finite scores")


def test_a_training_shape_listed_for_test_is_refused(root: Path, ctx: BuildContext, one_line_error) -> None:
    """The same shape in the train and test lists (by name, or as a link to it) would be scored on
    data the model learned: refused in one line naming both lists."""
    import json

    lists = root / "train_test_split"
    train = json.loads((lists / "shuffled_train_file_list.json").read_text())
    test = json.loads((lists / "shuffled_test_file_list.json").read_text())
    (lists / "shuffled_test_file_list.json").write_text(json.dumps([*test, train[0]]))
    with pytest.raises(DataError) as err:
        build_shapenetpart(ShapeNetPartConfig(root=str(root)), ctx)
    one_line_error(err, "shuffled_test_file_list.json", "is also in train_test_split/shuffled_train_file_list.json")
