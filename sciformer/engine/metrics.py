"""Classification and segmentation metrics from one confusion matrix: the one home of every score.

All scores derive from the confusion matrix ``cm[true, pred]`` accumulated over a
split, so they are exact (not averaged over batches) and reducible across
processes by summation:

- ``oa``: overall accuracy, trace / total.
- ``aa`` (= ``macc``): mean per-class recall over classes present in the targets.
- ``kappa``: Cohen's kappa, (p_o - p_e) / (1 - p_e); 1.0 where p_e = 1 (every target and every
  prediction in one class, so p_o = 1 too), where scikit-learn's ``cohen_kappa_score`` gives NaN (0 / 0).
- ``miou``: :data:`MIOU_RULE`. IoU_c = cm[c, c] / (row_c + col_c - cm[c, c]); the mean
  runs over the classes that occur in the targets or the predictions, so a class
  absent from both is left out, while a class predicted but absent from the targets
  counts with IoU 0. This equals torchmetrics'
  ``MulticlassJaccardIndex(num_classes, average="macro", ignore_index=...)``. Pointcept
  averages over every class (an absent class counts 0), which is the same number
  whenever every class occurs in the targets or the predictions (S3DIS Area 5).

Whole-scene (every original point) scores use the same rule through :func:`label_scorer`.

Part segmentation (a task whose :class:`~sciformer.contracts.DataInfo` declares
``category_parts``, e.g. ShapeNetPart): :class:`PartIoU` predicts each shape among its
category's parts only and adds :data:`PART_MIOU_RULE`'s ``instance_miou`` (mean over
shapes) and ``category_miou`` (mean over categories); the confusion matrix then holds
those restricted predictions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from sciformer.contracts import METRIC_NAMES, PART_METRIC_NAMES, Batch, DataInfo, ScoreFn
from sciformer.errors import ConfigError, SciformerError

__all__ = ["METRIC_NAMES", "MIOU_RULE", "PART_MIOU_RULE", "ConfusionMatrix", "PartIoU", "Scores", "check_monitor", "finite_or_none", "format_table",
           "label_scorer", "scores_from_confusion", "scores_to_dict"]

MIOU_RULE = ("mean over classes of IoU = tp / (tp + fp + fn), classes absent from both targets and predictions excluded "
             "(= torchmetrics MulticlassJaccardIndex average='macro')")
PART_MIOU_RULE = ("each shape predicted among its category's parts only; shape IoU = mean over the category's parts "
                  "(a part absent from both prediction and truth counts 1); instance_miou = mean over shapes with a scored point, "
                  "category_miou = mean over categories of their shapes' mean (the ShapeNetPart protocol)")


class ConfusionMatrix:
    """Accumulates a (C, C) confusion matrix ``cm[true, pred]``, ignoring ``ignore_index``.

    With ``parts`` (part segmentation) the split's per-shape IoUs travel with it:
    :meth:`sums` lists every tensor to add over processes, :meth:`compute` scores both.
    """

    def __init__(self, num_classes: int, ignore_index: int = -1, parts: PartIoU | None = None) -> None:
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)
        self.parts = parts

    def sums(self) -> list[torch.Tensor]:
        """The accumulated tensors, each reducible over processes by summation (in place)."""
        return [self.matrix] + ([self.parts.totals] if self.parts is not None else [])

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """Add predictions.

        Shapes:
            pred: (n,) int class ids; target: (n,) int class ids or ``ignore_index``.
        """
        pred = pred.reshape(-1).to("cpu", torch.int64)  # (n,)
        target = target.reshape(-1).to("cpu", torch.int64)  # (n,)
        if pred.shape != target.shape:
            raise ValueError(f"{pred.numel()} predictions for {target.numel()} targets")
        keep = target != self.ignore_index
        pred, target = pred[keep], target[keep]
        if target.numel() and (target.min() < 0 or target.max() >= self.num_classes):
            raise ValueError(f"targets must lie in [0, {self.num_classes}), got range [{int(target.min())}, {int(target.max())}]")
        if pred.numel() and (pred.min() < 0 or pred.max() >= self.num_classes):  # would count in another cell, or past the matrix
            raise ValueError(f"predictions must lie in [0, {self.num_classes}), got range [{int(pred.min())}, {int(pred.max())}]")
        flat = target * self.num_classes + pred  # (n,)
        self.matrix += torch.bincount(flat, minlength=self.num_classes**2).reshape(self.num_classes, self.num_classes)

    def compute(self) -> Scores:
        scores = scores_from_confusion(self.matrix.numpy())
        return replace(scores, **self.parts.compute()) if self.parts is not None else scores


@dataclass
class Scores:
    """Scores of one split; per-class arrays are indexed by class id (NaN where undefined)."""

    oa: float
    aa: float
    kappa: float
    miou: float
    per_class_acc: np.ndarray  # (C,)
    per_class_iou: np.ndarray  # (C,)
    support: np.ndarray  # (C,) number of true samples per class
    confusion: np.ndarray  # (C, C)
    # part segmentation only (PART_MIOU_RULE); per_category is None for every other task
    instance_miou: float = math.nan
    category_miou: float = math.nan
    per_category: dict[str, float] | None = None  # category name -> mean shape IoU (categories with shapes)
    shapes: int = 0

    @property
    def macc(self) -> float:
        return self.aa

    def summary(self) -> dict[str, float]:
        """The split's headline scores (``val_<name>`` columns of ``metrics.csv``)."""
        out = {"oa": self.oa, "aa": self.aa, "kappa": self.kappa, "miou": self.miou}
        if self.per_category is not None:
            out.update(instance_miou=self.instance_miou, category_miou=self.category_miou)
        return out


