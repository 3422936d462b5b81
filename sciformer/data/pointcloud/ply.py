"""PLY files: reader (ascii, binary little/big endian; vertices and faces) and writer.

:func:`write_ply` writes binary little-endian PLY atomically, the format prediction
files use (x, y, z, colour, predicted and true labels).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.pointcloud.fields import (
    PointData,
    cast_text_values,
    face_indices,
    fail,
    from_named_columns,
    triangulate,
)
from sciformer.errors import DataError
from sciformer.utils.atomic import atomic_write_bytes
from sciformer.utils.limits import check_bytes, header_line

_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
    "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}


def _ply_header(path: Path, fh: Any) -> tuple[str, list[dict[str, Any]]]:
    if header_line(fh, path).strip() != b"ply":
        raise fail(path, "not a PLY file (first line is not 'ply')")
    fmt = None
    elements: list[dict[str, Any]] = []
    for lineno in range(2, 10_000):
        raw = header_line(fh, path)
        if not raw:
            raise fail(path, "PLY header has no 'end_header'")
        words = raw.decode("ascii", errors="replace").split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "end_header":
            break
        try:
            if words[0] == "format":
                fmt = words[1]
            elif words[0] == "element":
                if int(words[2]) < 0:
                    raise ValueError("negative count")
                elements.append({"name": words[1], "count": int(words[2]), "props": []})
            elif words[0] == "property":
                if words[1] == "list":
                    elements[-1]["props"].append((words[4], "list", _PLY_TYPES[words[2]], _PLY_TYPES[words[3]]))
                else:
                    elements[-1]["props"].append((words[2], _PLY_TYPES[words[1]]))
            else:
                raise KeyError(words[0])
        except (IndexError, KeyError, ValueError) as exc:
            raise DataError(f"{path}:{lineno}: bad PLY header line {' '.join(words)!r}") from exc
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise fail(path, f"unknown PLY format {fmt!r}; expected ascii, binary_little_endian or binary_big_endian")
    for el in elements:
        if el["name"] == "vertex" and any(len(p) == 4 for p in el["props"]):
            raise fail(path, "PLY 'vertex' element has a list property; per-vertex lists are not supported")
        names = [p[0] for p in el["props"]]
        if len(set(names)) != len(names):
            raise fail(path, f"PLY element '{el['name']}' repeats a property name ({', '.join(names)})")
    return fmt, elements


def _ply_read_binary(path: Path, fh: Any, fmt: str, elements: list[dict[str, Any]]) -> dict[str, Any]:
    order = "<" if fmt == "binary_little_endian" else ">"
    data = fh.read()
    pos = 0
    out: dict[str, Any] = {}
    needed = {"vertex", "face"} & {el["name"] for el in elements}
    for el in elements:
        if needed <= out.keys():
            break  # what follows is never used: not walked
        props, count = el["props"], el["count"]
        if all(len(p) == 2 for p in props):
            dtype = np.dtype([(name, order + t) for name, t in props])
            nbytes = dtype.itemsize * count
            if pos + nbytes > len(data):
                raise fail(path, f"truncated PLY: element '{el['name']}' needs {nbytes} bytes, {len(data) - pos} left")
            out[el["name"]] = np.frombuffer(data, dtype=dtype, count=count, offset=pos)
            pos += nbytes
            continue
        if el["name"] == "face" and len(props) == 1:
            _, _, ctype, itype = props[0]
            # Fast path: every face a triangle.
            tri = np.dtype([("n", order + ctype), ("v", order + itype, (3,))])
            nbytes = tri.itemsize * count
            if pos + nbytes <= len(data):
                arr = np.frombuffer(data, dtype=tri, count=count, offset=pos)
                if np.all(arr["n"] == 3):
                    out["face"] = arr["v"].astype(np.int64)  # (m, 3)
                    pos += nbytes
                    continue
        # General path (lists of any length): row offsets walked, the lists then gathered at once
        pos, faces = _ply_list_element(path, data, pos, el, order, keep=el["name"] == "face")
        if faces is not None:
            out["face"] = faces
    return out


def _ply_list_element(path: Path, data: bytes, pos: int, el: dict[str, Any], order: str,
                      keep: bool) -> tuple[int, np.ndarray | None]:
    """Walk the rows of a binary element with list properties from ``pos``; return the position
    after it and, where ``keep``, its first list fanned into triangles (m, 3). Only one offset per
    row is held (8 bytes, checked against the budget), never a Python object per row."""
    count, where = el["count"], f"{path} [PLY element '{el['name']}']"
    steps: list[tuple[int, struct.Struct, int]] = []  # (fixed bytes before, count type, item size) per list
    types: list[tuple[np.dtype, np.dtype]] = []  # (count type, item type) per list
    fixed = 0
    for prop in el["props"]:
        if len(prop) == 2:
            fixed += np.dtype(prop[1]).itemsize
            continue
        ctype, itype = np.dtype(order + prop[2]), np.dtype(order + prop[3])
        if ctype.kind not in "iu":
            raise fail(path, f"PLY list '{prop[0]}' of element '{el['name']}' has a {prop[2]} length; expected an integer type")
        steps.append((fixed, struct.Struct(order + ctype.char), itype.itemsize))
        types.append((ctype, itype))
        fixed = 0
    if keep:
        check_bytes(8.0 * count, where, "row offsets")
    starts = np.zeros(count if keep else 0, dtype=np.int64)  # (count,) where each row's first list count lies
    i, p = 0, pos
    try:
        if len(steps) == 1:  # the usual face: one list (and maybe fixed properties); the loop kept tight
            (before, cstruct, isize), unpack, after = steps[0], steps[0][1].unpack_from, fixed + steps[0][1].size
            for i in range(count):
                n = unpack(data, p + before)[0]
                if n < 0:
                    raise fail(path, f"PLY element '{el['name']}' entry {i} has a negative list length {n}")
                if keep:
                    starts[i] = p + before
                p += before + after + n * isize
        else:
            for i in range(count):
                for j, (before, cstruct, isize) in enumerate(steps):
                    p += before
                    n = cstruct.unpack_from(data, p)[0]
                    if n < 0:
                        raise fail(path, f"PLY element '{el['name']}' entry {i} has a negative list length {n}")
                    if keep and j == 0:
                        starts[i] = p
                    p += cstruct.size + n * isize
                p += fixed
        if p > len(data):
            raise struct.error
    except struct.error:  # a count read past the end of the data
        raise fail(path, f"truncated PLY: element '{el['name']}' ends after {i} of {count} entries") from None
    if not keep:
        return p, None
    (ctype, itype), isize = types[0], steps[0][2]
    counts = _gather(data, starts, ctype, where).astype(np.int64)  # (count,)
    if count and counts.min() < 3:
        raise fail(path, f"face with {counts.min()} vertices, expected at least 3")
    first = np.cumsum(counts) - counts  # (count,) each face's first value in the flat list
    flat = _gather(data, np.repeat(starts + ctype.itemsize, counts)
                   + (np.arange(int(counts.sum())) - np.repeat(first, counts)) * isize, itype, where).astype(np.int64)
    ntri = counts - 2  # (count,) a fan of n - 2 triangles around each face's first vertex
    fan = np.repeat(first, ntri)  # (m,)
    k = np.arange(int(ntri.sum())) - np.repeat(np.cumsum(ntri) - ntri, ntri) + 1  # (m,) 1 .. n-2 in each face
    return p, np.stack([flat[fan], flat[fan + k], flat[fan + k + 1]], axis=1)  # (m, 3)


def _gather(data: bytes, offsets: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    """The values of ``dtype`` at byte ``offsets`` (unaligned) of ``data``, (n,)."""
    check_bytes((8.0 + dtype.itemsize) * offsets.size, where, "list values")
    raw, out = np.frombuffer(data, np.uint8), np.empty((offsets.size, dtype.itemsize), np.uint8)  # (n, itemsize)
    for b in range(dtype.itemsize):
        out[:, b] = raw[offsets + b]
    return out.view(dtype).reshape(-1)  # (n,)


def _ply_read_ascii(path: Path, fh: Any, elements: list[dict[str, Any]]) -> dict[str, Any]:
    lines = fh.read().decode("ascii", errors="replace").splitlines()
    lines = [ln for ln in lines if ln.strip() and not ln.startswith("comment")]
    pos = 0
    out: dict[str, Any] = {}
    for el in elements:
        props, count = el["props"], el["count"]
        block = lines[pos : pos + count]
        if len(block) < count:
            raise fail(path, f"truncated PLY: element '{el['name']}' has {len(block)} of {count} lines")
        if all(len(p) == 2 for p in props):
            if count == 0:  # an empty element (np.loadtxt would warn and guess one column)
                out[el["name"]] = {name: np.zeros(0, dtype=t) for name, t in props}
                continue
            try:
                table = np.loadtxt(block, dtype=np.float64, ndmin=2)  # (count, nprops)
            except ValueError as exc:
                raise fail(path, f"malformed '{el['name']}' line in ascii PLY ({exc})") from exc
            if table.shape[1] < len(props):
                raise fail(path, f"'{el['name']}' lines have {table.shape[1]} values, expected {len(props)}")
            out[el["name"]] = {name: cast_text_values(path, table[:, i], np.dtype(t), f"property '{name}'")
                               for i, (name, t) in enumerate(props)}
        elif el["name"] == "face":
            try:
                faces = [face_indices(path, "PLY", ln) for ln in block]
            except DataError:
                raise
            except ValueError as exc:
                raise fail(path, f"malformed 'face' line in ascii PLY ({exc}); expected 'n i1 ... in'") from exc
            out["face"] = faces
        pos += count
    return out


def read_ply(path: Path) -> PointData:
    with open(path, "rb") as fh:
        fmt, elements = _ply_header(path, fh)
        names = [el["name"] for el in elements]
        if "vertex" not in names:
            raise fail(path, f"PLY has no 'vertex' element (elements: {', '.join(names) or 'none'})")
        raw = _ply_read_ascii(path, fh, elements) if fmt == "ascii" else _ply_read_binary(path, fh, fmt, elements)
    vertex = raw["vertex"]
    if isinstance(vertex, np.ndarray):
        columns = {name: vertex[name].astype(vertex.dtype[name].newbyteorder("=")) for name in vertex.dtype.names}
    else:
        columns = dict(vertex)
    out = from_named_columns(path, columns)
    if "face" in raw and len(raw["face"]):
        faces = triangulate(path, raw["face"])  # (m, 3)
        nv = len(out["coord"])
        if faces.size and (faces.min() < 0 or faces.max() >= nv):
            raise fail(path, f"PLY face index out of range 0..{nv - 1}")
        out["faces"] = faces
    return out


def write_ply(
    path: str | os.PathLike[str],
    coord: np.ndarray,
    colour: np.ndarray | None = None,
    normal: np.ndarray | None = None,
    *,
    comments: Sequence[str] = (),
    **scalar_fields: np.ndarray,
) -> Path:
    """Write points as binary little-endian PLY, atomically (temp file + rename).

    ``coord`` (n, 3) is written as float (float32 input) or double (float64 input);
    ``colour`` (n, 3) as uchar red/green/blue (floats in [0, 1] are scaled by 255);
    ``normal`` (n, 3) as float nx/ny/nz; each ``scalar_fields`` entry (n,) under its
    name (int64 is written as int32, bool as uchar), e.g. ``pred=..., label=...``.
    ``comments`` go into the header as ``comment`` lines (e.g. the class table).
    """
    path = Path(path)
    coord = np.asarray(coord)
    if coord.ndim != 2 or coord.shape[1] != 3:
        raise DataError(f"write_ply {path}: coord has shape {coord.shape}, expected (n, 3)")
    n = coord.shape[0]
    ctype = "f8" if coord.dtype == np.float64 else "f4"
    fields: list[tuple[str, str, np.ndarray]] = [(axis, ctype, coord[:, i]) for i, axis in enumerate("xyz")]
    if normal is not None:
        normal = np.asarray(normal, dtype=np.float32)  # (n, 3)
        if normal.shape != (n, 3):
            raise DataError(f"write_ply {path}: normal has shape {normal.shape}, expected ({n}, 3)")
        fields += [(name, "f4", normal[:, i]) for i, name in enumerate(("nx", "ny", "nz"))]
    if colour is not None:
        colour = np.asarray(colour)  # (n, 3)
        if colour.shape != (n, 3):
            raise DataError(f"write_ply {path}: colour has shape {colour.shape}, expected ({n}, 3)")
        if np.issubdtype(colour.dtype, np.floating):
            colour = np.round(np.clip(colour, 0.0, 1.0) * 255.0)
        colour = np.clip(colour, 0, 255).astype(np.uint8)
        fields += [(name, "u1", colour[:, i]) for i, name in enumerate(("red", "green", "blue"))]
    type_names = {"f4": "float", "f8": "double", "u1": "uchar", "i1": "char", "u2": "ushort",
                  "i2": "short", "u4": "uint", "i4": "int"}
    for name, values in scalar_fields.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise DataError(f"write_ply {path}: field name {name!r} is not a plain identifier")
        values = np.asarray(values)
        if values.shape != (n,):
            raise DataError(f"write_ply {path}: field '{name}' has shape {values.shape}, expected ({n},)")
        if values.dtype == np.bool_:
            values = values.astype(np.uint8)
        elif values.dtype in (np.int64, np.uint64):
            values = values.astype(np.int32)
        elif values.dtype == np.float16:
            values = values.astype(np.float32)
        code = values.dtype.str[1:]
        if code not in type_names:
            raise DataError(f"write_ply {path}: field '{name}' has unsupported dtype {values.dtype}")
        fields.append((name, code, values))
    dtype = np.dtype([(name, "<" + code) for name, code, _ in fields])
    table = np.empty(n, dtype=dtype)
    for name, _, values in fields:
        table[name] = values
    notes = [" ".join(str(c).split()) for c in comments]  # one header line each
    header = ["ply", "format binary_little_endian 1.0", "comment written by sciformer"]
    header += [f"comment {c}" for c in notes] + [f"element vertex {n}"]
    header += [f"property {type_names[code]} {name}" for name, code, _ in fields]
    header.append("end_header")
    payload = ("\n".join(header) + "\n").encode("ascii", errors="replace") + table.tobytes()
    atomic_write_bytes(path, payload)
    return path
