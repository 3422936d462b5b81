"""open3d as the fast reader of plain PLY / PCD point files, when it is installed.

:func:`read_with_open3d` reads a file with open3d's C++ readers when the file holds only
what open3d reads losslessly (x, y, z, normals, 8-bit colour; one ``vertex`` element for
PLY, single-count fields for PCD), is binary (ASCII files stay with the pure readers, which
tell a short file from a full one) and its header agrees with its size; otherwise (or
without open3d, or with ``SCIFORMER_NO_OPEN3D=1``) it returns None and the pure readers
of :mod:`sciformer.data.pointcloud.ply` / :mod:`~sciformer.data.pointcloud.pcd` read it.
Both give identical arrays (``coord`` float64, ``normal`` float32, ``colour`` float32 =
value / 255); a test checks it on real scans. The gain is largest on compressed PCD
(the pure LZF decoder is Python).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

from sciformer.data.pointcloud.fields import PointData

_PLY_FIELDS = {"x", "y", "z", "nx", "ny", "nz", "red", "green", "blue"}
_PCD_FIELDS = {"x", "y", "z", "normal_x", "normal_y", "normal_z", "rgb"}
_PLY_SIZES = {"char": 1, "int8": 1, "uchar": 1, "uint8": 1, "short": 2, "int16": 2, "ushort": 2, "uint16": 2,
              "int": 4, "int32": 4, "uint": 4, "uint32": 4, "float": 4, "float32": 4, "double": 8, "float64": 8}
_FLOATS = {"float", "float32", "double", "float64"}


def open3d_available() -> bool:
    """True when open3d is importable and not disabled by ``SCIFORMER_NO_OPEN3D=1``."""
    if os.environ.get("SCIFORMER_NO_OPEN3D", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("open3d") is not None


def _ply_plan(path: Path) -> tuple[bool, bool, int, bool] | None:
    """(has normals, has colour, points, float32 coordinates) if open3d reads this PLY exactly, else None."""
    with open(path, "rb") as fh:
        if fh.readline().strip() != b"ply":
            return None
        fmt, elements, props = "", [], []
        for _ in range(200):
            words = fh.readline().decode("ascii", errors="replace").split()
            if not words or words[0] in ("comment", "obj_info"):
                continue
            if words[0] == "format":
                fmt = words[1] if len(words) > 1 else ""
            elif words[0] == "element" and len(words) == 3:
                elements.append((words[1], int(words[2]) if words[2].isdigit() else -1))
            elif words[0] == "property":
                if len(elements) != 1 or len(words) != 3 or words[1] not in _PLY_SIZES:
                    return None  # a list property, or a property of another element
                props.append((words[2], words[1]))
            elif words[0] == "end_header":
                break
        else:
            return None
        start = fh.tell()
    names = {n for n, _ in props}
    if len(elements) != 1 or elements[0][0] != "vertex" or elements[0][1] <= 0 or len(names) != len(props):
        return None
    types = dict(props)
    if not {"x", "y", "z"} <= names <= _PLY_FIELDS or any(types[c] not in _FLOATS for c in ("x", "y", "z")):
        return None
    colour = {"red", "green", "blue"} <= names
    normal = {"nx", "ny", "nz"} <= names
    if (names & {"red", "green", "blue"} and not colour) or (names & {"nx", "ny", "nz"} and not normal):
        return None
    if colour and any(types[c] not in ("uchar", "uint8") for c in ("red", "green", "blue")):
        return None
    if normal and any(types[c] not in _FLOATS for c in ("nx", "ny", "nz")):
        return None
    if not fmt.startswith("binary"):
        return None  # ASCII: open3d cannot tell a short file from a full one (and prints to stderr)
    record = sum(_PLY_SIZES[t] for _, t in props)
    if path.stat().st_size < start + record * elements[0][1]:
        return None  # truncated: the pure reader says so in one line
    return normal, colour, elements[0][1], types["x"] in ("float", "float32")


def _pcd_plan(path: Path) -> tuple[bool, bool, int, bool] | None:
    """(has normals, has colour, points, float32 coordinates) if open3d reads this PCD exactly, else None."""
    header: dict[str, list[str]] = {}
    with open(path, "rb") as fh:
        for _ in range(200):
            raw = fh.readline()
            if not raw:
                return None
            words = raw.decode("ascii", errors="replace").split()
            if not words or words[0].startswith("#"):
                continue
            header[words[0].upper()] = words[1:]
            if words[0].upper() == "DATA":
                break
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
    """The arrays of a plain PLY / PCD file read by open3d, or None (use the pure reader).

    PCD points with non-finite coordinates are dropped unless ``keep_invalid``, as the pure
    reader does; PLY points are kept (the caller checks them).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".ply", ".pcd") or not open3d_available():
        return None
    try:
        plan = _ply_plan(path) if suffix == ".ply" else _pcd_plan(path)
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
    if suffix == ".pcd" and not keep_invalid:
        keep = np.all(np.isfinite(coord), axis=1)  # organised clouds mark holes with NaN
        if not keep.all():
            out = {k: v[keep] for k, v in out.items()}
    return out


__all__ = ["open3d_available", "read_with_open3d"]
