"""metrics.json of a whole-scene run: one mIoU rule, stated, and equal to torchmetrics on every point."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import write_s3dis
from torchmetrics.classification import MulticlassJaccardIndex

from sciformer import config
from sciformer.cli import main
from sciformer.engine import builders
from sciformer.engine.metrics import MIOU_RULE

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "s3dis_area5.yaml"


def test_full_resolution_scores_follow_the_one_rule(tmp_path: Path) -> None:
    root = write_s3dis(tmp_path / "s3dis", {1: ["office_1", "office_2"], 5: ["hallway_6", "office_3"]})
    overrides = [f"data.root={root}", "data.crop_points=100", "train.grad_clip=1.0", "data.loop=2", "data.val_fraction=0.5", "train.epochs=1",
                 "train.batch_size=2", "train.threads=1", "train.progress=never", "model.channels=[8,16,32,64,128]",
                 "export.ply=false", "export.png=false"]
    run = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fake's malformed line
        assert main(["train", "-c", str(EXPERIMENT), "-o", str(run), *overrides]) == 0
        task = builders.build_task(config.load(EXPERIMENT, overrides))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["miou_rule"] == MIOU_RULE
    full = metrics["full_resolution"]
    # no second mIoU under another name: only the split's and the full-resolution one, same keys
    assert sorted(k for k in metrics if "iou" in k) == ["miou", "miou_rule"] and "iou_per_class" not in full
    assert set(full) >= {"oa", "macc", "miou", "per_class", "points", "scenes"}
    # the oracle: torchmetrics' macro Jaccard over every original point of the test rooms
    labels, preds = [], []
    for i, name in enumerate(task.scene_names("test")):
        labels.append(np.asarray(task.scene("test", i)["label"]))
        preds.append(np.load(run / "predictions" / f"{name}_pred.npy"))
    target, pred = torch.from_numpy(np.concatenate(labels)), torch.from_numpy(np.concatenate(preds))
    assert full["points"] == int((target >= 0).sum()) and full["scenes"] == 2
    oracle = MulticlassJaccardIndex(len(task.info.class_names), average="macro", ignore_index=-1)(pred, target)
    assert full["miou"] == pytest.approx(float(oracle), abs=1e-6)
