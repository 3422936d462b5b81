"""Shared pieces of the point-file readers: standard keys, colour scaling, checks.

Readers return a dict of arrays with standard keys (see :mod:`sciformer.data.pointcloud.io`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sciformer.errors import DataError
from sciformer.utils.limits import MAX_CLASS_ID

PointData = dict[str, np.ndarray]
# The largest coordinate a model computes with (about 4.6e18): the squared distance between
# two such points (and a norm of a centred one) stays finite in float32, as do the differences,
# heights and relative positions taken of it.
COORD_LIMIT = float(np.finfo(np.float32).max) ** 0.5 / 4

LOWER16_HINT = ("SemanticKITTI labels keep the semantic class in the lower 16 bits and the instance id above "
                "(class = label & 0xFFFF): name the raw .label files in data.label_files, or save label & 0xFFFF")
_LABEL_NAMES = ("label", "labels", "class", "classification", "scalar_label", "scalar_classification",
                "semantic", "segment", "seg", "category_id")
_INTENSITY_NAMES = ("intensity", "scalar_intensity", "i", "reflectance")
_COLOUR_NAMES = (("red", "green", "blue"), ("r", "g", "b"), ("diffuse_red", "diffuse_green", "diffuse_blue"))
_NORMAL_NAMES = (("nx", "ny", "nz"), ("normal_x", "normal_y", "normal_z"))


def fail(path: Path | str, msg: str) -> DataError:
    """A DataError naming ``path``: ``"<path>: <msg>"``."""
    return DataError(f"{path}: {msg}")


def scale_colour(values: np.ndarray) -> np.ndarray:
    """Colour values to float32 in [0, 1]: integers by their bit depth, floats as given."""
    values = np.asarray(values)  # (n, 3)
    if values.size == 0:
        return values.astype(np.float32)
    if np.issubdtype(values.dtype, np.integer):
        top = 255.0 if values.dtype.itemsize == 1 or values.max() <= 255 else 65535.0
        return (values / top).astype(np.float32)
    vmax = float(np.nanmax(values))
    if vmax <= 1.0:
        return values.astype(np.float32)
    top = 255.0 if vmax <= 255.0 else 65535.0
    return np.clip(values / top, 0.0, 1.0).astype(np.float32)


def from_named_columns(path: Path | str, columns: dict[str, np.ndarray]) -> PointData:
    """Map named columns (lower-cased names) onto the standard keys."""
    cols = {k.lower(): v for k, v in columns.items()}
    if not all(c in cols for c in ("x", "y", "z")):
        raise fail(path, f"no x, y, z fields (found: {', '.join(columns) or 'none'})")

    def take(name: str) -> np.ndarray:
        return numeric(path, cols.pop(name), f"field '{name}'")

    with np.errstate(invalid="ignore"):  # NaN bit patterns (raw scans) stay NaN: invalid points, no warning
        out: PointData = {"coord": np.stack([take(c) for c in ("x", "y", "z")], axis=1).astype(np.float64)}
    for names in _NORMAL_NAMES:
        if all(c in cols for c in names):
            out["normal"] = np.stack([take(c) for c in names], axis=1).astype(np.float32)  # (n, 3)
            break
    for names in _COLOUR_NAMES:
        if all(c in cols for c in names):
            rgb = np.stack([take(c) for c in names], axis=1)  # (n, 3)
            out["colour"] = scale_colour(rgb)
            cols.pop("alpha", None)
            break
    for name in _INTENSITY_NAMES:
        if name in cols:
            out["intensity"] = take(name).astype(np.float32)  # (n,)
            break
    for name in _LABEL_NAMES:
        if name in cols:
            values = np.asarray(cols.pop(name))
            out["label"] = check_labels(path, values, f"field '{name}'")  # (n,)
            break
    for name, values in cols.items():
        out[name] = np.asarray(values)
    return out


def numeric(path: Path | str, values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as an array of real numbers (bool, integer or float dtype); any other dtype
    (complex, text, dates, objects) is a one-line DataError rather than a silent cast."""
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise fail(path, f"{what} has dtype {values.dtype}; expected real numbers")
    return values


