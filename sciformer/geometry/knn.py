"""k-nearest-neighbour search on packed batches, with a backend per device and dimension.

Backends (all return the same neighbour sets up to ties and float rounding):

- ``"grid"``: the compiled grid kNN (:mod:`sciformer.geometry.grid_knn`, built at install
  when a C++ compiler is present) for 3-D float32 kNN; radius searches, other dimensions
  and dtypes go to the KD-tree. The CPU default where installed (``benchmarks/bench_geometry.py``,
  quiet 2-core machine: 0.25-0.27x pykdtree's time at 100k uniform points, 0.42-0.46x on a
  ModelNet batch, 0.40-0.48x on an airborne tile, 0.41-0.55x on spinning-LiDAR scans,
  0.58-0.83x on a tile with sparse strays).
- ``"pykdtree"``: KD-tree from the pykdtree package (OpenMP queries); the fastest on CPU.
- ``"scipy"``: ``scipy.spatial.cKDTree`` with ``workers=-1``; the CPU fallback without pykdtree.
- ``"kdtree"``: pykdtree when installed, else scipy.
- ``"brute"``: chunked brute force in torch (``topk`` over every distance: up to 3 dimensions
  summed from coordinate differences in the input's precision, above ranked by one matrix
  product in float64); any device, the GPU default when torch_cluster is absent.
- ``"torch_cluster"``: ``torch_cluster.knn`` when that package is installed.
- ``"auto"``: CPU tensors -> ``"grid"`` in 3-D where compiled (not for a cross-query of
  clouds averaging more than 8192 support points, where the KD-tree measured faster),
  ``"kdtree"`` up to 12 dimensions, ``"brute"`` above (KD-trees
  lose to brute force from about 14-16 dimensions: 1.5 s vs 0.9 s for 10k points in 16-D,
  uniform data); CUDA tensors -> ``"torch_cluster"`` if installed, else ``"brute"``. On CPU
  the KD-tree also wins for tiny clouds (64 points: on par), so size does not change it.

KD-tree backends run on the CPU; tensors on another device are copied over and the
results copied back, so every backend is device-preserving.

Conventions shared with :func:`sciformer.geometry.radius`:

- Distances are Euclidean (not squared), in the coordinates' dtype.
- Each row is sorted by increasing distance; the order among equal distances (duplicate
  points, symmetric configurations) depends on the backend.
- Neighbours never cross cloud boundaries of a packed batch; indices index ``support``
  (global, not per cloud).
- Duplicate points are distinct neighbours (each at distance 0), never merged.
- ``include_self`` (self-query only): PTv1 includes the point itself. With
  ``include_self=False`` only the query point's own index is removed; its duplicates
  (other indices at distance 0) stay.
- ``fill`` decides what happens when a row has fewer than ``k`` neighbours (a cloud smaller
  than ``k``; no point within the radius): ``"error"`` raises DataError, ``"nearest"``
  repeats the row's nearest neighbour (index and distance), ``"sentinel"`` writes index -1
  and distance ``inf``. Beware that -1 wraps around when used to index a tensor.
- Indices carry no autograd; distances are returned detached.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sciformer.errors import DataError
from sciformer.geometry import grid_knn
from sciformer.geometry._validate import (
    check_choice,
    check_nonempty,
    check_offset,
    check_points,
    check_positive_int,
    same_device,
    value_range,
)
from sciformer.geometry.knn_backends import SEARCH_BACKENDS, has_module

BACKENDS = ("auto", "grid", "kdtree", "pykdtree", "scipy", "brute", "torch_cluster")
FILLS = ("error", "nearest", "sentinel")



class Neighbours(NamedTuple):
    """Result of :func:`knn` and :func:`radius`.

    Shapes:
        index: (M, k) int64 indices into ``support``; -1 where missing (``fill="sentinel"``).
        dist: (M, k) Euclidean distances, increasing along each row; ``inf`` where missing.
    """

    index: torch.Tensor
    dist: torch.Tensor


def available_backends() -> dict[str, bool]:
    """Which optional neighbourhood backends are installed in this environment."""
    return {
        "grid": grid_knn.kernel() is not None,
        "pykdtree": has_module("pykdtree"),
        "scipy": has_module("scipy"),
        "torch_cluster": has_module("torch_cluster"),
        "fpsample": has_module("fpsample"),
    }


_KDTREE_MAX_DIM = 12


def resolve_backend(backend: str, device: torch.device, dim: int = 3, *, large_cross: bool = False) -> str:
    """Turn ``"auto"`` / ``"kdtree"`` into a concrete, installed backend name.

    ``large_cross``: the search is not a self-query and its clouds average more than 8192
    support points; there the grid kernel measured 1.1-1.5x pykdtree's time (it wins on
    self-queries and on batches of small clouds), so ``"auto"`` takes the KD-tree.
    """
    check_choice(backend, "backend", BACKENDS)
    if backend == "auto":
        if device.type == "cpu":
            grid = dim == 3 and not large_cross and grid_knn.kernel() is not None
            backend = "grid" if grid else "kdtree" if dim <= _KDTREE_MAX_DIM else "brute"
        else:
            backend = "torch_cluster" if has_module("torch_cluster") else "brute"
    if backend == "kdtree":
        backend = "pykdtree" if has_module("pykdtree") else "scipy"
    if backend == "grid" and grid_knn.kernel() is None:
        raise DataError("backend='grid' needs the compiled kernel, which is not installed (reinstall sciformer where a C++ compiler is present)")
    if backend in ("pykdtree", "scipy", "torch_cluster") and not has_module(backend):
        raise DataError(f"backend={backend!r} needs the {backend} package, which is not installed")
    return backend


def knn(
    query: torch.Tensor,
    support: torch.Tensor | None,
    k: int,
    query_offset: torch.Tensor | None = None,
    support_offset: torch.Tensor | None = None,
    *,
    include_self: bool = True,
    fill: str = "error",
    backend: str = "auto",
) -> Neighbours:
    """The ``k`` nearest ``support`` points of each ``query`` point, cloud by cloud.

    For query point :math:`q_i` of cloud :math:`b`, returns the indices :math:`j` of the
    ``k`` support points of cloud :math:`b` with the smallest :math:`\\lVert q_i - s_j
    \\rVert_2`, in increasing order of distance.

    Args:
        query: query points.
        support: points searched; ``None`` means ``query`` (self-query).
        k: neighbours per query point.
        query_offset, support_offset: cumulative cloud ends of the packed batches; both
            ``None`` for a single cloud. For a self-query one offset is enough.
        include_self: for a self-query, whether a point is its own neighbour (PTv1: yes).
            ``False`` requires ``support`` to be the same points as ``query``.
        fill: a cloud with fewer than ``k`` points (``k + 1`` without self):
            ``"error"`` (default), ``"nearest"`` or ``"sentinel"``; see the module docstring.
        backend: ``"auto"``, ``"grid"``, ``"kdtree"``, ``"pykdtree"``, ``"scipy"``, ``"brute"``,
            ``"torch_cluster"``.

    Shapes:
        query: (M, D), support: (N, D), query_offset: (B,), support_offset: (B,)
        -> index: (M, k) int64 into support, dist: (M, k) in the coordinates' dtype

    Raises:
        DataError: wrong shape, dtype or device; non-finite coordinates; empty clouds;
            mismatched offsets; a cloud smaller than ``k`` with ``fill="error"``.
    """
    return neighbour_search(
        query, support, k, query_offset, support_offset,
        radius=None, include_self=include_self, fill=fill, backend=backend, caller="knn",
    )


def neighbour_search(
    query: torch.Tensor,
    support: torch.Tensor | None,
    k: int,
    query_offset: torch.Tensor | None,
    support_offset: torch.Tensor | None,
    *,
    radius: float | None,
    include_self: bool,
    fill: str,
    backend: str,
    caller: str,
) -> Neighbours:
    """Shared body of :func:`knn` and :func:`radius` (``radius=None`` for plain kNN)."""
    query = check_points(query, "query")
    self_alias = support is None or support is query
    if self_alias:  # one offset is enough
        support = query
        query_offset = support_offset if query_offset is None else query_offset
        support_offset = query_offset if support_offset is None else support_offset
    else:
        support = check_points(support, "support", dim=query.shape[1])
        same_device(query, support, "query and support")
    if (query_offset is None) != (support_offset is None):
        raise DataError(f"{caller}: pass both query_offset and support_offset, or neither (one cloud)")
    _, q_sizes = check_offset(query_offset, query.shape[0], "query_offset", query.device)
    _, s_sizes = check_offset(support_offset, support.shape[0], "support_offset", query.device)
    if len(q_sizes) != len(s_sizes):
        raise DataError(f"query_offset has {len(q_sizes)} clouds but support_offset has {len(s_sizes)}")
    check_nonempty(q_sizes, "query")
    check_nonempty(s_sizes, "support")
    name_k = "max_neighbors" if caller == "radius" else "k"
    k = check_positive_int(k, name_k)
    check_choice(fill, "fill", FILLS)
    large_cross = support is not query and support.shape[0] > 8192 * len(s_sizes)
    name = resolve_backend(backend, query.device, query.shape[1], large_cross=large_cross)
    if not include_self and not (
        q_sizes == s_sizes and query.shape == support.shape and (support is query or torch.equal(query, support))
    ):
        raise DataError(f"{caller}: include_self=False needs support to be the same points as query")
    k_search = k if include_self else k + 1
    if fill == "error" and radius is None and min(s_sizes) < k_search:
        b = next(b for b, size in enumerate(s_sizes) if size < k_search)
        need = f"k={k}" if include_self else f"k+1={k_search} (k={k} plus the excluded self)"
        raise DataError(
            f"{caller}: cloud {b} of support has {s_sizes[b]} points but {need} are needed; "
            "pass fill='nearest' or fill='sentinel' to allow smaller clouds"
        )

    dtype = torch.promote_types(query.dtype, support.dtype)
    work = torch.float64 if _overflows(query, support, dtype) else dtype
    q = query.detach().to(work)
    # backends treat q is s as a self-query: only with the same clouds on both sides
    s = q if support is query and q_sizes == s_sizes else support.detach().to(work)
    with torch.no_grad():
        index, dist = SEARCH_BACKENDS[name](q, s, q_sizes, s_sizes, k_search, radius)
    dist = dist.to(dtype)
    if not include_self:
        index, dist = _drop_self(index, dist)
    return Neighbours(*_apply_fill(index, dist, fill, caller, k, radius))


def _overflows(query: torch.Tensor, support: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether squared distances among the points overflow ``dtype`` (then searched in float64).

    KD-trees report an infinite distance as "no neighbour" (an index past the end) and brute
    force ranks every candidate alike, so a float32 cloud spanning more than ~5e18 (e.g. a
    FLT_MAX no-data point) would get wrong neighbours.
    """
    if not dtype.is_floating_point or dtype == torch.float64:
        return False
    safe = torch.finfo(dtype if dtype != torch.float16 else torch.float32).max ** 0.5 / 4
    span = 0.0
    for pts in (query,) if support is query else (query, support):
        lo, hi = value_range(pts)
        span = max(span, hi - lo)
    return span > safe