def scores_from_confusion(cm: np.ndarray) -> Scores:
    """Compute every score from ``cm[true, pred]`` (C, C)."""
    cm = np.asarray(cm, dtype=np.float64)  # (C, C)
    total = cm.sum()
    true_count = cm.sum(axis=1)  # (C,)
    pred_count = cm.sum(axis=0)  # (C,)
    tp = np.diag(cm)  # (C,)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class_acc = np.where(true_count > 0, tp / true_count, np.nan)
        union = true_count + pred_count - tp
        per_class_iou = np.where(union > 0, tp / union, np.nan)
    if total == 0:
        return Scores(float("nan"), float("nan"), float("nan"), float("nan"), per_class_acc, per_class_iou, true_count.astype(np.int64), cm.astype(np.int64))
    oa = float(tp.sum() / total)
    expected = float((true_count * pred_count).sum() / total**2)
    kappa = float((oa - expected) / (1.0 - expected)) if expected < 1.0 else 1.0
    aa = float(np.nanmean(per_class_acc)) if np.any(true_count > 0) else float("nan")
    miou = float(np.nanmean(per_class_iou)) if np.any(union > 0) else float("nan")
    return Scores(oa, aa, kappa, miou, per_class_acc, per_class_iou, true_count.astype(np.int64), cm.astype(np.int64))


def finite_or_none(x: float) -> float | None:
    """``x`` as a float, None when NaN or infinite (JSON has no NaN)."""
    return float(x) if np.isfinite(float(x)) else None


def scores_to_dict(scores: Scores, class_names: Sequence[str]) -> dict[str, Any]:
    """JSON-ready scores with per-class entries keyed by class name (None where undefined)."""
    per_class = {
        name: {"accuracy": finite_or_none(scores.per_class_acc[i]), "iou": finite_or_none(scores.per_class_iou[i]), "support": int(scores.support[i])}
        for i, name in enumerate(class_names)
    }
    out: dict[str, Any] = {
        "oa": finite_or_none(scores.oa),
        "aa": finite_or_none(scores.aa),
        "macc": finite_or_none(scores.aa),
        "kappa": finite_or_none(scores.kappa),
        "miou": finite_or_none(scores.miou),
    }
    if scores.per_category is not None:
        out.update(instance_miou=finite_or_none(scores.instance_miou), category_miou=finite_or_none(scores.category_miou),
                   per_category={k: finite_or_none(v) for k, v in scores.per_category.items()}, shapes=scores.shapes,
                   part_miou_rule=PART_MIOU_RULE)
    return {**out, "per_class": per_class}


