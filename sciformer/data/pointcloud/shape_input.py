"""What the shape predictors (ModelNet classes, ShapeNetPart parts) check of a new shape.

- A shape whose points all coincide (radius 0) is refused in one line: there is no shape.
- A shape with fewer distinct points than ``min(FEW_POINTS, num_points)`` is predicted with a
  one-line warning (the model was trained on ``num_points`` points per shape).
- ShapeNetPart trains on the release's coordinates as they are (no centring or scaling: the
  release is normalised per shape), so the checkpoint records each category's training frame
  (:func:`frame_record`, ``data_state.shape_frame``) and a new shape whose centre or radius
  lies far outside it is a one-line warning naming the value, the trained range and the
  remedy; ``match_frame`` (``--match-frame``) maps it into the frame instead
  (:func:`place_in_frame`).

Centre and radius are those of :class:`~sciformer.data.transforms.NormalizeScale`: the mean
of the points and the largest distance from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from sciformer.data.transforms.geometric import shape_extent
from sciformer.errors import DataError
from sciformer.frontend import option

# Fewer distinct points than this (or than the training num_points, if smaller) is a warning.
# Measured on ModelNet10 (a 256-point model, 100 test shapes): accuracy 0.85 with 256 distinct
# points, 0.77 with 128, 0.50 with 64, 0.24 with 32; ShapeNetPart parts (20 shapes): point
# accuracy 0.86 with 256, 0.84 with 128, 0.61 with 64, 0.47 with 16.
FEW_POINTS = 128
# A radius below RADIUS_SLACK[0] x the smallest training radius or above RADIUS_SLACK[1] x the
# largest is a warning. Measured (ShapeNetPart, training radii all 1, point accuracy 0.895):
# x0.5 0.744, x0.67 0.851, x0.8 0.889, x1.25 0.884, x1.5 0.852, x2 0.769 (training scales by 0.8..1.25).
RADIUS_SLACK = (0.75, 1.33)
# A centre farther from the training shapes' centre than their own spread plus CENTRE_SLACK x the
# typical radius is a warning. Measured (as above): moved by 0.1 radius 0.893, by 0.25 along the
# up axis 0.548, by 0.5 0.325.
CENTRE_SLACK = 0.15


def check_degenerate(coord: np.ndarray, num_points: int, source: str) -> None:
    """Refuse a shape whose points all coincide; warn when it has fewer than
    ``min(FEW_POINTS, num_points)`` distinct points (``num_points``: what training gave each shape).
    Points with NaN or Inf are left out (their readers and predictors say what becomes of them).

    Shapes: coord (n, 3).
    """
    coord = np.asarray(coord, dtype=np.float64)  # (n, 3)
    coord = coord[np.isfinite(coord).all(axis=1)]  # (m, 3)
    if not len(coord):
        return
    distinct = len(np.unique(coord, axis=0))
    if distinct == 1:  # radius 0 (their mean may differ from them by a rounding error: never scaled up to a shape)
        raise DataError(f"{source}: all {len(coord)} points lie at one location {_fmt(coord[0])}: "
                        "no shape to predict")
    if distinct < min(FEW_POINTS, num_points):
        warnings.warn(f"{source}: only {distinct} distinct points (the model was trained on shapes of "
                      f"num_points={num_points}); the prediction is unreliable below {min(FEW_POINTS, num_points)}",
                      stacklevel=2)


def frame_record(shapes: Iterable[tuple[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Each category's training frame from its shapes' coordinates: ``shapes`` (the median of their
    centres, per axis), ``offset`` (the farthest centre from it), ``radius`` ([smallest, median,
    largest]) and the shape count; plain floats, as a checkpoint stores them.

    Shapes: each coord (n, 3), n > 0.
    """
    extents: dict[str, list[tuple[np.ndarray, float]]] = {}
    for category, coord in shapes:
        extents.setdefault(category, []).append(shape_extent(np.asarray(coord, dtype=np.float64)))
    out = {}
    for category, items in extents.items():
        centres = np.array([c for c, _ in items])  # (S, 3)
        radii = np.array([r for _, r in items])  # (S,)
        middle = np.median(centres, axis=0)  # (3,)
        out[category] = {
            "shapes": len(items),
            "centre": [float(v) for v in middle],
            "offset": float(np.linalg.norm(centres - middle, axis=1).max()),
            "radius": [float(radii.min()), float(np.median(radii)), float(radii.max())],
        }
    return out


def place_in_frame(record: dict[str, Any] | None, category: str, coord: np.ndarray, shape_rows: np.ndarray,
                   source: str, *, match: bool) -> np.ndarray:
    """``coord`` as the model is to see it: mapped into ``category``'s training frame when ``match``
    (the shape's centre to the training centre, its radius to the median training radius), else as
    given, with a one-line warning when its centre or radius lies far outside the frame.

    ``record`` is ``data_state.shape_frame`` (None: a checkpoint from before it was recorded, whose
    frame is not checked); the centre and radius are those of ``coord[shape_rows]`` (the shape,
    without detached outliers), the mapping applies to every row.

    Shapes: coord (n, 3), shape_rows (m,) with m > 0 -> (n, 3).
    """
    frame = None if record is None else record.get(category)
    if frame is None:
        why = ("the checkpoint records no training frame (trained before it was recorded)" if record is None
               else f"the model was trained on no {category} shapes")
        if match:
            raise DataError(f"{source}: {option('--match-frame')} needs the {category} training shapes' frame, but {why}; "
                            "centre and scale the shape as the training shapes were")
        warnings.warn(f"{source}: {why}, so the shape's centre and scale are not checked", stacklevel=2)
        return coord
    centre, radius = shape_extent(np.asarray(coord[shape_rows], dtype=np.float64))
    trained = np.asarray(frame["centre"], dtype=np.float64)  # (3,)
    low, typical, high = (float(v) for v in frame["radius"])
    if match:
        return (coord - centre) * (typical / radius) + trained  # (n, 3)
    problems = []
    if radius < RADIUS_SLACK[0] * low or radius > RADIUS_SLACK[1] * high:
        problems.append(f"radius {radius:.4g} (trained {low:.3g}..{high:.3g})")
    away = float(np.linalg.norm(centre - trained))
    if away > float(frame["offset"]) + CENTRE_SLACK * typical:
        problems.append(f"centre {_fmt(centre, typical)} ({away:.3g} from the trained {_fmt(trained, typical)}, "
                        f"whose shapes lie within {_fmt([frame['offset']], typical)[1:-1]})")
    if problems:
        verb = "lie" if len(problems) > 1 else "lies"
        warnings.warn(f"{source}: the shape's {' and '.join(problems)} {verb} far outside the {category} training shapes' frame, "
                      f"so its parts are likely wrong; give it in the training units and frame, or pass "
                      f"{option('--match-frame')} to centre it there and scale it to radius {typical:.3g}", stacklevel=2)
    return coord


def _fmt(point: Any, scale: float = 0.0) -> str:
    """``(x, y, z)`` in 4 digits; values below a millionth of ``scale`` (a rounding error) as 0."""
    return "(" + ", ".join(f"{float(v) if abs(float(v)) >= 1e-6 * scale else 0.0:.4g}" for v in point) + ")"
