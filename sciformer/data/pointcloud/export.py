"""Per-point predictions out, one row per input point in input order: .npy, .npz, .ply, .las/.laz.

Points that cannot be classified (NaN/Inf coordinates or features) keep their row: their
``pred`` is :data:`NO_DATA` (-1) and their ``valid`` flag 0, so a prediction file always
has as many rows as its input and maps back to it by position.

Formats (by the output suffix; nothing else is written):

- ``.npy``: ``pred`` (n,) int64 class ids, -1 = no data.
- ``.npz``: ``pred`` (n,) int64, ``valid`` (n,) bool, ``confidence`` (n,) float32 (the
  winning class's probability, 0 where invalid), ``class_names`` (C,) str and, with
  ``probabilities``, ``probabilities`` (n, C) float32.
- ``.ply``: x, y, z (double when the input was), colour, ``pred`` (int), ``valid`` (uchar),
  ``confidence`` (float), ``label`` when the input had one, and with ``probabilities`` one
  float ``prob_<k>`` per class; header comments name the classes (``comment class 3 car``).
- ``.las`` / ``.laz`` (input LAS/LAZ only): the input file with its header, point format,
  scales, offsets, VLRs (CRS as WKT or GeoTIFF keys) and every dimension kept; the predicted
  class in ``classification`` as an ASPRS code (``asprs_codes[k]`` for class k), and extra
  dimensions ``original_classification`` (uint8), ``confidence`` (float32) and, with
  ``probabilities``, ``prob_<k>`` (float32). An input that already has
  ``original_classification`` (a predicted tile predicted again) keeps it unchanged; the
  ``confidence`` / ``prob_<k>`` an earlier prediction wrote (known by their descriptions) are
  replaced, and its ``prob_<k>`` that this prediction does not write are dropped; a dimension of
  the user's with a name the prediction writes (or any ``prob_<k>`` of the user's, with
  ``probabilities``) is refused in one line, never overwritten or mixed in.

Every file is written atomically (temporary file + rename).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.pointcloud.ply import write_ply
from sciformer.data.predicting import check_output_suffix
from sciformer.data.transforms import Sample
from sciformer.errors import DataError
from sciformer.utils.atomic import atomic_write_with

NO_DATA = -1  # pred of a point that could not be classified
POINT_OUTPUTS = (".npy", ".npz", ".ply", ".las", ".laz")
LAS_NEVER_CLASSIFIED = 0  # ASPRS "created, never classified": LAS code of an unpredicted point
LAS_UNCLASSIFIED = 1  # ASPRS "unclassified": the code of a class with no ASPRS code of its own


@dataclass
class PointPrediction:
    """Class probabilities of every input point and which points were classified.

    Attributes:
        probs: (n, C) float32 class probabilities; rows of invalid points are 0.
        valid: (n,) bool, False where the point could not be classified.
        class_names: the C class names.
    """

    probs: np.ndarray
    valid: np.ndarray
    class_names: list[str]

    @property
    def pred(self) -> np.ndarray:
        """(n,) int64 class ids, :data:`NO_DATA` where invalid."""
        out = self.probs.argmax(axis=1).astype(np.int64)  # (n,)
        out[~self.valid] = NO_DATA
        return out

    @property
    def confidence(self) -> np.ndarray:
        """(n,) float32 probability of the predicted class, 0 where invalid."""
        conf = self.probs.max(axis=1).astype(np.float32)  # (n,)
        conf[~self.valid] = 0.0
        return conf


def class_comments(class_names: Sequence[str]) -> list[str]:
    """PLY header comments: the class table and the no-data convention."""
    lines = [f"class {k} {name}" for k, name in enumerate(class_names)]
    return lines + [f"pred {NO_DATA} = no data (valid 0: NaN/Inf input point, not classified)"]


def write_point_predictions(
    output_path: str | os.PathLike[str],
    sample: Sample,
    prediction: PointPrediction,
    *,
    source: Path | None = None,
    asprs_codes: Sequence[int] | None = None,
    probabilities: bool = False,
) -> Path:
    """Write ``prediction`` for every point of ``sample`` (coord (n, 3), optional colour, label)
    in the format of ``output_path``'s suffix (see the module docstring); returns the path.

    ``source`` is the input file (needed for .las/.laz); ``asprs_codes`` (C,) maps classes
    to ASPRS codes for LAS (default: the class index).
    """
    output_path = Path(output_path)
    suffix = check_output_suffix(output_path, POINT_OUTPUTS, source)
    n = len(prediction.valid)
    coord = np.asarray(sample["coord"])
    if coord.shape[0] != n:
        raise DataError(f"{output_path}: {n} predictions for {coord.shape[0]} input points")
    pred = prediction.pred
    if suffix == ".npy":
        atomic_write_with(output_path, lambda tmp: np.save(tmp, pred))
    elif suffix == ".npz":
        arrays = {"pred": pred, "valid": prediction.valid, "confidence": prediction.confidence,
                  "class_names": np.asarray(prediction.class_names, dtype=str)}
        if probabilities:
            arrays["probabilities"] = prediction.probs.astype(np.float32)
        atomic_write_with(output_path, lambda tmp: np.savez_compressed(tmp, **arrays))
    elif suffix == ".ply":
        fields: dict[str, np.ndarray] = {"pred": pred.astype(np.int32), "valid": prediction.valid,
                                         "confidence": prediction.confidence}
        if "label" in sample:
            fields["label"] = np.asarray(sample["label"]).astype(np.int32)
        if probabilities:
            fields.update({f"prob_{k}": prediction.probs[:, k].astype(np.float32) for k in range(prediction.probs.shape[1])})
        colour = sample.get("colour")
        write_ply(output_path, coord, None if colour is None else np.nan_to_num(np.asarray(colour)),
                  comments=class_comments(prediction.class_names), **fields)
    else:
        if source is None:
            raise DataError(f"{output_path}: LAS/LAZ output needs the input LAS/LAZ file")
        write_las_predictions(output_path, source, prediction, asprs_codes, probabilities=probabilities)
    return output_path


def write_las_predictions(
    output_path: Path,
    source: Path,
    prediction: PointPrediction,
    asprs_codes: Sequence[int] | None,
    *,
    probabilities: bool = False,
) -> Path:
    """Copy the LAS/LAZ ``source`` to ``output_path`` with predicted ASPRS codes and extra dimensions.

    The compression follows ``output_path``'s suffix (.laz compressed); everything else of
    the source (header, point format, scales, offsets, VLRs, dimensions) is kept.
    """
    import laspy

    from sciformer.data.pointcloud.las import laspy_errors

    num_classes = prediction.probs.shape[1]
    codes = np.asarray(list(asprs_codes) if asprs_codes is not None else range(num_classes), dtype=np.int64)
    if codes.shape != (num_classes,):
        raise DataError(f"{output_path}: {len(codes)} ASPRS codes for {num_classes} classes")
    with laspy_errors(source, "LAS/LAZ"):
        las = laspy.read(source)
    n = len(las.points)
    if n != len(prediction.valid):
        raise DataError(f"{output_path}: {len(prediction.valid)} predictions for the {n} points of {source}")
    legacy = las.header.point_format.id < 6  # point formats 0-5 store 5-bit classes
    top = 31 if legacy else 255
    if codes.min() < 0 or codes.max() > top:
        raise DataError(f"{output_path}: ASPRS codes {codes.min()}..{codes.max()} do not fit point format "
                        f"{las.header.point_format.id} of {source.name} (0..{top})")
    original = np.asarray(las.classification, dtype=np.uint8).copy()  # (n,)
    pred = prediction.pred
    new = np.where(pred >= 0, codes[np.clip(pred, 0, None)], LAS_NEVER_CLASSIFIED)  # (n,)
    extra = {"original_classification": (np.uint8, original), "confidence": (np.float32, prediction.confidence)}
    if probabilities:
        extra.update({f"prob_{k}": (np.float32, prediction.probs[:, k]) for k in range(num_classes)})
    have = set(las.point_format.dimension_names)
    if "original_classification" in have:  # a predicted tile again: its first classification stays
        del extra["original_classification"]
    ours = {d.name for d in las.point_format.extra_dimensions if _is_prediction_dim(d.name) and _ours(d)}
    # a dimension of the user's named as this prediction's (or a prob_<k> beside its prob_<k>): never replaced, never mixed in
    clash = [n for n in sorted(have - ours) if n in extra or (probabilities and re.fullmatch(r"prob_\d+", n))]
    if clash:
        raise DataError(f"{source}: the input has its own dimension '{clash[0]}' (not one a sciformer prediction wrote); predictions "
                        f"write 'confidence'{' and prob_<k>' if probabilities else ''} and never replace or sit beside such a dimension "
                        "of yours: rename or drop it first (e.g. with PDAL or laspy), or write .ply / .npz")
    stale = sorted(ours - set(extra))  # an earlier prediction's prob_<k> (another model, or no --probabilities now)
    add = [laspy.ExtraBytesParams(name=name, type=dt, description=_describe(name)) for name, (dt, _) in extra.items()
           if name not in have]
    with laspy_errors(output_path, "LAS/LAZ output", verb="write"):
        if stale:
            las.remove_extra_dims(stale)
        if add:
            las.add_extra_dims(add)
        las.classification = new.astype(np.uint8)
        for name, (dt, values) in extra.items():
            las[name] = np.asarray(values).astype(dt)
        atomic_write_with(output_path, lambda tmp: las.write(str(tmp), do_compress=output_path.suffix.lower() == ".laz"))
    return output_path


def _is_prediction_dim(name: str) -> bool:
    return name == "confidence" or re.fullmatch(r"prob_\d+", name) is not None


def _ours(dimension: Any) -> bool:
    """An extra dimension a sciformer prediction wrote (its name and description are ours, float32)."""
    description = str(getattr(dimension, "description", "") or "").rstrip("\x00").strip()
    return description == _describe(dimension.name) and np.dtype(dimension.dtype) == np.float32


def _describe(name: str) -> str:
    if name == "original_classification":
        return "classification before prediction"
    if name == "confidence":
        return "probability of predicted class"
    return f"probability of class {name[5:]}"[:32]


SPARE_CODES = (LAS_UNCLASSIFIED, *range(19, 32), *range(64, 256))  # for classes without a code: 1, then reserved / user codes


def asprs_codes_from_table(classes: dict[str, list[int]]) -> list[int]:
    """ASPRS code of each class of a ``{class: [codes]}`` table (``las_tiles`` and ``point_scenes``
    alike): its first code; a catch-all class with none gets :data:`LAS_UNCLASSIFIED` (1), or,
    where 1 is some class's code or taken, the first free code of :data:`SPARE_CODES`, so no two
    classes ever share a code."""
    taken = {int(c) for codes in classes.values() for c in codes}
    out = []
    for codes in classes.values():
        if codes:
            out.append(int(codes[0]))
            continue
        code = next((c for c in SPARE_CODES if c not in taken), None)
        if code is None:
            raise DataError(f"no free LAS classification code for a class without codes (the class table uses {len(taken)} codes)")
        taken.add(code)
        out.append(code)
    return out
