"""Evaluation outputs: metrics.json, per-class table, confusion matrix."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.engine.metrics import Scores
from sciformer.utils.atomic import atomic_write_text


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def scores_to_dict(scores: Scores, class_names: list[str]) -> dict[str, Any]:
    """JSON-ready scores with per-class entries keyed by class name."""
    per_class = {
        name: {"accuracy": _finite(scores.per_class_acc[i]), "iou": _finite(scores.per_class_iou[i]), "support": int(scores.support[i])}
        for i, name in enumerate(class_names)
    }
    return {
        "oa": _finite(scores.oa),
        "aa": _finite(scores.aa),
        "macc": _finite(scores.aa),
        "kappa": _finite(scores.kappa),
        "miou": _finite(scores.miou),
        "per_class": per_class,
    }


def write_evaluation(out_dir: Path, split: str, scores: Scores, class_names: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    """Write ``metrics.json``, ``per_class.csv`` and ``confusion_matrix.csv`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"split": split, **scores_to_dict(scores, class_names), **extra}
    atomic_write_text(out_dir / "metrics.json", json.dumps(payload, indent=2, default=_json_default) + "\n")

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
    return payload


def _fmt(x: float) -> str:
    return f"{x:.6f}" if np.isfinite(x) else ""


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return _finite(float(obj))
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
