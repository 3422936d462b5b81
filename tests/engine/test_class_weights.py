"""train.class_weights: the loss against a hand-written weighted cross-entropy, the counts of
the tasks that provide them, and one-line errors where weights cannot be formed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from sciformer.cli import main
from sciformer.config import TrainConfig
from sciformer.contracts import BuildContext, DataInfo
from sciformer.data.pointcloud.point_scenes import PointScenesConfig, build_point_scenes
from sciformer.engine.builders import build_loss
from sciformer.errors import ConfigError


def fake_task(counts: list[int] | None, num_classes: int = 4) -> SimpleNamespace:
    info = DataInfo(num_classes, [f"c{k}" for k in range(num_classes)], 3)
    return SimpleNamespace(info=info, ignore_index=-1, class_counts=lambda: counts)


def weighted_ce_oracle(logits: np.ndarray, target: np.ndarray, weight: np.ndarray) -> float:
    """sum_i w_{y_i} (-log softmax(x_i)_{y_i}) / sum_i w_{y_i} over labelled rows (numpy)."""
    keep = target >= 0
    x, y = logits[keep].astype(np.float64), target[keep]
    shifted = x - x.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    w = weight[y]
    return float((w * -logp[np.arange(len(y)), y]).sum() / w.sum())


def test_inverse_sqrt_weights_and_loss_against_oracle() -> None:
    counts = [900, 90, 0, 10]
    loss = build_loss(TrainConfig(class_weights="inverse_sqrt"), fake_task(counts))
    n = np.array(counts, dtype=np.float64)
    assert loss.weight is not None
    w = loss.weight.numpy().astype(np.float64)
    assert w[2] == 0.0  # a class without training labels
    assert w[3] / w[0] == pytest.approx(np.sqrt(900 / 10), rel=1e-6)  # 1 / sqrt(frequency)
    assert w[1] / w[0] == pytest.approx(np.sqrt(900 / 90), rel=1e-6)
    assert (w * n).sum() == pytest.approx(n.sum(), rel=1e-6)  # the average training label weighs 1

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 4)).astype(np.float32)
    target = rng.choice([-1, 0, 1, 3], size=50)
    got = float(loss(torch.from_numpy(logits), torch.from_numpy(target)))
    assert got == pytest.approx(weighted_ce_oracle(logits, target, w), rel=1e-5)


def test_explicit_weights_none_and_errors() -> None:
    loss = build_loss(TrainConfig(class_weights=[1.0, 2.0, 0.5, 4.0]), fake_task(None))
    np.testing.assert_array_equal(loss.weight.numpy(), [1.0, 2.0, 0.5, 4.0])
    assert build_loss(TrainConfig(), fake_task(None)).weight is None  # the default: unweighted
    with pytest.raises(ConfigError, match="3 weights for 4 classes"):
        build_loss(TrainConfig(class_weights=[1.0, 2.0, 3.0]), fake_task(None))
    with pytest.raises(ConfigError, match="every weight is 0"):
        build_loss(TrainConfig(class_weights=[0.0, 0.0, 0.0, 0.0]), fake_task(None))
    with pytest.raises(ConfigError, match="does not provide"):
        build_loss(TrainConfig(class_weights="inverse_sqrt"), fake_task(None))
    with pytest.raises(ConfigError, match="no labelled target"):
        build_loss(TrainConfig(class_weights="inverse_sqrt"), fake_task([0, 0, 0, 0]))
    for bad in ("balanced", [1.0, -1.0], [float("nan")], [1e9]):
        with pytest.raises(ValidationError):
            TrainConfig(class_weights=bad)


def test_scene_task_counts_every_training_point(tmp_path: Path) -> None:
    """point_scenes: counts over every point of the whole training files (oracle: bincount of the
    label files), validation files left out, ignored labels left out."""
    rng = np.random.default_rng(1)
    labels = {}
    for name in ("a", "b", "v"):
        coord = rng.uniform(0, 10, size=(300, 3))
        labels[name] = rng.integers(0, 4, size=300)  # 3 = unmapped -> ignored
        np.save(tmp_path / f"{name}.npy", np.column_stack([coord, labels[name]]))
    cfg = PointScenesConfig(root=str(tmp_path), train_files=["a.npy", "b.npy"], val_files=["v.npy"],
                            classes=["x", "y", "z"], columns=["x", "y", "z", "label"])
    task = build_point_scenes(cfg, BuildContext(base_dir=tmp_path, seed=0))
    both = np.concatenate([labels["a"], labels["b"]])
    assert task.class_counts() == np.bincount(both[both < 3], minlength=3).tolist()


def test_hsi_counts_and_a_weighted_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """hsi_scene: counts equal the training dataset's targets; a run with inverse_sqrt finishes."""
    from sciformer.data.hsi.task import HSISceneConfig, build_hsi_scene

    task = build_hsi_scene(HSISceneConfig(split={"kind": "stratified", "train_per_class": 0.05}),
                           BuildContext(base_dir=tmp_path, seed=0))
    targets = task.dataset("train").targets.numpy()
    assert task.class_counts() == np.bincount(targets, minlength=task.info.num_classes).tolist()

    exp = tmp_path / "toy.yaml"
    exp.write_text("name: toy\ndata: {name: toy_blobs, num_classes: 3}\nmodel: {name: toy_mlp, hidden: 8}\n"
                   "train: {epochs: 1, batch_size: 16, progress: never, class_weights: [1.0, 2.0, 3.0]}\n")
    assert main(["train", "-c", str(exp), "-o", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert main(["train", "-c", str(exp), "-o", str(tmp_path / "run2"), "train.class_weights=inverse_sqrt"]) == 2
    assert "inverse_sqrt needs training label counts" in capsys.readouterr().err
