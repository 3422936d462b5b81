"""Evaluation outputs: metrics.json, per-class table, confusion matrix."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.engine.metrics import MIOU_RULE, Scores, finite_or_none, scores_to_dict
from sciformer.utils.atomic import atomic_write_text

EVALUATION_FILES = ("metrics.json", "per_class.csv", "confusion_matrix.csv", "predictions")  # what an evaluation writes (+ exports)


def write_evaluation(out_dir: Path, split: str, scores: Scores, class_names: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    """Write ``per_class.csv``, ``confusion_matrix.csv`` and, last, ``metrics.json`` into
    ``out_dir`` (each atomically): a folder with ``metrics.json`` holds the whole evaluation."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"split": split, **scores_to_dict(scores, class_names), "miou_rule": MIOU_RULE, **extra}
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["class_id", "class", "accuracy", "iou", "support"])
    for i, name in enumerate(class_names):
        writer.writerow([i, name, _fmt(scores.per_class_acc[i]), _fmt(scores.per_class_iou[i]), int(scores.support[i])])
    atomic_write_text(out_dir / "per_class.csv", buf.getvalue())

    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["true\\pred", *class_names])
    for i, name in enumerate(class_names):
        writer.writerow([name, *(int(v) for v in scores.confusion[i])])
    atomic_write_text(out_dir / "confusion_matrix.csv", buf.getvalue())
    atomic_write_text(out_dir / "metrics.json", json.dumps(payload, indent=2, default=_json_default) + "\n")
    return payload


def _fmt(x: float) -> str:
    return f"{x:.6f}" if np.isfinite(x) else ""


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return finite_or_none(float(obj))
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
