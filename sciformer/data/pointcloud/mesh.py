"""Meshes: OFF reader (with the ModelNet header quirk) and area-weighted surface sampling."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from sciformer.data.pointcloud.fields import COORD_LIMIT, face_indices, fail, triangulate
from sciformer.errors import DataError
from sciformer.utils.limits import read_errors


def read_off(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read an OFF mesh: vertices (v, 3) float64 and triangle faces (m, 3) int64.

    Accepts the ModelNet quirk of counts on the ``OFF`` line (``OFF3514 3546 0``),
    comments and polygons (fan-triangulated). Extra values after a face (colours)
    are ignored.
    """
    path = Path(path)
    with read_errors(path):
        text = path.read_text(encoding="utf-8", errors="replace")
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines or not lines[0].upper().startswith(("OFF", "COFF", "NOFF", "CNOFF")):
        raise fail(path, "not an OFF file (first line does not start with 'OFF')")
    head = lines[0].split(None, 1)[0]
    keyword = re.match(r"[A-Za-z]+", head).group(0)  # type: ignore[union-attr]
    rest = lines[0][len(keyword) :].strip()
    pos = 1
    if not rest:
        if len(lines) < 2:
            raise fail(path, "OFF file has no counts line")
        rest = lines[1]
        pos = 2
    try:
        nv, nf = (int(t) for t in rest.split()[:2])
    except ValueError as exc:
        raise fail(path, f"bad OFF counts line {rest!r}; expected 'vertices faces edges'") from exc
    if nv <= 0:
        raise fail(path, "OFF mesh has no vertices")
    vlines = lines[pos : pos + nv]
    flines = lines[pos + nv : pos + nv + nf]
    if len(vlines) < nv or len(flines) < nf:
        raise fail(path, f"truncated OFF: {len(vlines)} of {nv} vertices, {len(flines)} of {nf} faces")
    try:
        vertices = np.loadtxt(vlines, dtype=np.float64, ndmin=2)[:, :3]  # (v, 3)
    except ValueError as exc:
        raise fail(path, f"malformed OFF vertex line ({exc})") from exc
    if vertices.shape[1] != 3:
        raise fail(path, "OFF vertex lines need 3 coordinates")
    faces: np.ndarray
    try:
        try:
            flat = np.array(" ".join(flines).split(), dtype=np.int64)
        except (OverflowError, ValueError):  # an index beyond int64, or face colours (0.5 0.5 0.5 1.0): line by line
            flat = np.zeros(0, dtype=np.int64)
        if flat.size == 4 * nf and np.all(flat[::4] == 3):
            faces = flat.reshape(nf, 4)[:, 1:]  # (m, 3)
        else:
            faces = triangulate(path, [face_indices(path, "OFF", ln) for ln in flines])
    except DataError:
        raise
    except ValueError as exc:
        raise fail(path, f"malformed OFF face line ({exc})") from exc
    if faces.size and (faces.min() < 0 or faces.max() >= nv):
        raise fail(path, f"OFF face index out of range 0..{nv - 1}")
    return vertices, faces


def sample_mesh_surface(
    vertices: np.ndarray,
    faces: np.ndarray,
    n: int,
    seed: int | np.random.Generator | None = None,
    *,
    return_normals: bool = False,
    source: str | os.PathLike[str] | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Sample ``n`` points uniformly on a triangle mesh's surface (area-weighted).

    A triangle is drawn with probability proportional to its area, then a point
    uniformly inside it (``sqrt`` barycentric trick). With ``return_normals`` also
    returns each point's unit face normal. Errors start with ``source`` (the mesh's file)
    when given. A face's vertex beyond +-:data:`~sciformer.data.pointcloud.fields.COORD_LIMIT`
    is refused: its area and the samples' norms would overflow.

    Shapes: vertices (v, 3), faces (m, 3) int -> points (n, 3) float32
    [, normals (n, 3) float32].
    """
    where = "sample_mesh_surface" if source is None else str(source)
    vertices = np.asarray(vertices, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    if vertices.ndim != 2 or vertices.shape[1] != 3:
        raise DataError(f"{where}: vertices have shape {vertices.shape}, expected (v, 3)")
    if faces.ndim != 2 or faces.shape[1] != 3 or faces.shape[0] == 0:
        raise DataError(f"{where}: faces have shape {faces.shape}, expected (m, 3) with m > 0")
    if faces.min() < 0 or faces.max() >= len(vertices):
        raise DataError(f"{where}: face index out of range 0..{len(vertices) - 1}")
    if n <= 0:
        raise DataError(f"{where}: n must be positive, got {n}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    a, b, c = (vertices[faces[:, i]] for i in range(3))  # each (m, 3)
    reach = max(float(np.abs(v).max()) for v in (a, b, c))  # NaN when a face has a NaN vertex
    if not np.isfinite(reach):
        raise DataError(f"{where}: mesh has non-finite vertex coordinates")
    if reach > COORD_LIMIT:
        raise DataError(f"{where}: mesh vertex coordinates reach {reach:.3g}, beyond +-{COORD_LIMIT:.2g}; "
                        "its surface area and sampled points would overflow")
    cross = np.cross(b - a, c - a)  # (m, 3)
    area = 0.5 * np.linalg.norm(cross, axis=1)  # (m,)
    total = area.sum()
    if not total > 0:
        raise DataError(f"{where}: mesh has zero surface area")
    tri = rng.choice(len(faces), size=n, p=area / total)  # (n,)
    r1 = np.sqrt(rng.random(n))[:, None]  # (n, 1)
    r2 = rng.random(n)[:, None]  # (n, 1)
    points = (1 - r1) * a[tri] + r1 * (1 - r2) * b[tri] + r1 * r2 * c[tri]  # (n, 3)
    if not return_normals:
        return points.astype(np.float32)
    normals = cross[tri] / (2.0 * area[tri])[:, None]  # (n, 3) unit
    return points.astype(np.float32), normals.astype(np.float32)
