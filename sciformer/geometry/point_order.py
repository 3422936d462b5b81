"""Point orders that keep neighbours close in memory (numpy, for the KD-tree kNN path and the
neighbourhood layers): :func:`spatial_order` puts a cloud along a Morton (Z-order) curve,
:func:`is_scattered` tells in about 1 ms whether the stored order would gain from it. The
Point Transformer V3 serialization codes (torch, per packed batch) are in :mod:`.serialization`.
"""

from __future__ import annotations

import numpy as np

_SORT_MIN = 8192  # smaller clouds fit in cache: reordering them does not pay
_SCATTER_BLOCK = 1024  # points per block of the order test
_SCATTER_RATIO = 2.0  # file-order spacing / Morton-order spacing above which order pays
_CODE_BITS = 10  # Morton cells per axis: 2**10


def _part1by2(v: np.ndarray) -> np.ndarray:
    """Spread the low 10 bits of ``v`` three apart (one axis of a 3-D Morton code)."""
    v = (v | (v << 16)) & 0x030000FF
    v = (v | (v << 8)) & 0x0300F00F
    v = (v | (v << 4)) & 0x030C30C3
    return (v | (v << 2)) & 0x09249249


_SPREAD = _part1by2(np.arange(1 << _CODE_BITS, dtype=np.int64))  # cell -> spread bits


def spatial_order(points: np.ndarray) -> np.ndarray:
    """A permutation putting ``points`` along a Morton (Z-order) curve of their first 3 axes.

    numpy on purpose: single-threaded ops stay cheap on a loaded machine. Ties (points in
    the same cell) keep their input order.

    Shapes:
        points: (N, D) -> (N,) int64
    """
    n = points.shape[0]
    cols = np.multiply(points[:, :3].T, 0.5, dtype=np.float64, order="C")  # (3, N); halves never overflow
    lo, hi = cols.min(axis=1), cols.max(axis=1)
    scale = ((1 << _CODE_BITS) - 1) / max(float((hi - lo).max()), 1e-300)
    code = np.zeros(n, dtype=np.int64)
    buf = np.empty(n, dtype=np.float64)
    cell = np.empty(n, dtype=np.int64)
    for axis in range(cols.shape[0]):
        np.subtract(cols[axis], lo[axis], out=buf)
        buf *= scale
        np.clip(np.nan_to_num(buf, copy=False), 0, (1 << _CODE_BITS) - 1, out=buf)  # NaN: cell 0
        cell[:] = buf
        code |= _SPREAD[cell] << axis
    index_bits = max(n - 1, 1).bit_length()
    if 3 * _CODE_BITS + index_bits > 63:  # too many points to pack: a stable argsort instead
        return np.argsort(code, kind="stable")
    code <<= index_bits  # the index in the low bits: one plain sort, ties in input order
    code |= np.arange(n, dtype=np.int64)
    code.sort()
    code &= (1 << index_bits) - 1
    return code


def is_scattered(points: np.ndarray) -> bool:
    """Whether Morton order would bring consecutive points much closer together.

    Compares, on 3 blocks of 1024 consecutive points, the median distance between
    consecutive points as stored with the same block in Morton order. Coherent orders (scan
    lines of an airborne tile, a grid) give about 1; shuffled points, spinning-LiDAR scans
    stored beam by beam and uniform samples give 10 and more.

    Shapes:
        points: (N, D)
    """
    n, size = points.shape[0], _SCATTER_BLOCK
    if n < max(_SORT_MIN, 3 * size):
        return False
    rows = np.linspace(0, n - size, num=3).astype(np.int64)[:, None] + np.arange(size)  # (3, S)
    blocks = points[rows, :3].astype(np.float64) * 0.5  # (3, S, <=3); halves never overflow
    lo = blocks.min(axis=1, keepdims=True)  # (3, 1, <=3)
    extent = (blocks.max(axis=1, keepdims=True) - lo).max(axis=2, keepdims=True)  # (3, 1, 1)
    scaled = np.nan_to_num((blocks - lo) * (((1 << _CODE_BITS) - 1) / np.maximum(extent, 1e-300)))
    cells = np.clip(scaled, 0, (1 << _CODE_BITS) - 1).astype(np.int64)
    code = (_SPREAD[cells] << np.arange(cells.shape[2])).sum(axis=2)  # (3, S): disjoint bits
    ordered = np.take_along_axis(scaled, np.argsort(code, axis=1, kind="stable")[..., None], axis=1)
    stored = np.median(np.square(np.diff(scaled, axis=1)).sum(axis=2), axis=1)  # (3,) squared, in cells
    curve = np.median(np.square(np.diff(ordered, axis=1)).sum(axis=2), axis=1)
    ratio = np.where(curve > 0, stored / np.maximum(curve, 1e-300), np.where(stored > 0, np.inf, 1.0))
    return float(np.median(ratio)) > _SCATTER_RATIO**2