def _drop_self(index: torch.Tensor, dist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove each row's own index (row i of a self-query), else its last column.

    Shapes:
        index, dist: (M, k + 1) -> (M, k)
    """
    m, k1 = index.shape
    is_self = index == torch.arange(m, device=index.device).unsqueeze(1)  # (M, k+1)
    found = is_self.any(dim=1)
    pos = torch.where(found, is_self.to(torch.int8).argmax(dim=1), k1 - 1)  # (M,)
    cols = torch.arange(k1 - 1, device=index.device).unsqueeze(0)
    cols = cols + (cols >= pos.unsqueeze(1)).to(cols.dtype)  # skip the self column
    return index.gather(1, cols), dist.gather(1, cols)


def _apply_fill(
    index: torch.Tensor, dist: torch.Tensor, fill: str, caller: str, k: int, radius: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if index.numel() == 0:
        return index, dist
    last = index[:, -1]  # rows are sorted: missing entries at the end
    # numpy on CPU: one thread, no stall where torch's thread pool waits for a busy core
    if not bool((last.numpy() < 0).any() if last.device.type == "cpu" else (last < 0).any()):
        return index, dist
    missing = index < 0
    if fill == "error":
        row = int(missing.any(dim=1).nonzero()[0, 0])
        found = int((~missing[row]).sum())
        where = f"within r={radius}" if radius is not None else "in its cloud"
        raise DataError(
            f"{caller}: query row {row} has only {found} of {k} neighbours {where}; "
            "pass fill='nearest' or fill='sentinel' to allow it"
        )
    if fill == "nearest":
        usable = missing & ~missing[:, :1]  # rows with no neighbour at all keep the sentinel
        index = torch.where(usable, index[:, :1].expand_as(index), index)
        dist = torch.where(usable, dist[:, :1].expand_as(dist), dist)
    return index, dist


# --------------------------------------------------------------------------- backends
# Each batch-level search takes detached query (M, D) and support (N, D) of one dtype and
# returns index (M, k) int64 (global into support, -1 missing) and dist (M, k) sorted rows.