def cast_text_values(path: Path | str, values: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """Numbers parsed from text (float64) as the file's declared ``dtype``; an integer field's
    value that is not an integer or does not fit the type (label -5 or 300 in an unsigned byte,
    1e23 in any) is a one-line DataError naming ``what`` and the first such value, never a wrap."""
    values = np.asarray(values, dtype=np.float64)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu" and values.size:
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):  # NaN compares False: caught as not an integer
            bad = ~((values == np.round(values)) & (values >= float(info.min)) & (values < float(info.max) + 1.0))  # exact at 2**64 too
        if bad.any():
            first = values[bad].flat[0]
            raise fail(path, f"{what} holds {first:g}, which is not a value of its type {dtype.name} "
                             f"(integers {info.min}..{info.max})")
    with np.errstate(over="ignore"):  # beyond float32: inf, masked downstream as an invalid point
        return values.astype(dtype)


def check_labels(path: Path | str, values: np.ndarray, what: str = "labels") -> np.ndarray:
    """Labels as int64: finite, integer-valued and plausible class ids (-1 .. MAX_CLASS_ID)."""
    values = np.asarray(values)
    if values.dtype.kind == "f":
        if not np.all(np.isfinite(values)):
            raise fail(path, f"{what} holds non-finite labels")
        if not np.array_equal(values, np.round(values)):
            raise fail(path, f"{what} holds non-integer labels (e.g. {values[values != np.round(values)][0]:g}); expected integer class ids")
    elif values.dtype.kind not in "iub":
        raise fail(path, f"{what} has dtype {values.dtype}; expected integer class ids")
    if values.size:
        low, high = float(values.min()), float(values.max())
        if low < -1 or high > MAX_CLASS_ID:
            hint = f"; {LOWER16_HINT}" if high >= 1 << 16 else ""
            raise fail(path, f"{what}: label ids {low:g}..{high:g} are not plausible class ids (expected 0..{MAX_CLASS_ID}){hint}")
    return values.astype(np.int64)


def usable_coords(coord: np.ndarray) -> np.ndarray:
    """(n,) bool: every coordinate within +-:data:`COORD_LIMIT` (False for NaN and Inf).

    The others are no-data points: a cloud spread over +-3e38 (finite float32) or a float64
    value past float32 would leave float32's range in the centring, heights and distances
    made of it.

    Shapes: coord (n, 3) -> (n,).
    """
    with np.errstate(invalid="ignore"):
        return np.all(np.abs(np.asarray(coord, dtype=np.float64)) <= COORD_LIMIT, axis=1)


def check_points(path: Path | str, data: PointData) -> PointData:
    coord = data["coord"]
    if coord.ndim != 2 or coord.shape[1] != 3:
        raise fail(path, f"coordinates have shape {coord.shape}, expected (n, 3)")
    if coord.shape[0] == 0:
        raise fail(path, "empty point cloud (0 points)")
    if not np.all(np.isfinite(coord)):
        raise fail(path, "non-finite coordinates")
    return data


def face_indices(path: Path | str, kind: str, line: str) -> list[int]:
    """The vertex indices of a text face line ``n i1 ... in [extra values]`` (OFF, ascii PLY);
    a line with fewer than ``n`` indices is a one-line DataError (a count of 99999999999 before
    three indices is no triangle). Non-integer words raise ValueError for the caller to wrap."""
    words = line.split()
    count = int(words[0]) if words else 0
    if count > len(words) - 1:
        raise fail(path, f"{kind} face line {line[:60]!r} lists {str(count)[:24]} vertices but holds "
                         f"{len(words) - 1} indices")
    return [int(w) for w in words[1 : 1 + count]]


def triangulate(path: Path | str, faces: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
    """Polygons (any sizes) to triangles by fans around each first vertex."""
    if isinstance(faces, np.ndarray):
        return faces.astype(np.int64)
    tris: list[tuple[int, int, int]] = []
    for poly in faces:
        poly = [int(v) for v in poly]
        if len(poly) < 3:
            raise fail(path, f"face with {len(poly)} vertices, expected at least 3")
        tris.extend((poly[0], poly[i], poly[i + 1]) for i in range(1, len(poly) - 1))
    try:
        return np.asarray(tris, dtype=np.int64).reshape(-1, 3)  # (m, 3)
    except OverflowError:
        raise fail(path, "face vertex index beyond int64; the file is damaged") from None

