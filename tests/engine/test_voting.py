"""Test-time voting: probability averaging, the voting view of point datasets, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from sciformer.cli import main
from sciformer.contracts import BuildContext
from sciformer.data.pointcloud.modelnet import ModelNetConfig, build_modelnet
from sciformer.data.pointcloud.sample import collate_points
from sciformer.engine.loops import merge_votes
from sciformer.errors import ConfigError
from tests.data.pointcloud.conftest import write_modelnet_h5

CLASSES = ["bathtub", "bed", "chair"]


def test_merge_votes_averages_probabilities() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 4)  # 2 samples x 3 votes
    target = torch.tensor([1, 1, 1, 3, 3, 3])
    merged, merged_target = merge_votes(logits, target, 3)
    expected = torch.stack([torch.softmax(logits[i * 3:(i + 1) * 3], dim=1).mean(dim=0) for i in range(2)])  # (2, 4)
    torch.testing.assert_close(merged.exp(), expected)
    assert merged_target.tolist() == [1, 3]
    # log mean probabilities are valid logits: cross-entropy equals -log of the mean probability
    loss = torch.nn.functional.cross_entropy(merged, merged_target, reduction="none")
    torch.testing.assert_close(loss, -expected[[0, 1], [1, 3]].log())


def test_merge_votes_rejects_ragged_or_mixed_groups() -> None:
    with pytest.raises(ValueError, match="whole groups of 3"):
        merge_votes(torch.zeros(5, 2), torch.zeros(5, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="different targets"):
        merge_votes(torch.zeros(4, 2), torch.tensor([0, 1, 1, 1]), 2)


def _task(tmp_path: Path, **overrides):
    root = write_modelnet_h5(tmp_path / "mn", CLASSES, per_class=(6, 2), points=64)
    cfg = ModelNetConfig(root=str(root), num_points=64, val_fraction=0.2, features=["coord"], **overrides)
    return build_modelnet(cfg, BuildContext(base_dir=tmp_path, cache_dir=tmp_path / "cache", seed=0))


def test_voting_view_draws_distinct_reproducible_copies(tmp_path: Path) -> None:
    task = _task(tmp_path, vote_transforms=[{"name": "random_sample", "n": 32}, {"name": "random_scale", "scale": [0.5, 2.0]}])
    view = task.voting_dataset("test", 4)
    assert len(view) == len(task.dataset("test"))
    copies = view[1]
    assert len(copies) == 4 and all(c["coord"].shape == (32, 3) for c in copies)
    assert not np.allclose(copies[0]["coord"], copies[1]["coord"])  # each vote its own draw
    assert all(int(c["label"]) == int(task.dataset("test")[1]["label"]) for c in copies)
    again = task.voting_dataset("test", 4)[1]
    for a, b in zip(copies, again, strict=True):
        np.testing.assert_array_equal(a["coord"], b["coord"])  # seeded by (seed, item, vote)
    batch = task.collate([view[0], view[1]])
    assert batch["votes"] == 4 and batch["offset"].tolist() == [32 * i for i in range(1, 9)]
    assert batch["target"].tolist()[:4] == [int(task.dataset("test")[0]["label"])] * 4  # copies adjacent
    with pytest.raises(IndexError):
        view[len(view)]


def test_voting_defaults_to_training_transforms(tmp_path: Path) -> None:
    task = _task(tmp_path, train_transforms=[{"name": "random_sample", "n": 16}])
    assert task.voting_dataset("test", 2)[0][0]["coord"].shape == (16, 3)
    assert "RandomSample" in task.describe()["vote_transforms"]


def test_segmentation_and_hyperspectral_tasks_refuse_votes(tmp_path: Path) -> None:
    from sciformer.data.pointcloud.dataset import PointTask

    plain = PointTask(_task(tmp_path).info, {"test": lambda: None})
    with pytest.raises(ConfigError) as e:
        plain.voting_dataset("test", 3)
    assert "evaluation.votes=3" in str(e.value) and "\n" not in str(e.value)


def test_identical_votes_score_like_a_single_pass(tmp_path: Path) -> None:
    """With a deterministic vote transform every copy is the same: voting must not change the result."""
    task = _task(tmp_path, vote_transforms=[{"name": "fixed_points", "n": 64}])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))

    def predict(batch):
        per_point = model(batch["coord"])  # (N, 3)
        ends = batch["offset"].tolist()
        return torch.stack([per_point[s:e].mean(0) for s, e in zip([0] + ends[:-1], ends, strict=True)])  # (B, 3)

    single = predict(collate_points([task.dataset("test")[i] for i in range(6)]))
    voted = task.collate([task.voting_dataset("test", 3)[i] for i in range(6)])
    merged, target = merge_votes(predict(voted), voted["target"], voted["votes"])
    torch.testing.assert_close(merged.exp(), torch.softmax(single, dim=1))


def _write_config(tmp_path: Path, votes: int) -> Path:
    root = write_modelnet_h5(tmp_path / "mn", CLASSES, per_class=(8, 3), points=48)
    cfg = {
        "name": "mn_votes",
        "data": {"name": "modelnet", "root": str(root), "num_points": 48, "features": [], "val_fraction": 0.25,
                 "vote_transforms": [{"name": "random_sample", "n": 32}]},
        "model": {"name": "point_transformer_cls", "channels": [8, 16], "blocks": [0, 1], "strides": [1, 4], "k": 4,
                  "head_hidden": [16]},
        "train": {"epochs": 1, "batch_size": 6, "progress": "never"},
        "evaluation": {"batch_size": 4, "votes": votes},
    }
    path = tmp_path / "mn.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_and_evaluate_with_votes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(_write_config(tmp_path, 3)), "-o", str(run)]) == 0
    assert "test results (mn_votes, 3 votes)" in capsys.readouterr().out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["votes"] == 3 and sum(c["support"] for c in metrics["per_class"].values()) == 9  # one vote per shape
    assert main(["evaluate", "--checkpoint", str(run), "--votes", "1", "-o", str(tmp_path / "ev")]) == 0
    evaluated = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert evaluated["votes"] == 1
    assert evaluated["checkpoint"].endswith("best.pt")  # a run folder means the model its metrics.json reports
    assert main(["evaluate", "--checkpoint", str(run), "--votes", "0"]) == 2
    assert "evaluation.votes" in capsys.readouterr().err
    shape = tmp_path / "shape.npy"
    np.save(shape, np.random.default_rng(0).normal(size=(60, 3)).astype(np.float32))
    predict = ["predict", "--checkpoint", str(run), "--input", str(shape)]
    assert main(predict + ["--output", str(tmp_path / "p.json"), "--votes", "4"]) == 0
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["class"] in CLASSES and sum(report["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    capsys.readouterr()
    assert main(predict + ["--output", str(tmp_path / "q.json"), "--tta-flip"]) == 2
    assert "--tta-flip does not apply to 'modelnet' predictions" in capsys.readouterr().err
    assert main(predict + ["--output", str(tmp_path / "q.json"), "--votes", "0"]) == 2
    assert "--votes must be between 1 and 100" in capsys.readouterr().err


def test_votes_on_a_task_without_voting_fail_before_training(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "evaluation.votes=4"]) == 2
    err = capsys.readouterr().err
    assert "evaluation.votes=4" in err and "Traceback" not in err
    assert not (run / "checkpoints" / "last.pt").exists()


def test_scene_test_views_are_refused_for_classification_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config_file = _write_config(tmp_path, 1)
    for override in ("evaluation.tta_rotations=4", "evaluation.tta_flip=true", "evaluation.overlap=0.25"):
        run = tmp_path / override.split("=")[0]
        assert main(["train", "-c", str(config_file), "-o", str(run), override]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "apply to whole-scene segmentation only" in err
        assert not (run / "checkpoints").exists()  # refused before the first epoch
    run = tmp_path / "run"
    assert main(["train", "-c", str(config_file), "-o", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev"), "evaluation.tta_rotations=2"]) == 2
    assert "apply to whole-scene segmentation only" in capsys.readouterr().err

