"""Classification and segmentation metrics from one confusion matrix: the one home of every score.

All scores derive from the confusion matrix ``cm[true, pred]`` accumulated over a
split, so they are exact (not averaged over batches) and reducible across
processes by summation:

- ``oa``: overall accuracy, trace / total.
- ``aa`` (= ``macc``): mean per-class recall over classes present in the targets.
- ``kappa``: Cohen's kappa, (p_o - p_e) / (1 - p_e).
- ``miou``: :data:`MIOU_RULE`. IoU_c = cm[c, c] / (row_c + col_c - cm[c, c]); the mean
  runs over the classes that occur in the targets or the predictions, so a class
  absent from both is left out, while a class predicted but absent from the targets
  counts with IoU 0. This equals torchmetrics'
  ``MulticlassJaccardIndex(num_classes, average="macro", ignore_index=...)``. Pointcept
  averages over every class (an absent class counts 0), which is the same number
  whenever every class occurs in the targets or the predictions (S3DIS Area 5).

Whole-scene (every original point) scores use the same rule through :func:`label_scorer`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sciformer.contracts import METRIC_NAMES, ScoreFn

__all__ = ["METRIC_NAMES", "MIOU_RULE", "ConfusionMatrix", "Scores", "finite_or_none", "format_table", "label_scorer", "scores_from_confusion", "scores_to_dict"]

MIOU_RULE = ("mean over classes of IoU = tp / (tp + fp + fn), classes absent from both targets and predictions excluded "
             "(= torchmetrics MulticlassJaccardIndex average='macro')")


class ConfusionMatrix:
    """Accumulates a (C, C) confusion matrix ``cm[true, pred]``, ignoring ``ignore_index``."""

    def __init__(self, num_classes: int, ignore_index: int = -1) -> None:
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """Add predictions.

        Shapes:
            pred: (n,) int class ids; target: (n,) int class ids or ``ignore_index``.
        """
        pred = pred.reshape(-1).to("cpu", torch.int64)  # (n,)
        target = target.reshape(-1).to("cpu", torch.int64)  # (n,)
        keep = target != self.ignore_index
        pred, target = pred[keep], target[keep]
        if target.numel() and (target.min() < 0 or target.max() >= self.num_classes):
            raise ValueError(f"targets must lie in [0, {self.num_classes}), got range [{int(target.min())}, {int(target.max())}]")
        flat = target * self.num_classes + pred  # (n,)
        self.matrix += torch.bincount(flat, minlength=self.num_classes**2).reshape(self.num_classes, self.num_classes)

    def compute(self) -> Scores:
        return scores_from_confusion(self.matrix.numpy())


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

    @property
    def macc(self) -> float:
        return self.aa

    def summary(self) -> dict[str, float]:
        return {"oa": self.oa, "aa": self.aa, "kappa": self.kappa, "miou": self.miou}


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
    return {
        "oa": finite_or_none(scores.oa),
        "aa": finite_or_none(scores.aa),
        "macc": finite_or_none(scores.aa),
        "kappa": finite_or_none(scores.kappa),
        "miou": finite_or_none(scores.miou),
        "per_class": per_class,
    }


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


def format_table(scores: Scores, class_names: list[str], title: str = "") -> str:
    """A plain-text table: summary line, then per-class accuracy / IoU / support."""
    width = max([len(n) for n in class_names] + [5])
    lines = []
    if title:
        lines.append(title)
    lines.append(f"OA {100 * scores.oa:6.2f}   AA/mAcc {100 * scores.aa:6.2f}   kappa {100 * scores.kappa:6.2f}   mIoU {100 * scores.miou:6.2f}")
    lines.append(f"{'class':<{width}}  {'acc %':>7}  {'IoU %':>7}  {'support':>8}")
    for i, name in enumerate(class_names):
        acc = scores.per_class_acc[i]
        iou = scores.per_class_iou[i]
        acc_s = f"{100 * acc:7.2f}" if np.isfinite(acc) else f"{'-':>7}"
        iou_s = f"{100 * iou:7.2f}" if np.isfinite(iou) else f"{'-':>7}"
        lines.append(f"{name:<{width}}  {acc_s}  {iou_s}  {int(scores.support[i]):>8}")
    return "\n".join(lines)
