"""Readers and writers of point-cloud files, in plain numpy.

:func:`read_point_file` reads one file into a dict of arrays with standard keys:

- ``coord`` (n, 3) float64: kept in double so georeferenced coordinates (LAS) survive;
  recentre before casting to float32.
- ``colour`` (n, 3) float32 in [0, 1] (8-bit values / 255, 16-bit values / 65535).
- ``normal`` (n, 3) float32.
- ``intensity`` (n,) float32, raw values as stored.
- ``label`` (n,) int64 from a ``label`` / ``class`` / ``classification`` field.
- ``faces`` (m, 3) int64 triangle indices (meshes: ``.off``, ``.ply`` with faces).
- any other per-point scalar field of a PLY/PCD file under its own name.

Formats: PLY (ascii, binary_little_endian, binary_big_endian), PCD (ascii, binary,
binary_compressed with a built-in LZF decoder), text tables (.xyz .txt .pts .csv),
.npy/.npz, OFF meshes (with the ModelNet quirk ``OFF3514 3546 0`` on one line) and
LAS/LAZ (laspy; ``pip install "laspy[lazrs]"`` for .laz). open3d is never required: when
installed it reads compressed PCD files (:mod:`sciformer.data.pointcloud.open3d_io`).

:func:`write_ply` writes binary little-endian PLY atomically; :func:`sample_mesh_surface`
samples points uniformly on a triangle mesh.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sciformer.data.pointcloud.fields import (
    PointData,
    check_labels,
    check_points,
    fail,
    from_named_columns,
    numeric,
    scale_colour,
)
from sciformer.data.pointcloud.las import las_has_rgb, read_las
from sciformer.data.pointcloud.mesh import read_off, sample_mesh_surface
from sciformer.data.pointcloud.open3d_io import read_with_open3d
from sciformer.data.pointcloud.pcd import lzf_decompress, read_pcd
from sciformer.data.pointcloud.ply import read_ply, write_ply
from sciformer.errors import DataError
from sciformer.utils.limits import check_bytes, check_npy, npz_members, read_errors, regular_file

POINT_SUFFIXES = (".ply", ".pcd", ".xyz", ".txt", ".pts", ".csv", ".npy", ".npz", ".off", ".las", ".laz", ".bin")
BIN_DTYPES = ("float32", "float64", "int16", "int32", "uint8", "uint16", "uint32")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?(nan|inf)$", re.IGNORECASE)


def _split_line(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return line.split()
    return [t.strip() for t in line.split(delimiter)]


def parse_text_table(
    path: Path | str,
    ncols: int | None = None,
    *,
    delimiter: str | None = "auto",
    skip_rows: int = 0,
    malformed: str = "error",
    allow_nonfinite: bool = False,
) -> tuple[np.ndarray, list[int]]:
    """Parse a numeric text table into a float64 array.

    ``ncols`` is the expected number of columns (None: taken from the first row).
    ``delimiter``: ``"auto"`` (comma, semicolon or whitespace from the first row),
    None (whitespace) or a character. Lines starting with ``#`` or ``//`` and blank
    lines are ignored. ``malformed``: ``"error"`` raises a DataError naming
    ``file:line``; ``"skip"`` drops bad lines and returns their 1-based numbers.
    ``allow_nonfinite`` accepts ``nan`` / ``inf`` values (kept as such) in a well-formed table.

    Shapes: returns ``(rows (n, ncols), skipped line numbers)``.
    """
    path = Path(path)
    if malformed not in ("error", "skip"):
        raise ValueError(f"malformed must be 'error' or 'skip', not {malformed!r}")
    with read_errors(path), open(path, encoding="utf-8-sig", errors="replace") as fh:  # -sig: a byte-order mark is dropped
        first, first_line = next(((i, line) for i, line in enumerate(fh) if i >= skip_rows and line.strip()
                                  and not line.lstrip().startswith(("#", "//"))), (None, ""))
        if first is None:
            raise fail(path, "empty point cloud (no data lines)")
        if delimiter == "auto":
            delimiter = "," if "," in first_line else (";" if ";" in first_line else None)
        if ncols is None:
            ncols = len(_split_line(first_line, delimiter))
        # Fast path: numpy's C parser streaming the file from its first data line (the text is never held whole)
        try:
            fh.seek(0)
            rows = np.loadtxt(fh, dtype=np.float64, delimiter=delimiter, comments=("#", "//"), ndmin=2,
                              skiprows=first)  # (n, ncols)
            if rows.shape[1] == ncols and (allow_nonfinite or np.all(np.isfinite(rows))):  # nan/inf only when asked
                return rows, []
        except ValueError:
            pass
    # Slow path (a malformed or non-finite line): a whole-line pattern finds the bad lines; numpy parses the rest.
    with read_errors(path):
        text = path.read_bytes().decode("utf-8-sig", errors="replace")
    # lines end where the fast path's do: at \n, \r\n or \r only (a form feed, NEL or LS is no line break)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    first = next(
        (i for i in range(skip_rows, len(lines)) if lines[i].strip() and not lines[i].lstrip().startswith(("#", "//"))),
        None,
    )
    if first is None:
        raise fail(path, "empty point cloud (no data lines)")
    number = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
    sep = r"\s+" if delimiter is None else r"\s*" + re.escape(delimiter) + r"\s*"
    row_pattern = re.compile(r"\s*" + number + (sep + number) * (ncols - 1) + r"\s*")
    good: list[str] = []
    good_lines: list[int] = []
    skipped: list[int] = []
    for lineno in range(first, len(lines)):
        line = lines[lineno]
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "//")):
            continue
        if row_pattern.fullmatch(line):
            good.append(line)
            good_lines.append(lineno + 1)
            continue
        if malformed == "error":
            shown = stripped if len(stripped) <= 60 else stripped[:57] + "..."
            raise DataError(f"{path}:{lineno + 1}: expected {ncols} numbers, got {shown!r}")
        skipped.append(lineno + 1)
    if not good:
        raise fail(path, "empty point cloud (no valid data lines)")
    rows = np.loadtxt(good, dtype=np.float64, delimiter=delimiter, ndmin=2)  # (n, ncols)
    finite = np.all(np.isfinite(rows), axis=1)  # (n,) e.g. 1e309 overflows to inf
    if not finite.all():
        bad_rows = np.flatnonzero(~finite)
        if malformed == "error":
            raise fail(path, f"{len(bad_rows)} line(s) hold numbers beyond float64 (first: {good[bad_rows[0]].strip()[:60]!r})")
        rows = rows[finite]
        skipped = sorted(skipped + [good_lines[i] for i in bad_rows])
        if not len(rows):
            raise fail(path, "empty point cloud (no valid data lines)")
    return rows, skipped


_COLUMN_ALIASES = {
    "r": "red", "g": "green", "b": "blue", "i": "intensity", "class": "label",
    "classification": "label", "normal_x": "nx", "normal_y": "ny", "normal_z": "nz",
}


def _guess_columns(path: Path | str, table: np.ndarray) -> list[str]:
    """Column names of an unlabelled numeric table from its width and values."""
    ncols = table.shape[1]
    names = ["x", "y", "z"]
    if ncols == 3:
        return names
    if Path(path).suffix.lower() == ".pts" and ncols in (4, 7):  # Leica PTS: x y z intensity [r g b]
        return names + ["intensity"] + (["red", "green", "blue"] if ncols == 7 else [])
    if ncols == 4:
        scalar = table[:, 3]
        return names + (["label"] if np.all(scalar == np.round(scalar)) else ["intensity"])
    if ncols in (6, 7):
        extra = table[:, 3:6]  # (n, 3)
        extra = extra[np.isfinite(table).all(axis=1)]  # a NaN row (kept for prediction) does not decide the columns
        norms = np.linalg.norm(extra, axis=1)
        is_normal = bool(np.all(np.abs(norms - 1.0) < 1e-2) or np.all(np.abs(extra) <= 1.0) and np.any(extra < 0))
        names += ["nx", "ny", "nz"] if is_normal else ["red", "green", "blue"]
        if ncols == 7:
            names.append("label")
        return names
    raise fail(
        path,
        f"cannot tell what the {ncols} columns are; pass columns=[...] "
        "(names: x y z nx ny nz red green blue intensity label, '_' to skip)",
    )


def _read_table(path: Path, columns: Sequence[str] | None, keep_invalid: bool = False) -> PointData:
    skip = 0
    header: list[str] | None = None
    with open(path, encoding="utf-8-sig", errors="replace") as fh:  # -sig: a byte-order mark (Excel's CSV) is not a name
        head = [fh.readline() for _ in range(2)]
    first = head[0].strip()
    tokens = [t for t in re.split(r"[,;\s]+", first.lstrip("/").strip()) if t]
    if first.startswith("#"):
        pass  # a comment line; parse_text_table skips it
    elif tokens and not all(_NUMBER.match(t) for t in tokens):
        header = [t.lower() for t in tokens]  # e.g. CloudCompare '//X,Y,Z,R,G,B'
        skip = 1
    elif len(tokens) == 1 and tokens[0].isdigit() and len(head[1].split()) >= 3:
        skip = 1  # a point-count line
    table, _ = parse_text_table(path, skip_rows=skip, allow_nonfinite=keep_invalid)  # (n, c)
    names = [c.lower() for c in columns] if columns is not None else header or _guess_columns(path, table)
    if len(names) != table.shape[1]:
        raise fail(path, f"{table.shape[1]} columns but {len(names)} column names {names}")
    named = {}
    for i, name in enumerate(names):
        if name != "_":
            named[_COLUMN_ALIASES.get(name, name)] = table[:, i]
    return from_named_columns(path, named)


def _read_numpy(path: Path, columns: Sequence[str] | None) -> PointData:
    try:
        if path.suffix.lower() != ".npz":
            check_npy(path)  # the magic and a numeric dtype, before numpy guesses (it calls any other file pickled)
        # mmap: a header promising more data than the file holds fails here instead of allocating it
        with np.errstate(over="raise"):  # a shape whose byte size overflows: one error, not a warning first
            loaded = np.load(path, mmap_mode="r", allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):  # a zip whatever its suffix; opening it inflated nothing
            with loaded:
                # array members' headers against the memory budget, before inflating any; others are never read
                arrays = {k: loaded[k] for k in npz_members(path)}
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy reports damage as ValueError, SyntaxError, EOFError, MemoryError, ...
        raise fail(path, f"cannot read numpy file ({type(exc).__name__}: {_short(exc)})") from exc
    if isinstance(loaded, np.lib.npyio.NpzFile):
        aliases = {"coord": ("coord", "xyz", "points", "pos", "positions"),
                   "colour": ("colour", "color", "rgb", "colors"),
                   "normal": ("normal", "normals"),
                   "intensity": ("intensity",),
                   "label": ("label", "labels", "segment", "seg", "class", "classification")}
        out: PointData = {}
        for key, names in aliases.items():
            found = next((n for n in names if n in arrays), None)
            if found is not None:
                out[key] = arrays.pop(found) if key == "label" else numeric(path, arrays.pop(found), f"array '{found}'")
        if "coord" not in out:
            if len(arrays) == 1:
                return _table_to_points(path, next(iter(arrays.values())), columns)
            raise fail(path, f"no coordinate array (expected key 'coord' or 'xyz'; keys: {', '.join(sorted(arrays))})")
        out["coord"] = np.asarray(out["coord"], dtype=np.float64)
        if "colour" in out:
            out["colour"] = scale_colour(out["colour"])
        for key, dt in (("normal", np.float32), ("intensity", np.float32)):
            if key in out:
                out[key] = np.asarray(out[key]).astype(dt)
        if "label" in out:
            out["label"] = check_labels(path, out["label"], "array 'label'")
        n = out["coord"].shape[0] if out["coord"].ndim == 2 else -1
        for key, value in arrays.items():
            if value.ndim >= 1 and value.shape[0] == n:
                out[key] = value
        for key in ("colour", "normal", "intensity", "label"):
            if key in out and out[key].shape[0] != n:
                raise fail(path, f"'{key}' has {out[key].shape[0]} rows, coordinates have {n}")
        return out
    return _table_to_points(path, loaded, columns)


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _table_to_points(path: Path, table: np.ndarray, columns: Sequence[str] | None) -> PointData:
    if table.dtype.names:
        return from_named_columns(path, {name: table[name] for name in table.dtype.names})
    numeric(path, table, "array")
    if table.ndim != 2 or table.shape[1] < 3:
        raise fail(path, f"array has shape {table.shape}, expected (n, >=3)")
    names = [c.lower() for c in columns] if columns is not None else _guess_columns(path, table)
    if len(names) != table.shape[1]:
        raise fail(path, f"{table.shape[1]} columns but {len(names)} column names {names}")
    return from_named_columns(path, {_COLUMN_ALIASES.get(n, n): table[:, i] for i, n in enumerate(names) if n != "_"})


def parse_columns(spec: str | Sequence[str] | None, where: str = "--columns") -> tuple[list[str] | None, str]:
    """``"x,y,z,intensity"`` or ``"x,y,z,intensity:float64"`` (or a list) -> (names, binary dtype).

    The optional ``:dtype`` after the last name sets the record type of raw ``.bin``
    scans (default float32, KITTI's layout); names as in :func:`read_point_file`.
    """
    if spec is None:
        return None, "float32"
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    dtype = "float32"
    if names and ":" in names[-1]:
        names[-1], dtype = (t.strip() for t in names[-1].split(":", 1))
    if dtype not in BIN_DTYPES:
        raise DataError(f"{where}: unknown record type '{dtype}'; expected one of {', '.join(BIN_DTYPES)}")
    if len(names) < 3 or any(not n for n in names):
        raise DataError(f"{where}: expected at least 3 comma-separated column names (e.g. x,y,z,intensity), got {spec!r}")
    return [n.lower() for n in names], dtype


def _read_bin(path: Path, columns: Sequence[str] | None, dtype: str) -> PointData:
    """A raw scan of fixed-size records (KITTI Velodyne: x, y, z, intensity as float32)."""
    if columns is None:
        raise fail(path, "a raw .bin scan has no header; name its columns, e.g. --columns x,y,z,intensity "
                         "(or data.columns: [x, y, z, intensity]; add ':float64' for double records)")
    width = len(columns) * np.dtype(dtype).itemsize
    size = path.stat().st_size
    check_bytes(size, str(path), "scan")
    if size == 0:
        raise fail(path, f"the scan is empty (0 bytes); expected {len(columns)}-column {dtype} records ({width} bytes each)")
    if size % width:
        raise fail(path, f"{size} bytes is not a whole number of {len(columns)}-column {dtype} records ({width} bytes each)")
    table = np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<")).reshape(-1, len(columns))  # (n, c)
    return from_named_columns(path, {_COLUMN_ALIASES.get(n, n): table[:, i] for i, n in enumerate(columns) if n != "_"})


def read_point_file(path: str | os.PathLike[str], columns: Sequence[str] | str | None = None, *,
                    keep_invalid: bool = False) -> PointData:
    """Read a point-cloud (or mesh) file into a dict of arrays (see module docstring).

    ``columns`` names the columns of text tables and plain ``.npy`` arrays
    (``x y z nx ny nz red green blue intensity label``, ``_`` to skip one); without
    it, a header row is used if present, else the layout is guessed from the width
    (3: xyz; 4: xyz + label/intensity; 6: xyz + normals or colour; 7: ... + label).
    OFF meshes return their vertices as ``coord`` plus ``faces``. Raw ``.bin`` scans need
    ``columns`` (a list, or a string as in :func:`parse_columns`).

    ``keep_invalid=True`` keeps points with NaN/Inf coordinates (e.g. the holes of an
    organised Kinect PCD) in file order, for callers that mask them; by default they
    are an error (and dropped from PCD files).
    """
    path = Path(path)
    columns, bin_dtype = parse_columns(columns, "columns")
    if not path.exists():
        raise DataError(f"{path}: no such file")
    regular_file(path, "point-cloud file")  # a folder, a FIFO (would hang) or a device (would never end)
    with read_errors(path):  # an OS error of any reader (EIO, no permission): one line naming the file
        data = _read_by_suffix(path, columns, bin_dtype, keep_invalid)
    if keep_invalid:
        coord = data["coord"]
        if coord.ndim != 2 or coord.shape[1] != 3 or coord.shape[0] == 0:
            return check_points(path, data)  # the shape errors
        return data
    return check_points(path, data)


def _read_by_suffix(path: Path, columns: list[str] | None, bin_dtype: str, keep_invalid: bool) -> PointData:
    """The reader of ``path``'s suffix, its arrays unchecked."""
    suffix = path.suffix.lower()
    fast = read_with_open3d(path, keep_invalid) if suffix == ".pcd" else None  # compressed PCD: open3d when installed
    if fast is not None:
        data = fast
    elif suffix == ".ply":
        data = read_ply(path)
    elif suffix == ".pcd":
        data = read_pcd(path, keep_invalid=keep_invalid)
    elif suffix == ".bin":
        data = _read_bin(path, columns, bin_dtype)
    elif suffix in (".xyz", ".txt", ".pts", ".csv"):
        data = _read_table(path, columns, keep_invalid)
    elif suffix in (".npy", ".npz"):
        data = _read_numpy(path, columns)
    elif suffix == ".off":
        vertices, faces = read_off(path)
        data = {"coord": vertices, "faces": faces}
    elif suffix in (".las", ".laz"):
        data = read_las(path)
    else:
        raise DataError(f"{path}: unknown point-cloud suffix '{suffix}'; expected one of {', '.join(POINT_SUFFIXES)}")
    return data


__all__ = [
    "BIN_DTYPES",
    "POINT_SUFFIXES",
    "PointData",
    "las_has_rgb",
    "lzf_decompress",
    "parse_columns",
    "parse_text_table",
    "read_off",
    "read_point_file",
    "sample_mesh_surface",
    "write_ply",
]
