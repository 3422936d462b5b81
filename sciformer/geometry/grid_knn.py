"""The compiled grid kNN kernel (``_grid_knn.cpp``): exact 3-D kNN of packed float32 batches.

Built by ``pip install`` when a C++ compiler is present (``setup.py``, an optional extension)
and loaded with ctypes; without it :func:`kernel` is ``None`` and ``knn`` uses the KD-tree
backends. How it searches (see the C++ file for the details):

- Each cloud's support points are sorted by cell of a uniform grid whose edge comes from the
  data (the median k-th neighbour distance of a few sample points, estimated by brute force
  on a thinned cloud), so a column of cells is one contiguous run of points, found in a
  dense table of cells or columns, or in a hash of 4 x 4 blocks of columns for sparse boxes.
- Queries are taken in cell order. Each scans the cells of the box ``q +- R`` and keeps the
  points within ``R``; with ``k`` of them its ``k`` nearest are among them, else ``R``
  grows. ``R`` starts from the previous query's k-th distance.
- Clouds of a batch are searched independently (threads over clouds); one large cloud
  splits its queries over the threads. Threads are C++ threads, not an OpenMP pool.
- The grid memory of a single-cloud call (up to 32 MB, clouds of up to about 200k points)
  stays with the calling thread and serves its next call instead of faulting in fresh
  pages, 4 KiB at a time. Larger grids, and any after an error, are freed.

Queries the grid does not settle (far outside the bulk of their cloud, or whose box would
span more than 400 columns: outliers) are compared with every point of their cloud when they
are few (at most 64, or 2^24 distances in all; runs of 64 points whose bounding box lies
beyond the k-th distance found so far are passed over), else first try grids 8 and 64 times
coarser.
Those still left after that, every query of a cloud whose k-th distances spread over more
than 25x (density falling steeply with the range around a spinning sensor: one cell size
cannot serve it), and every query of a cloud too fine for float32 squared distances
(neighbours closer than about 1e-15) come back
flagged as unsettled; :func:`grid_search` sends them to the KD-tree, in float64 (as exact as the kernel).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sciformer.utils.native import load_library

if TYPE_CHECKING:
    import torch

_SCALE = 1.0  # cell edge / median k-th neighbour distance (0.5-1.0 measured alike; 1.0 best on the real tiles)
_MAX_PASS = 8  # box growths before a query is handed to the KD-tree


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The compiled library, or ``None`` where the package was installed without it."""
    lib = load_library(Path(__file__).parent, "_grid_knn")
    if lib is not None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.sf_grid_knn.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_double, i64, ptr, ptr, ptr]
        lib.sf_grid_knn.restype = ctypes.c_int
    return lib


def grid_knn(query: np.ndarray, support: np.ndarray, q_sizes: list[int], s_sizes: list[int], k: int,
             threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """kNN of each query among the support points of its own cloud (compiled kernel).

    ``query is support`` with the same cloud sizes marks a self-query. Columns past a cloud's size hold -1 / inf;
    rows flagged ``unsettled`` hold -1 / inf too and must be searched otherwise.

    Shapes:
        query: (M, 3) float32, support: (N, 3) float32
        -> index: (M, k) int64 global support rows, dist: (M, k) float32, unsettled: (M,) int8
        (0 answered; 1 to search otherwise; 2 to search otherwise in float64)
    """
    lib = kernel()
    if lib is None:
        raise RuntimeError("the compiled grid kNN kernel is not installed")
    same = query is support and list(q_sizes) == list(s_sizes)  # a self-query walks the support's order
    qn = np.ascontiguousarray(query, dtype=np.float32)
    sn = qn if same else np.ascontiguousarray(support, dtype=np.float32)
    m = qn.shape[0]
    q_end = np.cumsum(q_sizes, dtype=np.int64)
    s_end = np.cumsum(s_sizes, dtype=np.int64)
    index = np.empty((m, k), dtype=np.int64)
    dist = np.empty((m, k), dtype=np.float32)
    unsettled = np.empty(m, dtype=np.int8)
    status = lib.sf_grid_knn(sn.ctypes.data, qn.ctypes.data, s_end.ctypes.data, q_end.ctypes.data, len(q_sizes), k, int(same),
                             _MAX_PASS, _SCALE, max(1, int(threads)), index.ctypes.data, dist.ctypes.data, unsettled.ctypes.data)
    if status == 2:
        raise MemoryError(f"grid kNN: out of memory for {m} queries among {sn.shape[0]} points")
    if status:
        raise RuntimeError(f"grid kNN failed (status {status})")
    return index, dist, unsettled


def grid_search(query: torch.Tensor, support: torch.Tensor, q_sizes: list[int], s_sizes: list[int], k: int,
                radius: float | None, *, fallback: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                threads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"grid"`` backend: 3-D float32 kNN on the kernel, everything else on ``fallback``.

    ``fallback`` (a KD-tree backend, same signature without the keywords) takes radius
    searches, other dimensions and dtypes, and the rows the kernel leaves unsettled.

    Shapes:
        query: (M, D), support: (N, D) -> index: (M, k) int64, dist: (M, k)
    """
    import torch

    if (radius is not None or query.shape[1] != 3 or query.dtype != torch.float32 or kernel() is None
            or max(s_sizes) >= 2**31):  # the kernel packs positions in 32 bits
        return fallback(query, support, q_sizes, s_sizes, k, radius)
    device = query.device
    qn = query.to("cpu").contiguous().numpy()
    sn = qn if query is support else support.to("cpu").contiguous().numpy()
    index, dist, unsettled = grid_knn(qn, sn, q_sizes, s_sizes, k, threads)
    if unsettled.any():  # 1: to the fallback, 2: to the fallback in float64
        q_start, s_start = np.cumsum([0, *q_sizes]), np.cumsum([0, *s_sizes])
        cloud = np.searchsorted(q_start, np.flatnonzero(unsettled), side="right") - 1  # cloud of each row
        for b in np.unique(cloud):
            rows = np.flatnonzero(unsettled[q_start[b]:q_start[b + 1]]) + q_start[b]
            cols = slice(s_start[b], s_start[b + 1])
            # in float64, so these rows are as exact as the kernel's (and clouds too fine for
            # float32 squared distances are searched right)
            sub_q, sub_s = torch.from_numpy(qn[rows]).double(), torch.from_numpy(sn[cols]).double()
            sub_i, sub_d = fallback(sub_q, sub_s, [len(rows)], [s_sizes[b]], k, None)
            sub_i = sub_i.numpy()
            index[rows] = np.where(sub_i >= 0, sub_i + s_start[b], -1)
            dist[rows] = sub_d.numpy()
    return torch.from_numpy(index).to(device), torch.from_numpy(dist).to(device)
