"""Evaluation outputs: metrics.json, per-class table, confusion matrix."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.engine.compare import read_json_object
from sciformer.engine.metrics import MIOU_RULE, Scores, finite_or_none, scores_to_dict
from sciformer.engine.signals import undone_on_abrupt_exit
from sciformer.errors import SciformerError
from sciformer.utils.atomic import atomic_folder, atomic_write_text, stale_stages

EVALUATION_TABLES = ("metrics.json", "per_class.csv", "confusion_matrix.csv")  # metrics.json, the finished mark, first
EVALUATION_FILES = (*EVALUATION_TABLES, "predictions")  # what an evaluation writes (+ exports)
# inside predictions/: every file and folder the evaluation exported there (it travels with them, swapped in as one)
PREDICTIONS_RECORD = ".sciformer-evaluation.json"


def write_evaluation(out_dir: Path, split: str, scores: Scores, class_names: list[str], extra: dict[str, Any],
                     label_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """Write ``per_class.csv``, ``confusion_matrix.csv`` and, last, ``metrics.json`` into
    ``out_dir`` (each atomically): a folder with ``metrics.json`` holds the whole evaluation.

    ``per_class.csv``: ``class_id`` is the 0-based class index (the model's output order),
    ``label_id`` the id the class has in the task's maps and prediction files
    (:attr:`~sciformer.contracts.DataInfo.label_ids`; default: the index), so the table joins them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"split": split, **scores_to_dict(scores, class_names), "miou_rule": MIOU_RULE, **extra}
    ids = list(range(len(class_names))) if label_ids is None else [int(v) for v in label_ids]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["class_id", "class", "accuracy", "iou", "support", "label_id"])  # label_id last: older readers keep their columns
    for i, name in enumerate(class_names):
        writer.writerow([i, name, _fmt(scores.per_class_acc[i]), _fmt(scores.per_class_iou[i]), int(scores.support[i]), ids[i]])
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
                         export: Callable[[Path], dict[str, Any] | None], *, only_recorded: bool = False,
                         label_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """A whole evaluation into ``out_dir``: ``export`` writes the predictions into a hidden stage
    folder (its facts join ``extra``), which, with :data:`PREDICTIONS_RECORD` naming what it
    holds, becomes ``predictions/``; then the tables and, last, ``metrics.json``
    (:func:`write_evaluation`). Returns metrics.json's content.

    Until the stage is complete, the folder's earlier evaluation stays whole; a failure or
    signal removes only the stage. Then ``metrics.json`` goes first, so new predictions never
    sit beside an old ``metrics.json``; a failure from there on removes the new, incomplete set.
    The caller holds the folder (a run's lock, or ``locked_evaluation_dir``), so stages an
    interrupted process left are removed first. ``only_recorded`` (``sciformer evaluate``):
    an existing ``predictions/`` is replaced only while it holds nothing but an earlier
    evaluation's files (:func:`check_evaluation_replaceable`), checked again just before the swap;
    otherwise a one-line SciformerError and only the stage goes. Without it (a run's own
    folder) the whole ``predictions/`` is replaced.
    """
    predictions = out_dir / "predictions"
    for stale in stale_stages(predictions):
        shutil.rmtree(stale, ignore_errors=True)
    replacing = swapped = False
    try:
        with atomic_folder(predictions, replace=True) as stage, undone_on_abrupt_exit(lambda: shutil.rmtree(stage, ignore_errors=True)):
            facts = {**extra, **(export(stage) or {})}
            _record_predictions(stage)
            if only_recorded:
                check_evaluation_replaceable(out_dir)
            with contextlib.suppress(FileNotFoundError):
                (out_dir / "metrics.json").unlink()  # from here until it is written the folder holds no finished evaluation
            replacing = True
        swapped = True
        with undone_on_abrupt_exit(lambda: _remove_set(out_dir, predictions=True)):
            with contextlib.suppress(OSError):
                predictions.rmdir()  # nothing exported (the task writes no files): no empty folder
            return write_evaluation(out_dir, split, scores, class_names, facts, label_ids)
    except BaseException:
        if replacing:
            _remove_set(out_dir, predictions=swapped)
        raise


