"""Part segmentation scores: each shape predicted among its category's parts, instance and category mIoU.

The oracle is the ShapeNetPart protocol computed by hand (Qi et al. 2017's evaluation:
shape IoU = mean over the category's parts, a part absent from both prediction and truth
counting 1; instance mIoU = mean over shapes, category mIoU = mean over categories).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel, ConfigDict
from synthetic import write_shapenetpart
from torch import nn

from sciformer import config
from sciformer.contracts import DataInfo
from sciformer.data.pointcloud.shapenetpart import CATEGORY_NAMES, CATEGORY_PARTS, PART_NAMES
from sciformer.engine.checkpoint import load_checkpoint
from sciformer.engine.metrics import ConfusionMatrix, PartIoU, check_monitor
from sciformer.engine.trainer import Trainer
from sciformer.errors import ConfigError, SciformerError
from sciformer.registry import MODELS

AIRPLANE, BAG = CATEGORY_NAMES.index("Airplane"), CATEGORY_NAMES.index("Bag")  # parts 0..3 and 4, 5
INFO = DataInfo(50, list(PART_NAMES), 6, task="segmentation", category_names=list(CATEGORY_NAMES),
                category_parts={k: list(v) for k, v in CATEGORY_PARTS.items()})


def logits_for(preds: list[int], distractors: dict[int, int] | None = None) -> torch.Tensor:
    """(n, 50) logits whose arg-max among the category's parts is ``preds``; ``distractors``
    {point: class} put a higher logit on a part of another category."""
    logits = torch.zeros(len(preds), 50)
    logits[torch.arange(len(preds)), torch.tensor(preds)] = 2.0
    for point, cls in (distractors or {}).items():
        logits[point, cls] = 5.0
    return logits


def batch_of(categories: list[int], sizes: list[int]) -> dict[str, torch.Tensor]:
    return {"category": torch.tensor(categories), "offset": torch.tensor(np.cumsum(sizes))}


def test_part_iou_against_hand_computation() -> None:
    preds = [0, 1, 1, 1] + [2, 2, 3] + [4, 4]
    targets = [0, 0, 1, 1] + [2, 2, 2] + [4, 5]
    # shape 1 (Airplane): part0 1/2, part1 2/3, parts 2 and 3 absent from both -> 1 each
    a = (1 / 2 + 2 / 3 + 1 + 1) / 4
    # shape 2 (Airplane): part2 2/3, part3 0/1, parts 0 and 1 absent -> 1
    b = (2 / 3 + 0 + 1 + 1) / 4
    # shape 3 (Bag, parts 4 and 5): part4 1/2, part5 0/1
    c = (1 / 2 + 0) / 2
    parts = PartIoU.of(INFO)
    out = parts.update(logits_for(preds, {1: 49, 6: 40, 8: 0}), torch.tensor(targets), batch_of([AIRPLANE, AIRPLANE, BAG], [4, 3, 2]))
    assert out.tolist() == preds  # the Table, Pistol and Airplane logits lose to the category's own parts
    m = parts.compute()
    assert m["instance_miou"] == pytest.approx((a + b + c) / 3)
    assert m["category_miou"] == pytest.approx(((a + b) / 2 + c) / 2)
    assert m["per_category"] == pytest.approx({"Airplane": (a + b) / 2, "Bag": c})
    assert m["shapes"] == 3


def test_totals_add_over_batches_and_processes() -> None:
    """Two accumulators (two batches, or two ranks) summed equal one over everything."""
    preds, targets, cats, sizes = [0, 1, 1, 3, 2, 4, 5, 5], [0, 0, 1, 3, 3, 4, 4, 5], [AIRPLANE, AIRPLANE, BAG], [3, 2, 3]
    whole = PartIoU.of(INFO)
    whole.update(logits_for(preds), torch.tensor(targets), batch_of(cats, sizes))
    first, second = PartIoU.of(INFO), PartIoU.of(INFO)
    first.update(logits_for(preds[:3]), torch.tensor(targets[:3]), batch_of(cats[:1], sizes[:1]))
    second.update(logits_for(preds[3:]), torch.tensor(targets[3:]), batch_of(cats[1:], sizes[1:]))
    first.totals += second.totals
    torch.testing.assert_close(first.totals, whole.totals)
    assert first.compute()["per_category"] == pytest.approx(whole.compute()["per_category"])


def test_ignored_points_and_missing_fields() -> None:
    parts = PartIoU.of(INFO, ignore_index=-1)
    parts.update(logits_for([4, 5, 5]), torch.tensor([4, -1, 5]), batch_of([BAG], [3]))  # the ignored point's 5 does not count
    assert parts.compute()["instance_miou"] == pytest.approx(1.0)  # counted, part5 would be 1/2
    with pytest.raises(SciformerError, match="'category' \\(B,\\) and 'offset'"):
        parts.update(logits_for([4]), torch.tensor([4]), {"offset": torch.tensor([1])})
    with pytest.raises(SciformerError, match="do not match"):
        parts.update(logits_for([4, 4]), torch.tensor([4, 4]), batch_of([BAG], [3]))
    assert PartIoU.of(DataInfo(3, ["a", "b", "c"], 4)) is None  # no category_parts: no part scores


def test_confusion_matrix_carries_the_part_scores() -> None:
    confusion = ConfusionMatrix(50, parts=PartIoU.of(INFO))
    preds, targets = [4, 4, 5], [4, 5, 5]
    confusion.update(confusion.parts.update(logits_for(preds), torch.tensor(targets), batch_of([BAG], [3])), torch.tensor(targets))
    scores = confusion.compute()
    assert scores.instance_miou == pytest.approx((1 / 2 + 1 / 2) / 2) and scores.per_category == pytest.approx({"Bag": 0.5})
    assert len(confusion.sums()) == 2 and "instance_miou" in scores.summary()
    assert "instance_miou" not in ConfusionMatrix(3).compute().summary()


def test_monitor_needs_declared_parts(toy_config: Path, tmp_path: Path) -> None:
    check_monitor("instance_miou", INFO)
    with pytest.raises(ConfigError, match="train.monitor: 'instance_miou' needs a part-segmentation dataset"):
        check_monitor("instance_miou", DataInfo(3, ["a", "b", "c"], 4))
    exp = config.load(toy_config, ["train.monitor=category_miou"])
    with pytest.raises(ConfigError, match="'category_miou' needs a part-segmentation dataset"):
        Trainer(exp, tmp_path / "run", log=lambda *a, **k: None)


# --------------------------------------------------------------------------- a run


class ScriptedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptedParts(nn.Module):
    """Training: a per-point linear layer. Validation pass i (3 shapes): the logits ``SCRIPT[i]``."""

    script: list[torch.Tensor] = []  # noqa: RUF012 - set by the test
    seen: list[list[int]] = []  # noqa: RUF012 - the validation targets, in order

    def __init__(self, info: DataInfo) -> None:
        super().__init__()
        self.linear = nn.Linear(info.in_channels, info.num_classes)
        self.passes = 0

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.training or len(batch["offset"]) != 3:
            return self.linear(batch["feat"])  # (n, 50)
        ScriptedParts.seen.append(batch["target"].tolist())
        self.passes += 1
        return ScriptedParts.script[self.passes - 1]  # (n, 50)


if "scripted_parts" not in MODELS._entries:
    MODELS.register("scripted_parts", config=ScriptedConfig)(lambda cfg, info: ScriptedParts(info))

# validation shapes: two Airplanes and a Bag, four points each
VAL_TARGETS = [[0, 0, 1, 1], [2, 2, 2, 3], [4, 4, 5, 5]]


def _shapes(root: Path) -> Path:
    root = write_shapenetpart(root, {"Airplane": (2, 2, 1), "Bag": (2, 1, 1)}, points=4)
    val = json.loads((root / "train_test_split" / "shuffled_val_file_list.json").read_text())
    for entry, labels in zip(val, VAL_TARGETS, strict=True):
        path = root / "/".join(entry.split("/")[-2:])
        table = np.loadtxt(path.with_suffix(".txt"))
        table[:, 6] = labels
        np.savetxt(path.with_suffix(".txt"), table, fmt="%.6f")
    return root


def test_instance_miou_monitor_chooses_best(tmp_path: Path) -> None:
    """Acceptance (issue 15): the monitored value equals the hand-computed, category-restricted instance mIoU,
    and best.pt is the epoch it ranks first, not the epoch the per-part mIoU ranks first."""
    # epoch 1: every point the category's first part
    weak = logits_for([0, 0, 0, 0] + [0, 0, 0, 0] + [4, 4, 4, 4])
    # epoch 2: predictions among the parts [0,1,1,1] [2,3,3,3] [4,4,4,5]; four points' unrestricted arg-max
    # is another category's part (Table 49, Bag 4, Bag 5, Airplane 0), which the protocol never predicts
    hand = logits_for([0, 1, 1, 1] + [2, 3, 3, 3] + [4, 4, 4, 5], {1: 49, 3: 4, 5: 5, 10: 0})
    # airplane 1: part0 1/2, part1 2/3, parts 2, 3 absent from both -> 1 each: 19/24
    # airplane 2: part2 1/3, part3 1/3, parts 0, 1 absent -> 1 each: 16/24
    # bag: part4 2/3, part5 1/2: 14/24
    instance, category = (19 + 16 + 14) / 72, ((19 + 16) / 48 + 14 / 24) / 2
    # epoch 3: more points right (9 of 12, per-part mIoU higher) but each shape predicts a part it lacks
    more_points = logits_for([0, 0, 1, 3] + [2, 2, 2, 0] + [4, 4, 5, 4])
    ScriptedParts.script, ScriptedParts.seen = [weak, hand, more_points], []
    root = _shapes(tmp_path / "shapenetpart")
    raw = {"name": "parts", "data": {"name": "shapenetpart", "root": str(root), "num_points": 4},
           "model": {"name": "scripted_parts"}, "evaluation": {"batch_size": 8},
           "train": {"epochs": 3, "batch_size": 2, "monitor": "instance_miou", "threads": 1, "progress": "never"}}
    exp = config.validate(raw, base_dir=tmp_path, source="test")
    run = tmp_path / "run"
    result = Trainer(exp, run, log=lambda *a, **k: None).fit()
    assert ScriptedParts.seen == [sum(VAL_TARGETS, [])] * 3  # the validation points in the order scripted

    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert float(rows[1]["val_instance_miou"]) == pytest.approx(instance)
    assert float(rows[1]["val_category_miou"]) == pytest.approx(category)
    assert float(rows[0]["val_instance_miou"]) < instance and float(rows[2]["val_instance_miou"]) < instance
    assert float(rows[2]["val_miou"]) > float(rows[1]["val_miou"]) and float(rows[2]["val_oa"]) > float(rows[1]["val_oa"])
    assert result.best_epoch == 2
    best = load_checkpoint(run / "checkpoints" / "best.pt")["best"]
    assert (best["metric"], best["value"], best["epoch"]) == ("instance_miou", pytest.approx(instance), 2)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["monitor"] == "instance_miou" and metrics["best_val"] == pytest.approx(instance)
    assert set(metrics["per_category"]) == {"Airplane", "Bag"} and metrics["shapes"] == 2
    assert 0.0 <= metrics["instance_miou"] <= 1.0 and "part_miou_rule" in metrics


def test_shapes_without_a_scored_point_are_not_counted() -> None:
    """A shape with zero points, or with every point ignored, has no evidence: it is left out of
    the means (counting it as a perfect 1.0 would inflate both mIoUs)."""
    parts = PartIoU.of(INFO, ignore_index=-1)
    parts.update(logits_for([4, 4, 5]), torch.tensor([4, 5, 5]), batch_of([BAG, AIRPLANE], [3, 0]))
    parts.update(logits_for([0, 1]), torch.tensor([-1, -1]), batch_of([AIRPLANE], [2]))
    m = parts.compute()
    assert m["shapes"] == 1 and m["per_category"] == pytest.approx({"Bag": 0.5})  # the hand value of the Bag shape
    assert m["instance_miou"] == pytest.approx(0.5) and m["category_miou"] == pytest.approx(0.5)
    empty = PartIoU.of(INFO)
    empty.update(torch.zeros(0, 50), torch.zeros(0, dtype=torch.int64), batch_of([], []))
    assert empty.compute()["shapes"] == 0 and np.isnan(empty.compute()["instance_miou"])
