"""open3d as the fast reader of compressed PCD files, when it is installed.

Measured (``benchmarks/bench_point_io.py``, 1M real points): sciformer's pure readers read
binary PLY and binary PCD with numpy faster than open3d does, but its LZF decoder is Python,
so open3d reads ``binary_compressed`` PCD about 6x faster. :func:`read_with_open3d`
therefore reads a PCD file with open3d when it is ``binary_compressed``, holds only what
open3d reads losslessly (x, y, z, normals, 8-bit ``rgb``; single-count float fields) and
its header agrees with its size; otherwise (or without open3d, or with
``SCIFORMER_NO_OPEN3D=1``) it returns None and :mod:`sciformer.data.pointcloud.pcd` reads
it. Both give identical arrays (``coord`` float64, ``normal`` float32, ``colour`` float32
= value / 255); a test checks it on real scans.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

from sciformer.data.pointcloud.fields import PointData
from sciformer.data.pointcloud.pcd import read_pcd_header

_PCD_FIELDS = {"x", "y", "z", "normal_x", "normal_y", "normal_z", "rgb"}


def open3d_available() -> bool:
    """True when open3d is importable and not disabled by ``SCIFORMER_NO_OPEN3D=1``."""
    if os.environ.get("SCIFORMER_NO_OPEN3D", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("open3d") is not None


def _pcd_plan(path: Path, compressed_only: bool = False) -> tuple[bool, bool, int, bool] | None:
    """(has normals, has colour, points, float32 coordinates) if open3d reads this PCD exactly, else None."""
    with open(path, "rb") as fh:
        header = read_pcd_header(fh)
        if header is None:
            return None
        start = fh.tell()
        head8 = fh.read(8)
    try:
        fields, sizes, types = header["FIELDS"], [int(s) for s in header["SIZE"]], [t.upper() for t in header["TYPE"]]
        counts = [int(c) for c in header.get("COUNT", ["1"] * len(fields))]
        npoints = int(header["POINTS"][0])
        mode = header["DATA"][0].lower()
    except (KeyError, IndexError, ValueError):
        return None
    if npoints <= 0 or any(c != 1 for c in counts) or len(set(fields)) != len(fields) or not (len(fields) == len(sizes) == len(types)):
        return None
    if not {"x", "y", "z"} <= set(fields) <= _PCD_FIELDS:
        return None
    kind = dict(zip(fields, zip(types, sizes, strict=True), strict=True))
    if any(kind[c] not in (("F", 4), ("F", 8)) for c in fields if c != "rgb") or ("rgb" in kind and kind["rgb"] not in (("F", 4), ("U", 4))):
        return None  # anything else: the pure reader reads it or says why not
    normal = {"normal_x", "normal_y", "normal_z"} <= set(fields)
    if set(fields) & {"normal_x", "normal_y", "normal_z"} and not normal:
        return None
    if compressed_only and mode != "binary_compressed":
        return None  # numpy reads uncompressed binary faster than open3d (benchmarks/bench_point_io.py)
    record = sum(sizes)
    size = path.stat().st_size
    if mode == "binary" and size < start + record * npoints:
        return None
    if mode == "binary_compressed":
        if len(head8) < 8:
            return None
        csize, usize = (int(v) for v in np.frombuffer(head8, dtype="<u4"))
        if usize != record * npoints or size < start + 8 + csize:
            return None
    elif mode != "binary":
        return None  # ASCII: a short file is not told apart; the pure reader checks it
    return normal, "rgb" in fields, npoints, kind["x"][1] == 4


def read_with_open3d(path: Path, keep_invalid: bool = False) -> PointData | None:
    """The arrays of a compressed PCD file read by open3d, or None (use the pure reader).

    Points with non-finite coordinates are dropped unless ``keep_invalid``, as the pure
    reader does.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix != ".pcd" or not open3d_available():
        return None
    try:
        plan = _pcd_plan(path, compressed_only=True)
    except (OSError, ValueError):
        return None
    if plan is None:
        return None
    import open3d as o3d

    has_normal, has_colour, npoints, single = plan
    cloud = o3d.io.read_point_cloud(str(path), format=suffix[1:], remove_nan_points=False, remove_infinite_points=False)
    coord = np.asarray(cloud.points, dtype=np.float64)  # (n, 3)
    if coord.ndim != 2 or coord.shape[0] != npoints or (has_normal and not cloud.has_normals()) or (has_colour and not cloud.has_colors()):
        return None  # open3d could not read it: the pure reader reports why
    if single:  # declared float32: text values round as the pure readers round them
        coord = coord.astype(np.float32).astype(np.float64)
    out: PointData = {"coord": coord}
    if has_normal:
        out["normal"] = np.asarray(cloud.normals).astype(np.float32)  # (n, 3)
    if has_colour:
        out["colour"] = np.asarray(cloud.colors).astype(np.float32)  # (n, 3) value / 255
    if not keep_invalid:
        keep = np.all(np.isfinite(coord), axis=1)  # organised clouds mark holes with NaN
        if not keep.all():
            out = {k: v[keep] for k, v in out.items()}
    return out


__all__ = ["open3d_available", "read_with_open3d"]
