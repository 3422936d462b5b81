"""Predict every point of a new cloud file exactly as a scene model was trained.

Shared by the scene datasets' file predictors (``las_tiles``, ``s3dis``, ``point_scenes``,
``shapenetpart``): read the file keeping every point (:func:`read_cloud`), check it has
the features the checkpoint's model was trained with (:func:`require_features`), and
predict class probabilities for every point (:func:`predict_cloud`), which the writers
of :mod:`sciformer.data.pointcloud.export` store one row per input point.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.contracts import PredictFn, PredictOptions
from sciformer.data.pointcloud.chunking import grid_parts, predict_chunked, tta_views
from sciformer.data.pointcloud.export import PointPrediction
from sciformer.data.pointcloud.fields import COORD_LIMIT, usable_coords
from sciformer.data.pointcloud.io import read_point_file
from sciformer.data.pointcloud.sample import assemble_features
from sciformer.data.transforms import CenterShift, Compose, Sample, index_points, point_values
from sciformer.errors import DataError
from sciformer.frontend import option
from sciformer.utils.progress import progress

# What a feature needs in the file, and what to say when it is missing.
HEADERLESS_SUFFIXES = (".npy", ".xyz", ".txt", ".pts", ".csv")  # --columns names their columns
_FEATURE_FIELDS = {"colour": "red/green/blue colour", "intensity": "intensity values", "normal": "normals (nx, ny, nz)"}


def read_cloud(path: Path, columns: Sequence[str] | str | None = None) -> dict[str, np.ndarray]:
    """Every point of a point file in file order, NaN/Inf points included (see :func:`valid_points`)."""
    return read_point_file(path, columns, keep_invalid=True)


def require_features(path: Path, data: dict[str, Any], features: Sequence[str], *, training: bool = False) -> None:
    """A one-line DataError naming the first feature of ``features`` the file lacks (and what to do)."""
    for name in features:
        if name in _FEATURE_FIELDS and name not in data:
            if training:
                raise DataError(f"{path}: data.features uses '{name}' but the file has no {_FEATURE_FIELDS[name]}; "
                                f"drop '{name}' from data.features or give every file one")
            guessed = path.suffix.lower() in HEADERLESS_SUFFIXES  # columns guessed from the width: name them
            hint = (f"; a headerless table's columns are guessed from its width (4: x, y, z and a label when the 4th holds "
                    f"integers, else intensity): name them, e.g. {option('--columns', 'x,y,z,' + name)}" if guessed else "")
            raise DataError(f"{path}: the model was trained with feature '{name}' but the file has no "
                            f"{_FEATURE_FIELDS[name]}; use a file with it, or a model trained without it "
                            f"(data.features without '{name}'){hint}")


def valid_points(sample: Sample, features: Sequence[str] = ()) -> np.ndarray:
    """(n,) bool: coordinates within the model's range (:func:`usable_coords`) and values of every
    feature used finite in float32 (the model's dtype).

    A float64 value beyond float32's range (e.g. 1e300) would become inf in the model's input.
    """
    limit = float(np.finfo(np.float32).max)
    coord = np.asarray(sample["coord"])  # (n, 3)
    ok = usable_coords(coord)  # False for NaN and Inf
    with np.errstate(invalid="ignore"):
        for name in features:
            value = sample.get(name)
            if name in _FEATURE_FIELDS and value is not None:
                value = np.asarray(value, dtype=np.float64).reshape(len(coord), -1)  # (n, c)
                ok &= np.all(np.abs(value) <= limit, axis=1)
    return ok


def predict_cloud(
    predict: PredictFn,
    sample: Sample,
    *,
    class_names: Sequence[str],
    features: Sequence[str],
    grid_size: float | None,
    max_points: int | None,
    part_z: str,
    transform: Compose | None,
    batch_size: int,
    options: PredictOptions,
    desc: str = "predict",
) -> PointPrediction:
    """Class probabilities of every point of ``sample`` (coord (n, 3) float64 and feature arrays).

    Invalid points (:func:`valid_points`) are left out of the model's input and get an
    all-zero row and ``valid`` False. The valid points are grid-sampled (``grid_size``,
    the point nearest each voxel's centre, chosen by value so the order of the points
    changes nothing, mapped back to every point), predicted in chunks of at most
    ``max_points`` (recentred in x, y and by ``part_z`` in z, then ``transform`` and the
    features, as the scene datasets make their items), with ``options.overlap`` context
    points per core point and the test-time views of ``options.rotations`` / ``options.flip``.
    Gross outliers (:func:`~sciformer.data.pointcloud.chunking.detached_points`) are
    predicted as clouds of their own, so they change nothing for the other points.
    A progress bar shows on a terminal.

    Shapes: sample coord (n, 3) -> probs (n, C), valid (n,).
    """
    coord = np.asarray(sample["coord"])  # (n, 3)
    n, num_classes = coord.shape[0], len(class_names)
    valid = valid_points(sample, features)
    probs = np.zeros((n, num_classes), dtype=np.float32)  # (n, C)
    if not valid.any():  # still an output row per point, but say so: a finished-looking file of nothing
        print(f"note: none of the {n} points has finite coordinates within +-{COORD_LIMIT:.2g}"
              f"{' and features within float32' if features else ''}'s range; every point is written unclassified "
              "(valid = 0)", file=sys.stderr)
        return PointPrediction(probs, valid, list(class_names))
    rows = np.flatnonzero(valid)
    cloud = index_points(sample, rows) if len(rows) < n else dict(sample)
    cloud = {k: v for k, v in cloud.items() if k in ("coord", "label", "category") or k in features}
    cloud["coord"] = np.asarray(cloud["coord"], dtype=np.float64)
    # gross outliers (a no-data x of 1e6) are sampled and predicted as clouds of their own:
    # with the others they would move the voxel grid's anchor and every chunk's centre
    keep, inverse, clouds = grid_parts(cloud["coord"], grid_size, point_values(cloud, features))
    shift = CenterShift(z=part_z)  # type: ignore[arg-type]
    transform = transform or Compose([])

    def prepare(piece: Sample) -> Sample:
        return assemble_features(transform(shift(piece), np.random.default_rng([0, 0])), features, "chunk")

    bar = progress(iter(()), desc, total=None)
    calls_before = 0  # model calls of the clouds already predicted

    def tick(done: int, total: int) -> None:
        if hasattr(bar, "update"):
            bar.total = calls_before + total
            bar.update(calls_before + done - bar.n)

    kept = np.zeros((len(keep), num_classes), dtype=np.float32)  # (m, C)
    try:
        for part in clouds:
            kept[part] = predict_chunked(predict, index_points(cloud, keep[part]), prepare, num_classes=num_classes,
                                         max_points=max_points, overlap=options.overlap, batch_size=batch_size,
                                         views=tta_views(options.rotations, options.flip), progress=tick,
                                         point_ids=rows[keep[part]])
            calls_before = int(getattr(bar, "n", 0))
    finally:
        if hasattr(bar, "close"):
            bar.close()
    probs[rows] = kept[inverse]
    return PointPrediction(probs, valid, list(class_names))
