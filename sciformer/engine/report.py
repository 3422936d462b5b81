"""Evaluation outputs: metrics.json, per-class table, confusion matrix."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.engine.metrics import MIOU_RULE, Scores, finite_or_none, scores_to_dict
from sciformer.engine.signals import undone_on_abrupt_exit
from sciformer.utils.atomic import atomic_folder, atomic_write_text, stale_stages

EVALUATION_TABLES = ("metrics.json", "per_class.csv", "confusion_matrix.csv")  # metrics.json, the finished mark, first
EVALUATION_FILES = (*EVALUATION_TABLES, "predictions")  # what an evaluation writes (+ exports)


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


def write_evaluation_set(out_dir: Path, split: str, scores: Scores, class_names: list[str], extra: dict[str, Any],
                         export: Callable[[Path], dict[str, Any] | None]) -> dict[str, Any]:
    """A whole evaluation into ``out_dir``: ``export`` writes the predictions into a hidden stage
    folder (its facts join ``extra``), which becomes ``predictions/``; then the tables and,
    last, ``metrics.json`` (:func:`write_evaluation`). Returns metrics.json's content.

    Until the stage is complete, the folder's earlier evaluation stays whole; a failure or
    signal removes only the stage. Then ``metrics.json`` goes first, so new predictions never
    sit beside an old ``metrics.json``; a failure from there on removes the new, incomplete set.
    The caller holds the folder (a run's lock, or ``locked_evaluation_dir``), so stages an
    interrupted process left are removed first.
    """
    predictions = out_dir / "predictions"
    for stale in stale_stages(predictions):
        shutil.rmtree(stale, ignore_errors=True)
    replacing = swapped = False
    try:
        with atomic_folder(predictions, replace=True) as stage, undone_on_abrupt_exit(lambda: shutil.rmtree(stage, ignore_errors=True)):
            facts = {**extra, **(export(stage) or {})}
            with contextlib.suppress(FileNotFoundError):
                (out_dir / "metrics.json").unlink()  # from here until it is written the folder holds no finished evaluation
            replacing = True
        swapped = True
        with undone_on_abrupt_exit(lambda: _remove_set(out_dir, predictions=True)):
            with contextlib.suppress(OSError):
                predictions.rmdir()  # nothing exported (the task writes no files): no empty folder
            return write_evaluation(out_dir, split, scores, class_names, facts)
    except BaseException:
        if replacing:
            _remove_set(out_dir, predictions=swapped)
        raise


def _remove_set(out_dir: Path, *, predictions: bool) -> None:
    """Remove an incomplete evaluation: its tables where they are files (metrics.json first), and
    ``predictions/`` only when it is this evaluation's (renamed in); nothing else is followed or emptied."""
    for name in EVALUATION_TABLES:
        path = out_dir / name
        with contextlib.suppress(OSError):
            if path.is_symlink() or path.is_file():
                path.unlink()
    if predictions:
        shutil.rmtree(out_dir / "predictions", ignore_errors=True)


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
