"""Arrays handed to the Python API's ``predict``, checked and written as the file a predictor reads.

Every problem is one line naming what the caller passed (``points``, ``features=``,
``features={'intensity': ...}``), never a file or an internal stage of the prediction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.errors import DataError

POINT_FIELDS = ("colour", "normal", "intensity")  # per-point inputs a point file carries besides coordinates
FIELD_WIDTH = {"colour": 3, "normal": 3, "intensity": 1}
_ALIASES = {"color": "colour", "rgb": "colour", "normals": "normal"}


def as_numpy(value: Any) -> np.ndarray:
    """``value`` (a torch tensor, a list, an array) as a numpy array."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _shape(name: str, n: int) -> str:
    return f"({n}, 3)" if FIELD_WIDTH[name] == 3 else f"({n},)"


def _from_mapping(features: Mapping[str, Any], n: int) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for key, value in features.items():
        name = _ALIASES.get(key, key)
        if name not in POINT_FIELDS:
            raise DataError(f"predict: unknown feature '{key}'; expected one of {', '.join(POINT_FIELDS)}")
        array = as_numpy(value)  # (n,) or (n, c)
        width = 1 if array.ndim == 1 else array.shape[-1] if array.ndim == 2 else None
        if width != FIELD_WIDTH[name] or len(array) != n:  # a scalar, a stack, another width: never broadcast
            raise DataError(f"predict: feature '{key}' (features={{'{key}': ...}}) must be an array of shape {_shape(name, n)} "
                            f"(a row per point), got shape {array.shape}")
        arrays[name] = array
    return arrays


def _from_table(table: np.ndarray, n: int, wanted: list[str]) -> dict[str, np.ndarray]:
    widths = [FIELD_WIDTH[f] for f in wanted]
    if table.ndim == 1 and sum(widths) == 1:
        table = table[:, None]  # (n,) -> (n, 1): one feature of width one
    if table.ndim != 2 or len(table) != n:  # never reshaped: a (c, n) table would scramble points
        raise DataError(f"predict: features must be an (n, c) table with a row per point (n = {n}), got shape {table.shape}")
    if table.shape[1] != sum(widths):
        raise DataError(f"predict: features has {table.shape[1]} columns; the model takes "
                        f"{' + '.join(f'{f} ({w})' for f, w in zip(wanted, widths, strict=True)) or 'none'}")
    arrays, start = {}, 0
    for name, width in zip(wanted, widths, strict=True):
        arrays[name] = table[:, start : start + width] if width > 1 else table[:, start]  # (n, 3) or (n,)
        start += width
    return arrays


def write_points(path: Path, points: Any, features: Any, model_features: Sequence[str]) -> Path:
    """Check an (n, 3) ``points`` array and its ``features`` (a mapping of per-point arrays, or an
    (n, c) table in the model's feature order) against the features the model was trained with
    (``model_features``), and save them as the ``.npz`` at ``path``."""
    coord = as_numpy(points)
    if coord.dtype.kind not in "biuf":  # complex, text, objects: never a silent cast
        raise DataError(f"predict: points must be real numbers, got dtype {coord.dtype}")
    if coord.ndim != 2 or coord.shape[1] != 3:
        raise DataError(f"predict: points must be (n, 3) coordinates, got shape {coord.shape}; pass per-point inputs with features=")
    n = len(coord)
    wanted = [f for f in model_features if f in POINT_FIELDS]
    if isinstance(features, Mapping):
        arrays = _from_mapping(features, n)
    else:
        arrays = {} if features is None else _from_table(as_numpy(features), n, wanted)
    for name in wanted:
        if name not in arrays:
            raise DataError(f"predict: the model was trained with feature '{name}'; pass it as features={{'{name}': ...}} "
                            f"(shape {_shape(name, n)}), or use a model trained without it")
    np.savez(path, coord=coord.astype(np.float64), **arrays)
    return path
