"""LAS/LAZ files through laspy (``pip install "laspy[lazrs]"`` for .laz)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sciformer.data.pointcloud._fields import PointData, fail, scale_colour

def read_las(path: Path) -> PointData:
    try:
        import laspy
    except ImportError as exc:  # pragma: no cover - laspy is a declared extra
        raise fail(path, 'reading LAS/LAZ needs laspy: pip install "laspy[lazrs]"') from exc
    try:
        las = laspy.read(path)
    except Exception as exc:  # laspy raises several types (LaspyException, lazrs errors)
        raise fail(path, f"cannot read LAS/LAZ ({type(exc).__name__}: {exc})") from exc
    coord = np.stack([np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)], axis=1)  # (n, 3) float64
    out: PointData = {"coord": coord.astype(np.float64)}
    dims = set(las.point_format.dimension_names)
    if {"red", "green", "blue"} <= dims:
        rgb = np.stack([np.asarray(las.red), np.asarray(las.green), np.asarray(las.blue)], axis=1)  # (n, 3) uint16
        out["colour"] = scale_colour(rgb)
    out["intensity"] = np.asarray(las.intensity, dtype=np.float32)  # (n,)
    out["label"] = np.asarray(las.classification, dtype=np.int64)  # (n,) ASPRS codes
    return out


def las_has_rgb(path: str | os.PathLike[str]) -> bool:
    """Whether a LAS/LAZ file's point format stores red/green/blue (header only)."""
    import laspy

    try:
        with laspy.open(path) as reader:
            return {"red", "green", "blue"} <= set(reader.header.point_format.dimension_names)
    except Exception as exc:
        raise fail(path, f"cannot read LAS/LAZ header ({type(exc).__name__}: {exc})") from exc
