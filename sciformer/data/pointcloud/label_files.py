"""The label file ``data.label_files`` pairs with a point file (``[_points.npy, _labels.npy]``:
``x_points.npy`` -> ``x_labels.npy``): reading it, and the names ``predict`` never writes
(the label file of an input, or of any existing point file of the output's folder), since the
next ``train`` / ``evaluate`` would read a prediction there as that file's truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.pointcloud.fields import check_labels, numeric
from sciformer.errors import DataError
from sciformer.utils.limits import check_npy


def label_file_of(path: Path, label_files: tuple[str, str] | list[str] | None) -> Path | None:
    """The label file ``data.label_files`` pairs with ``path`` (``path``'s name with the first
    string replaced by the second), existing or not; None when the name does not contain it."""
    old, new = (str(v) for v in label_files) if label_files else ("", "")
    return path.with_name(path.name.replace(old, new)) if old and old in path.name else None


def sibling_labels(path: Path, label_files: tuple[str, str]) -> np.ndarray:
    """Labels of ``path`` from its sibling label file (``.npy``, ``.txt`` or SemanticKITTI ``.label``)."""
    old, new = label_files
    other = label_file_of(path, label_files)
    if other is None:
        raise DataError(f"{path}: data.label_files names '{old}', which the file name does not contain")
    if not other.is_file():
        raise DataError(f"{other}: label file of {path.name} not found (data.label_files: [{old}, {new}])")
    suffix = other.suffix.lower()
    try:
        if suffix == ".npy":  # mapped: a header promising more than the file holds fails instead of allocating
            check_npy(other)  # the magic and a numeric dtype first
            with np.errstate(over="raise"):  # a shape whose size overflows: an error, not a warning and a crash
                raw = np.asarray(numeric(other, np.load(other, mmap_mode="r", allow_pickle=False), "label array"))
        elif suffix == ".label":  # SemanticKITTI: uint32, semantic label in the lower 16 bits
            raw = np.fromfile(other, dtype="<u4") & 0xFFFF
        else:
            raw = np.loadtxt(other, dtype=np.float64, ndmin=1)
    except (OSError, ValueError, FloatingPointError) as exc:
        raise DataError(f"{other}: cannot read labels ({type(exc).__name__}: {exc})") from exc
    return check_labels(other, raw.reshape(-1), "label file")  # finite, integer-valued, plausible ids: never cast silently


def read_beside(input_path: Path, state: dict[str, Any]) -> list[Path]:
    """The label file the model's ``data.label_files`` pairs with ``input_path`` (whether it exists
    or not): predict never writes its output there (it would be read as the input's truth)."""
    paired = label_file_of(input_path, state.get("label_files"))
    return [] if paired is None else [paired]


def labelled_by(output: Path, state: dict[str, Any]) -> Path | None:
    """The existing point file whose label file (``data.label_files``) ``output`` is, or None:
    a prediction written there would be read as that file's truth by the next train / evaluate."""
    label_files = state.get("label_files")
    if not label_files:
        return None
    old, new = (str(v) for v in label_files)
    if not old or not new or new not in output.name:
        return None
    owner = output.with_name(output.name.replace(new, old))
    return owner if owner.is_file() and label_file_of(owner, label_files) == output else None