def label_scorer(class_names: Sequence[str], ignore_index: int = -1) -> ScoreFn:
    """A :data:`~sciformer.contracts.ScoreFn`: (target, pred) label arrays -> :func:`scores_to_dict` + ``points``.

    The data layer predicts whole scenes and yields per-point labels; this scores them
    with the same confusion matrix and rule as every other evaluation.

    Shapes: each pair is target (n,), pred (n,) int class ids (targets may be ``ignore_index``).
    """
    names = list(class_names)

    def score(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        confusion = ConfusionMatrix(len(names), ignore_index)
        for target, pred in pairs:
            confusion.update(torch.as_tensor(np.asarray(pred)), torch.as_tensor(np.asarray(target)))
        return {**scores_to_dict(confusion.compute(), names), "points": int(confusion.matrix.sum())}

    return score


class PartIoU:
    """Part segmentation: predicts each shape among its category's parts and accumulates shape IoUs.

    ``totals[k]`` holds (sum of shape IoUs, shapes) of category k, so processes add up
    exactly. Batches carry the point-cloud layout: ``category`` (B,) category indices and
    ``offset`` (B,) cumulative point counts. The rule is :data:`PART_MIOU_RULE`.
    """

    def __init__(self, category_names: Sequence[str], category_parts: Mapping[str, Sequence[int]], num_classes: int, ignore_index: int = -1) -> None:
        self.names = [str(n) for n in category_names]
        self.ignore_index = ignore_index
        self.mask = torch.zeros(len(self.names), num_classes, dtype=torch.bool)  # (K, C) parts of each category
        for k, name in enumerate(self.names):
            ids = [int(p) for p in category_parts.get(name, [])]
            if not ids or min(ids) < 0 or max(ids) >= num_classes:
                raise SciformerError(f"DataInfo.category_parts['{name}']: expected a non-empty list of class ids in [0, {num_classes}), got {ids}")
            self.mask[k, ids] = True
        self.totals = torch.zeros(len(self.names), 2, dtype=torch.float64)  # (K, 2)

    @classmethod
    def of(cls, info: DataInfo, ignore_index: int = -1) -> PartIoU | None:
        """The accumulator of a task whose ``info`` declares ``category_parts``; None for any other task."""
        if info.category_parts is None:
            return None
        return cls(info.category_names or list(info.category_parts), info.category_parts, info.num_classes, ignore_index)

    def update(self, logits: torch.Tensor, target: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Arg-max over each shape's category parts, and add the shapes' IoUs; returns the predictions.

        Shapes: logits (n, C), target (n,), batch ``category`` (B,), ``offset`` (B,) -> (n,) class ids.
        """
        if "category" not in batch or "offset" not in batch:
            raise SciformerError("part segmentation: each batch must carry 'category' (B,) and 'offset' (B,) to score shapes among their category's parts")
        n, c = logits.shape
        category = torch.as_tensor(batch["category"]).reshape(-1).to(logits.device, torch.int64)  # (B,)
        offset = torch.as_tensor(batch["offset"]).reshape(-1).to(logits.device, torch.int64)  # (B,)
        sizes = torch.diff(offset, prepend=offset.new_zeros(1))  # (B,)
        if category.numel() != offset.numel() or int(sizes.sum()) != n or bool((sizes < 0).any()) or target.numel() != n:
            raise SciformerError(f"part segmentation: a batch of {category.numel()} categories, offsets {offset.tolist()[:8]}, "
                                 f"{n} predictions and {target.numel()} targets do not match")
        if category.numel() and (int(category.min()) < 0 or int(category.max()) >= len(self.names)):
            raise SciformerError(f"part segmentation: category index {int(category.max())} outside the {len(self.names)} categories")
        b = category.numel()
        mask = self.mask.to(logits.device)[category]  # (B, C)
        shape = torch.repeat_interleave(torch.arange(b, device=logits.device), sizes)  # (n,)
        pred = logits.masked_fill(~mask[shape], float("-inf")).argmax(dim=1)  # (n,)
        keep = target != self.ignore_index
        s, p, t = shape[keep], pred[keep], target[keep].to(torch.int64)  # (m,)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= c):
            raise SciformerError(f"part segmentation: targets must lie in [0, {c}), got range [{int(t.min())}, {int(t.max())}]")
        inter = torch.bincount((s * c + t)[p == t], minlength=b * c).reshape(b, c)  # (B, C)
        union = (torch.bincount(s * c + p, minlength=b * c) + torch.bincount(s * c + t, minlength=b * c)).reshape(b, c) - inter  # (B, C)
        iou = torch.where(union > 0, inter.double() / union.clamp_min(1).double(), 1.0)  # (B, C) absent from both: 1
        shape_iou = (iou * mask).sum(dim=1) / mask.sum(dim=1)  # (B,)
        scored = torch.bincount(s, minlength=b) > 0  # (B,) a shape without a scored point (none, or all ignored) is not counted
        self.totals.index_add_(0, category[scored].cpu(), torch.stack([shape_iou[scored].cpu(), torch.ones(int(scored.sum()), dtype=torch.float64)], dim=1))
        return pred

    def compute(self) -> dict[str, Any]:
        """``instance_miou``, ``category_miou``, ``per_category`` and ``shapes`` (NaN without shapes)."""
        sums, counts = self.totals[:, 0], self.totals[:, 1]  # (K,)
        per = {name: float(sums[k] / counts[k]) for k, name in enumerate(self.names) if counts[k] > 0}
        total = float(counts.sum())
        return {"instance_miou": float(sums.sum()) / total if total else math.nan, "category_miou": float(np.mean(list(per.values()))) if per else math.nan,
                "per_category": per, "shapes": int(total)}


def check_monitor(monitor: str, info: DataInfo) -> None:
    """Refuse a ``train.monitor`` the task cannot score (the part metrics need ``category_parts``)."""
    if monitor in PART_METRIC_NAMES and info.category_parts is None:
        raise ConfigError(f"train.monitor: '{monitor}' needs a part-segmentation dataset (one whose DataInfo declares category_parts, "
                          "e.g. shapenetpart); use miou, oa, aa, kappa or loss")


NO_SCORED_POINTS = ("no scored points: every label of this split is ignored (the ignore label, or data.unmapped: ignore), "
                    "so there are no scores (null in metrics.json)")


def percent(value: float | None, width: int = 6) -> str:
    """``100 * value`` with two decimals, or ``-`` for a score that does not exist (None, NaN: nothing scored)."""
    return f"{100 * value:{width}.2f}" if value is not None and np.isfinite(value) else f"{'-':>{width}}"


def format_table(scores: Scores, class_names: list[str], title: str = "") -> str:
    """A plain-text table: summary line, then per-class accuracy / IoU / support."""
    width = max([len(n) for n in class_names] + [5])
    lines = []
    if title:
        lines.append(title)
    if int(np.asarray(scores.support).sum()) == 0:
        lines.append(NO_SCORED_POINTS)
    else:
        lines.append(f"OA {percent(scores.oa)}   AA/mAcc {percent(scores.aa)}   kappa {percent(scores.kappa)}   mIoU {percent(scores.miou)}")
    if scores.per_category is not None:
        lines.append(f"instance mIoU {percent(scores.instance_miou)}   category mIoU {percent(scores.category_miou)}   "
                     f"({scores.shapes} shapes, parts of each shape's category)")
    lines.append(f"{'class':<{width}}  {'acc %':>7}  {'IoU %':>7}  {'support':>8}")
    for i, name in enumerate(class_names):
        acc = scores.per_class_acc[i]
        iou = scores.per_class_iou[i]
        lines.append(f"{name:<{width}}  {percent(acc, 7)}  {percent(iou, 7)}  {int(scores.support[i]):>8}")
    return "\n".join(lines)