def _tree(folder: Path) -> tuple[list[str], list[str]]:
    """Every entry under ``folder`` (links not followed) as sorted POSIX paths relative to it:
    ``(folders, others)``, a link or special file counting as an other, and a folder that
    cannot be read as an other ``<path>/`` (a name no record holds)."""
    folders: list[str] = []
    others: list[str] = []

    def unreadable(exc: OSError) -> None:
        others.append(f"{Path(os.path.relpath(exc.filename or folder, folder)).as_posix()}/")

    for root, dirs, files in os.walk(folder, onerror=unreadable, followlinks=False):
        base = Path(root).relative_to(folder)
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(Path(root) / name).st_mode
                (folders if stat.S_ISDIR(mode) else others).append((base / name).as_posix())
    return sorted(folders), sorted(others)


def _record_predictions(stage: Path) -> None:
    """Write :data:`PREDICTIONS_RECORD` into ``stage`` naming every folder and file the export
    wrote there; nothing where it wrote nothing (so no ``predictions/`` is made)."""
    folders, files = _tree(stage)
    if folders or files:
        record = {"written_by": "sciformer evaluation", "folders": folders, "files": files}
        (stage / PREDICTIONS_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="ascii")


def _recorded(predictions: Path) -> tuple[set[str], set[str]] | None:
    """The ``(folders, files)`` ``predictions/`` records, or None where it has no readable record."""
    record = predictions / PREDICTIONS_RECORD
    try:
        if not stat.S_ISREG(os.lstat(record).st_mode):
            return None
        data = json.loads(record.read_text(encoding="ascii"))
        return {str(p) for p in data["folders"]}, {str(p) for p in data["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def unrecorded_entry(out_dir: Path) -> str | None:
    """The first entry (sorted, as ``predictions/<path>``) of ``out_dir/predictions`` that no
    earlier evaluation recorded writing, or None when there is nothing to lose: no or an empty
    ``predictions/``, or one holding only (part of) the set its :data:`PREDICTIONS_RECORD` names,
    each folder a real folder and each file a regular file. A link, a file or special file named
    ``predictions``, and any ``predictions/`` without a readable record (one an older sciformer
    wrote, or not an evaluation's) give their first entry. Links are never followed."""
    predictions = out_dir / "predictions"
    try:
        mode = os.lstat(predictions).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(mode):
        return "predictions"
    folders, others = _tree(predictions)
    recorded = _recorded(predictions)
    if recorded is not None:
        own_folders, own_files = recorded
        folders = [p for p in folders if p not in own_folders]
        others = [p for p in others if p != PREDICTIONS_RECORD and not (p in own_files and _is_file(predictions / p))]
    found = sorted(folders + others)
    return f"predictions/{found[0]}" if found else None


def _is_file(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISREG(os.lstat(path).st_mode)
    return False


_OLDER_METRICS = {"split", "oa", "aa", "macc", "kappa", "miou", "per_class"}  # metrics.json before miou_rule


def unrecorded_table(out_dir: Path) -> str | None:
    """The first of ``out_dir``'s tables (:data:`EVALUATION_TABLES`) that no earlier evaluation
    wrote, or None: each must be a regular file, in a folder whose ``metrics.json`` is an
    evaluation's (a JSON object with its ``split`` and ``miou_rule``, or every score key versions
    before ``miou_rule`` wrote) or, where an evaluation
    was cut short before writing it, whose ``predictions/`` holds a readable record."""
    present = [name for name in EVALUATION_TABLES if os.path.lexists(out_dir / name)]
    odd = [name for name in present if not _is_file(out_dir / name)]
    if odd or not present:
        return odd[0] if odd else None
    if (out_dir / "metrics.json").exists():
        try:
            keys = read_json_object(out_dir / "metrics.json").keys()
            ours = "split" in keys and ("miou_rule" in keys or _OLDER_METRICS <= keys)  # any sciformer version's
        except SciformerError:
            ours = False
    else:
        ours = _recorded(out_dir / "predictions") is not None
    return None if ours else present[0]


def check_evaluation_replaceable(out_dir: Path) -> None:
    """Refuse, in one line, an ``out_dir`` holding a ``predictions/`` entry (:func:`unrecorded_entry`)
    or a table (:func:`unrecorded_table`) that no earlier evaluation wrote:
    ``--overwrite`` replaces an evaluation's files only."""
    entry = unrecorded_entry(out_dir) or unrecorded_table(out_dir)
    if entry is not None:
        raise SciformerError(f"--output-dir {out_dir} holds {entry}, which no earlier sciformer evaluation recorded writing "
                             f"(an evaluation replaces only its own files; an older sciformer's predictions keep no record); "
                             f"move it elsewhere or choose another --output-dir")


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
