"""S3DIS dataset against a miniature Stanford3dDataset_v1.2_Aligned_Version layout."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from sciformer.contracts import BuildContext
from sciformer.data.pointcloud.s3dis import S3DIS_CLASSES, S3DISConfig, build_s3dis
from sciformer.engine.metrics import label_scorer
from sciformer.errors import ConfigError, DataError
from sciformer.registry import DATASETS

ROOMS = {1: ["office_1", "office_2"], 2: ["hallway_1"], 5: ["hallway_6", "office_3"]}
ROOM_POINTS = 60 + 50 + 30 + 10 + 20  # floor, wall, chair, stairs, ceiling (see conftest)


@pytest.fixture
def root(tmp_path: Path, fakes) -> Path:
    return fakes.s3dis(tmp_path / "Stanford3dDataset_v1.2_Aligned_Version", ROOMS)


def build(root: Path, ctx: BuildContext, **kw) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_s3dis(S3DISConfig(root=str(root), **kw), ctx)


def oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.one_hot(batch["target"].clamp(min=0), 13).float() * 5


def test_registered() -> None:
    assert DATASETS._entries["s3dis"].config is S3DISConfig


def test_prepare_skips_malformed_line_with_warning(root: Path, ctx: BuildContext) -> None:
    before = sorted(root.rglob("*"))
    with pytest.warns(UserWarning, match=r"hallway_6/Annotations/ceiling_1.txt: skipped 1 malformed line\(s\) \(first: line 8\)"):
        task = build_s3dis(S3DISConfig(root=str(root)), ctx)
    assert sorted(root.rglob("*")) == before  # nothing written beside the raw data
    assert "(1 skipped)" in task.describe()["malformed_lines"]
    assert task.info.class_names == S3DIS_CLASSES and task.info.num_classes == 13
    assert task.info.in_channels == 6
    # a second build reads the prepared rooms (no warning: nothing is parsed again)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_s3dis(S3DISConfig(root=str(root)), ctx)


def test_malformed_line_error_policy(root: Path, ctx: BuildContext) -> None:
    with pytest.raises(DataError) as e:
        build(root, ctx, malformed_lines="error")
    msg = str(e.value)
    assert "Area_5/hallway_6/Annotations/ceiling_1.txt:8: expected 6 numbers" in msg and "\n" not in msg


def test_unknown_class_file(root: Path, ctx: BuildContext) -> None:
    (root / "Area_1" / "office_1" / "Annotations" / "lamp_1.txt").write_text("0 0 0 1 2 3\n")
    with pytest.raises(DataError) as e:
        build(root, ctx)
    assert "lamp_1.txt: unknown class 'lamp'" in str(e.value)


def test_no_rooms(tmp_path: Path, ctx: BuildContext) -> None:
    (tmp_path / "s3").mkdir()
    with pytest.raises(DataError, match="no rooms found"):
        build(tmp_path / "s3", ctx)


def test_splits(root: Path, ctx: BuildContext) -> None:
    task = build(root, ctx, val_fraction=0.34)
    rooms = task.describe()["rooms"]
    assert rooms == {"train": 2, "val": 1, "test": 2}
    test_names = [task.dataset("test").source.name(i) for i in range(2)]
    assert test_names == ["Area_5_hallway_6", "Area_5_office_3"]
    by_area = build(root, ctx, val_area=2)
    assert [r["room"] for r in by_area.dataset("val").source.records] == ["hallway_1"]
    with pytest.raises(ConfigError, match="val_area: 5 is the test area"):
        build(root, ctx, val_area=5)
    with pytest.raises(ConfigError, match=r"data.test_area: Area_3 has no rooms .*areas found: 1, 2, 5.*or null"):
        build(root, ctx, test_area=3)
    with pytest.raises(ConfigError, match=r"data.val_area: Area_4 has no rooms"):
        build(root, ctx, val_area=4)


def test_only_some_areas(root: Path, ctx: BuildContext) -> None:
    """A copy holding one area trains with test_area=null (today: 'no rooms in test area 5')."""
    import shutil

    for area in ("Area_2", "Area_5"):
        shutil.rmtree(root / area)
    with pytest.raises(ConfigError, match=r"Area_5 has no rooms .*\(areas found: 1\)"):
        build(root, ctx)  # the default test area 5 is absent: say which areas exist
    task = build(root, ctx, test_area=None, val_fraction=0.5)
    assert task.describe()["rooms"] == {"train": 1, "val": 1, "test": 0}
    assert task.describe()["test"] == "none (data.test_area: null)"
    assert len(task.dataset("train")) == 1 and len(task.dataset("test")) == 0


def test_training_crops(root: Path, ctx: BuildContext) -> None:
    task = build(root, ctx, crop_points=64, loop=3, grid_size=0.02, val_fraction=0.0)
    train = task.dataset("train")
    assert len(train) == 3 * 3
    a = train[0]
    train.set_epoch(1)  # training draws are decided by (seed, epoch, item)
    b = train[0]
    for s in (a, b):
        assert s["coord"].shape == (64, 3) and s["feat"].shape == (64, 6) and s["label"].shape == (64,)
        assert 0.0 <= s["feat"][:, 3:].min() and s["feat"][:, 3:].max() <= 1.0  # colour
    assert not np.array_equal(a["coord"], b["coord"])  # a new crop each epoch
    box = build(root, ctx, crop="box", box_size=0.5, crop_points=40, train_transforms=[]).dataset("train")[1]
    assert box["coord"].shape == (40, 3)
    assert np.ptp(box["coord"][:, 0]) <= 0.5 + 1e-5 and np.ptp(box["coord"][:, 1]) <= 0.5 + 1e-5
    whole = build(root, ctx, crop="none", grid_size=None, train_transforms=[]).dataset("train")[0]
    assert whole["coord"].shape == (ROOM_POINTS, 3)
    counts = dict(zip(*np.unique(whole["label"], return_counts=True)))
    # ceiling 20, floor 60, wall 50, chair 30, clutter 10 (the stairs file)
    assert {int(k): int(v) for k, v in counts.items()} == {0: 20, 1: 60, 2: 50, 8: 30, 12: 10}
    assert whole["coord"][:, 2].min() >= 0.0  # z from the room's lowest point


def test_full_resolution_evaluation(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    task = build(root, ctx, grid_size=0.05, eval_max_points=60)
    test = task.dataset("test")
    assert len(test) > 2  # rooms split into parts of <= 60 points
    assert all(len(test[i]["coord"]) <= 60 for i in range(len(test)))
    score = label_scorer(task.info.class_names, task.ignore_index)
    facts = task.export_predictions(oracle, tmp_path / "pred", batch_size=2, export=None, score=score)
    full = facts["full_resolution"]
    assert full["points"] == 2 * ROOM_POINTS + 1 - 1  # every original point of Area 5 (one bad line dropped)
    assert full["scenes"] == 2 and full["oa"] > 0.97
    assert set(full["per_class"]) == set(S3DIS_CLASSES)
    assert full["per_class"]["sofa"]["iou"] is None  # absent from targets and predictions
    pred = np.load(tmp_path / "pred" / "Area_5_office_3_pred.npy")
    assert pred.shape == (ROOM_POINTS,)
    from sciformer.data.pointcloud.io import read_point_file

    ply = read_point_file(tmp_path / "pred" / "Area_5_office_3.ply")
    assert ply["coord"].shape == (ROOM_POINTS, 3) and "pred" in ply and "colour" in ply
    no_ply = task.export_predictions(oracle, tmp_path / "pred2", batch_size=8, export={"ply": False}, score=score)
    assert no_ply["full_resolution"]["points"] == full["points"]
    assert not list((tmp_path / "pred2").glob("*.ply"))


def test_eval_transforms_must_keep_points() -> None:
    with pytest.raises(ValidationError, match="drops or reorders points"):
        S3DISConfig(eval_transforms=[{"name": "shuffle_points"}])
    assert S3DISConfig(eval_transforms=[{"name": "random_rotate"}]).eval_transforms


def test_predictor_on_room_text_file(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    from sciformer.data.pointcloud.io import read_point_file
    from sciformer.data.pointcloud.s3dis import predict_s3dis_file

    assert DATASETS._entries["s3dis"].predictor is predict_s3dis_file
    cfg = S3DISConfig(root=str(root), eval_max_points=50)
    state = build(root, ctx, eval_max_points=50).state()
    seen: list[int] = []

    def chair_everywhere(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        assert batch["feat"].shape[1] == 6 and "target" not in batch  # room files carry no labels
        seen.append(len(batch["offset"]))
        logits = torch.zeros(len(batch["coord"]), 13)
        logits[:, 8] = 1.0
        return logits

    room_file = root / "Area_1" / "office_1" / "office_1.txt"
    out = predict_s3dis_file(cfg, state, chair_everywhere, room_file, tmp_path / "office_1.ply", batch_size=2)
    ply = read_point_file(out)
    assert ply["coord"].shape == (ROOM_POINTS, 3) and set(ply["pred"].tolist()) == {8}
    np.testing.assert_allclose(ply["coord"], read_point_file(room_file)["coord"], atol=1e-6)  # original z
    assert sum(seen) > 2  # the room went through in parts


def test_full_rooms_and_checkpoint_state(root: Path, ctx: BuildContext, tmp_path: Path) -> None:
    task = build(root, ctx)
    assert task.scene_names("test") == ["Area_5_hallway_6", "Area_5_office_3"]
    room = task.scene("test", 1)
    assert room["coord"].shape == (ROOM_POINTS, 3) and room["label"].shape == (ROOM_POINTS,)
    with pytest.raises(DataError, match="not made of whole scenes"):
        task.scene("train", 0)
    torch.save(task.state(), tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded["class_names"] == S3DIS_CLASSES and loaded["grid_size"] == 0.04


def test_one_area_trains_from_the_command_line(root: Path, tmp_path: Path, capsys) -> None:
    """Only Area_1 present: test_area=null trains and validates; an empty test split stops before training."""
    import shutil

    from sciformer.cli import main

    for area in ("Area_2", "Area_5"):
        shutil.rmtree(root / area)
    experiment = Path(__file__).resolve().parents[3] / "experiments" / "s3dis_area5.yaml"
    args = ["train", "-c", str(experiment), f"data.root={root}", "data.crop_points=100", "train.grad_clip=1.0", "data.loop=2", "train.threads=1", "data.test_area=null",
            "data.val_fraction=0.5", "train.epochs=1", "train.batch_size=2", "train.device=cpu", "train.progress=never",
            "model.channels=[8,16,32,64,128]", "optimizer.lr=0.01"]
    assert main([*args[:3], "-o", str(tmp_path / "a"), *args[3:]]) == 2
    err = capsys.readouterr().err
    assert "the test split is empty" in err and err.count("\n") == 1 and not (tmp_path / "a").exists()
    assert main([*args[:3], "-o", str(tmp_path / "b"), *args[3:], "evaluation.split=val"]) == 0
    capsys.readouterr()
    assert main([*args[:3], "-o", str(tmp_path / "c"), *args[3:], "data.test_area=5"]) == 2
    assert "data.test_area: Area_5 has no rooms" in capsys.readouterr().err


def test_an_edited_room_is_prepared_again(root: Path, tmp_path: Path) -> None:
    """Renaming an object file to another class (a label fix) or mending a malformed line after a
    first build: the next build reads the files as they are now, not the earlier conversion."""
    from sciformer.data.pointcloud.s3dis import load_room, prepare_s3dis

    def hallway_labels() -> np.ndarray:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            records = prepare_s3dis(root, tmp_path / "cache", "skip")
        parsed.append(len(seen))  # hallway_6's malformed line warns each time the room is parsed
        folder = next(r["folder"] for r in records if r["room"] == "hallway_6")
        return np.bincount(load_room(folder)["label"], minlength=13)

    parsed: list[int] = []
    before = hallway_labels()
    assert hallway_labels().tolist() == before.tolist() and parsed == [1, 0]  # unchanged: read from the cache
    room = root / "Area_5" / "hallway_6" / "Annotations"
    chair, table = S3DIS_CLASSES.index("chair"), S3DIS_CLASSES.index("table")
    assert before[chair] > 0 and before[table] == 0
    for i, path in enumerate(sorted(room.glob("chair_*.txt"))):
        path.rename(room / f"table_{i + 7}.txt")
    after = hallway_labels()
    assert parsed[-1] == 1  # parsed again
    assert after[table] == before[chair] and after[chair] == 0 and after.sum() == before.sum()
    (room / "ceiling_1.txt").write_text((room / "ceiling_1.txt").read_text().replace("\x10", ""))  # the stray character removed
    assert hallway_labels().sum() == after.sum() + 1 and parsed[-1] == 0  # the mended line is read
