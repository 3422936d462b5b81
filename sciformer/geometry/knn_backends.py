"""kNN search backends on packed batches: the compiled grid kernel (:mod:`.grid_knn`), KD-trees
(pykdtree, scipy) with Morton ordering, chunked brute force in torch, and torch_cluster.

The KD-tree path (radius, float64, other dimensions, no kernel, the grid's unsettled rows):

- **Order from the data.** A cloud in a scattered order (shuffled, a spinning-LiDAR scan
  stored beam by beam, uniform samples) is put in Morton (Z-curve) order before the tree is
  built and queried, so neighbouring queries walk the same nodes (1.7x on a SemanticKITTI
  scan, 3x on a shuffled airborne tile). A coherent order (an airborne tile in scan lines)
  is kept. :func:`is_scattered` decides on three blocks of consecutive points (about 1 ms);
  clouds under 8192 points fit in cache and keep their order.
- **Many small clouds, one tree.** A batch of small clouds (ModelNet, the deeper stages of a
  point model) is one tree over all clouds, each centred and shifted far apart along the
  first axis (in float64), so no neighbour can cross clouds: one call, one OpenMP start.
- **Threads set with torch's.** pykdtree's OpenMP threads (scipy's ``workers``) follow
  ``torch.get_num_threads()``, one thread for small searches: no two pools on one core.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from sciformer.geometry.grid_knn import grid_search
from sciformer.geometry.point_order import is_scattered, spatial_order

_UNION_MAX_MEAN = 8192  # batches of clouds this small on average share one tree
# the shared layout's span over its finest cloud, for float32 / float64 input: it costs that many of
# float64's 52 bits, 29 (rounding at float32's level) or 20
_UNION_MAX_SPAN = (float(1 << 29), float(1 << 20))
_PARALLEL_MIN = 16_384  # queries below this run on one thread (a parallel start costs more)

Tensor = torch.Tensor
Found = tuple[np.ndarray, np.ndarray]  # index (m, k) int64 (-1 missing), dist (m, k)
# backend(query, support, query sizes, support sizes, k, radius) -> index (M, k), dist (M, k)
SearchFn = Callable[[Tensor, Tensor, list[int], list[int], int, float | None], tuple[Tensor, Tensor]]


def per_cloud(search: Callable[[slice, slice, int], tuple[Any, Any]], index: Any, dist: Any,
              q_sizes: list[int], s_sizes: list[int], k: int) -> tuple[Any, Any]:
    """The one loop over the clouds of a packed batch (numpy or torch arrays alike).

    ``search(query_rows, support_rows, kk)`` returns the (rows, kk) neighbours of one
    cloud's queries as *global* support indices (-1 for none) and their distances,
    ``kk = min(k, cloud size)``; they fill ``index`` / ``dist``, whose other entries
    keep their -1 / inf.

    Shapes:
        index: (M, k) int64 filled with -1, dist: (M, k) filled with inf -> the same, filled
    """
    q0 = s0 = 0
    for mq, ns in zip(q_sizes, s_sizes, strict=True):
        kk = min(k, ns)
        rows = slice(q0, q0 + mq)
        index[rows, :kk], dist[rows, :kk] = search(rows, slice(s0, s0 + ns), kk)
        q0 += mq
        s0 += ns
    return index, dist


# --------------------------------------------------------------------------- threads


@functools.cache
def _pykdtree_openmp() -> tuple[Any, ...]:
    """threadpoolctl controllers of the OpenMP runtime pykdtree runs on (empty if unknown).

    pykdtree wheels bundle their own libgomp, which reads ``OMP_NUM_THREADS`` once at load
    and ignores ``torch.set_num_threads``; a build linked to the runtime torch uses is
    matched by falling back to every OpenMP runtime loaded.
    """
    import pykdtree.kdtree  # noqa: F401  (loads its OpenMP runtime)

    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # without threadpoolctl pykdtree keeps its own default
        return ()
    libs = [c for c in ThreadpoolController().lib_controllers if c.internal_api == "openmp"]
    own = tuple(c for c in libs if "pykdtree" in c.filepath)
    return own or tuple(libs)


@contextlib.contextmanager
def openmp_threads(threads: int) -> Iterator[None]:
    """pykdtree's OpenMP threads set to ``threads`` for the block, restored afterwards."""
    libs = _pykdtree_openmp()
    before = [lib.get_num_threads() for lib in libs]
    for lib, old in zip(libs, before):
        if old != threads:
            lib.set_num_threads(threads)
    try:
        yield
    finally:
        for lib, old in zip(libs, before):
            if old != threads:
                lib.set_num_threads(old)


def search_threads(queries: int) -> int:
    """Threads for a KD-tree search of ``queries`` points: torch's count, one for small work."""
    return torch.get_num_threads() if queries >= _PARALLEL_MIN else 1


# --------------------------------------------------------------------------- KD-trees


def _shift_apart(qn: np.ndarray, sn: np.ndarray, q_sizes: list[int], s_sizes: list[int],
                 same: bool) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Centre every cloud and lay the clouds out along the first axis, far apart, in float64.

    Cloud b's query and support points move by the same vector: its bounding box (query and
    support together) is centred at ``b * pitch`` on the first axis, ``pitch = 3 * d`` with
    ``d`` the largest box diagonal. Two points of different clouds are then at least
    ``2 d`` apart, farther than any two points of one cloud, so the nearest neighbours of a
    query are all in its own cloud, in front of any from another.

    Returns the shifted support, the shifted query (the same array when ``same``), ``d`` and
    the layout's span over the smallest nonzero cloud diagonal (how many of float64's 52 bits
    the shift costs that cloud: :func:`_union` declines above ``_UNION_MAX_SPAN``).

    Shapes:
        qn: (M, D), sn: (N, D) -> (N, D), (M, D) float64
    """
    s_starts = np.cumsum([0] + s_sizes[:-1])
    lo = np.minimum.reduceat(sn, s_starts, axis=0).astype(np.float64)  # (B, D)
    hi = np.maximum.reduceat(sn, s_starts, axis=0).astype(np.float64)
    if not same:
        q_starts = np.cumsum([0] + q_sizes[:-1])
        lo = np.minimum(lo, np.minimum.reduceat(qn, q_starts, axis=0))
        hi = np.maximum(hi, np.maximum.reduceat(qn, q_starts, axis=0))
    centre = (lo + hi) / 2  # (B, D)
    diags = np.sqrt(np.square(hi - lo).sum(axis=1))  # (B,)
    diag = float(diags.max())
    pitch = 3 * diag if diag > 0 else 1.0
    finest = float(diags[diags > 0].min()) if (diags > 0).any() else pitch
    span = pitch * len(s_sizes) / finest
    move = centre.copy()  # (B, D): minus this puts cloud b's box centre at (b * pitch, 0, ...)
    move[:, 0] -= np.arange(len(s_sizes)) * pitch
    s_shift = sn - np.repeat(move, s_sizes, axis=0)  # (N, D) float64
    if same:
        return s_shift, s_shift, diag, span
    q_shift = qn - np.repeat(move, q_sizes, axis=0)
    return s_shift, q_shift, diag, span


def _kdtree_search(tree_cls: Callable[[np.ndarray], Any], scipy_like: bool) -> SearchFn:
    """Batch-level KD-tree search: numpy throughout, results to the device."""

    def search(qn: np.ndarray, sn: np.ndarray, k: int, radius: float | None, same: bool,
               s_order: np.ndarray | None, q_order: np.ndarray | None, threads: int) -> Found:
        """One tree over ``sn``: index (m, k) int64 into ``sn`` (-1 missing) and dist (m, k).

        ``s_order`` / ``q_order``: optional permutations (Morton order) applied to the tree's
        points and to the queries (``same``: the queries are the support points).
        """
        m, ns = qn.shape[0], sn.shape[0]
        kk = min(k, ns)
        tree_pts = sn[s_order] if s_order is not None else sn
        tree = tree_cls(tree_pts)
        qq = tree_pts if same and q_order is s_order else (qn[q_order] if q_order is not None else qn)
        # A slightly larger bound keeps points at exactly r; the mask below is exact.
        bound = None if radius is None else radius * (1 + 1e-6) + 1e-30
        if scipy_like:
            d, i = tree.query(qq, k=kk, distance_upper_bound=np.inf if bound is None else bound, workers=threads)
        else:
            with openmp_threads(threads):
                d, i = tree.query(qq, k=kk, distance_upper_bound=bound)
        d, i = np.asarray(d).reshape(m, kk), np.asarray(i).reshape(m, kk)
        if q_order is not None:  # rows back to the caller's order: one row gather each
            inverse = np.empty_like(q_order)
            inverse[q_order] = np.arange(m)
            d, i = np.take(d, inverse, axis=0), np.take(i, inverse, axis=0)
        miss = None if radius is None else (i >= ns) | (d > radius)
        if s_order is not None:  # tree positions -> support indices (int64)
            index = np.take(s_order, i if miss is None else np.minimum(i, ns - 1))
        else:
            index = i.astype(np.int64)
        if miss is not None:
            index[miss], d[miss] = -1, np.inf
        return index, d

    def one_cloud(qn: np.ndarray, sn: np.ndarray, k: int, radius: float | None, same: bool) -> Found:
        """A single cloud: Morton order where the stored order is scattered."""
        s_order = spatial_order(sn) if is_scattered(sn) else None
        q_order = s_order if same else (spatial_order(qn) if is_scattered(qn) else None)
        return search(qn, sn, k, radius, same, s_order, q_order, search_threads(qn.shape[0]))

    def union(qn: np.ndarray, sn: np.ndarray, q_sizes: list[int], s_sizes: list[int], k: int,
              radius: float | None, same: bool) -> Found | None:
        """Many small clouds: one tree over the clouds shifted apart; cross-cloud hits dropped.

        Only a cloud smaller than ``k``, or a radius reaching past the gap between clouds,
        can see another cloud's points, always behind all of its own. Distances are taken again
        from the unshifted points for float64 and for a radius (whose bound the layout's
        rounding must not decide: the tree searches a hair wider). None (search cloud by
        cloud) where the layout would round a cloud's points beyond the input's precision:
        one cloud far larger than another, or a far stray point.
        """
        s_shift, q_shift, max_diag, span = _shift_apart(qn, sn, q_sizes, s_sizes, same)
        if not span <= _UNION_MAX_SPAN[qn.dtype == np.float64]:  # NaN spans too: cloud by cloud
            return None
        wider = None if radius is None else radius * (1 + 1e-9) + max_diag * span * 2.0**-50
        # stored order: small clouds fit in cache, reordering them does not pay
        index, dist = search(q_shift, s_shift, k, wider, same, None, None, search_threads(qn.shape[0]))
        if not (min(s_sizes) >= k and (radius is None or radius < 2 * max_diag)):
            s_ends = np.cumsum(s_sizes)
            lo = np.repeat(s_ends - np.asarray(s_sizes), q_sizes)[:, None]  # (M, 1) first support index
            hi = np.repeat(s_ends, q_sizes)[:, None]
            other = (index < lo) | (index >= hi)  # another cloud, or already missing (-1)
            index[other], dist[other] = -1, np.inf
        if qn.dtype == np.float64 or radius is not None:  # the layout's rounding shows in float64 and at the bound
            return _exact_rows(qn, sn, index, radius)
        return index, dist.astype(qn.dtype, copy=False)

    def run(query: Tensor, support: Tensor, q_sizes: list[int], s_sizes: list[int], k: int,
            radius: float | None) -> tuple[Tensor, Tensor]:
        device, dtype = query.device, query.dtype
        work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        qn = query.to("cpu", work).contiguous().numpy()
        sn = support.to("cpu", work).contiguous().numpy()
        same = query is support
        m, n_clouds = qn.shape[0], len(q_sizes)
        if n_clouds == 1:
            index, dist = one_cloud(qn, sn, k, radius, same)
        elif sn.shape[0] <= _UNION_MAX_MEAN * n_clouds and (found := union(qn, sn, q_sizes, s_sizes, k, radius, same)):
            index, dist = found
        else:
            index, dist = per_cloud(
                lambda rows, cols, kk: _offset(one_cloud(qn[rows], sn[cols], kk, radius, same and rows == cols), cols.start),
                np.full((m, k), -1, dtype=np.int64), np.full((m, k), np.inf, dtype=qn.dtype), q_sizes, s_sizes, k)
        if index.shape[1] < k:  # every cloud smaller than k
            index = np.concatenate([index, np.full((m, k - index.shape[1]), -1, dtype=np.int64)], axis=1)
            dist = np.concatenate([dist, np.full((m, k - dist.shape[1]), np.inf, dtype=dist.dtype)], axis=1)
        return torch.from_numpy(index).to(device), torch.from_numpy(dist).to(device, dtype)

    return run


def _exact_rows(qn: np.ndarray, sn: np.ndarray, index: np.ndarray, radius: float | None) -> Found:
    """Distances of ``index``'s neighbours recomputed from the unshifted points (float64, in
    blocks of rows), each row sorted by them (stable); a neighbour past ``radius`` and a
    missing one (-1) end the row as -1 / inf. Returns index and dist (qn's dtype).

    Shapes:
        qn: (M, D), sn: (N, D), index: (M, k) -> (M, k), (M, k)
    """
    out_i, out_d = np.empty_like(index), np.empty(index.shape, dtype=qn.dtype)
    rows = max(1, (1 << 20) // max(1, index.shape[1] * qn.shape[1]))
    for start in range(0, index.shape[0], rows):
        block = index[start : start + rows]  # (r, k)
        near = sn[np.maximum(block, 0)].astype(np.float64)  # (r, k, D)
        d = np.sqrt(np.square(near - qn[start : start + rows, None, :].astype(np.float64)).sum(axis=2))  # (r, k)
        miss = (block < 0) | (d > radius) if radius is not None else block < 0
        d[miss] = np.inf
        order = np.argsort(d, axis=1, kind="stable")
        out_d[start : start + rows] = np.take_along_axis(d, order, axis=1)
        out_i[start : start + rows] = np.where(np.isinf(out_d[start : start + rows]), -1, np.take_along_axis(block, order, axis=1))
    return out_i, out_d


def _offset(found: Found, base: int) -> Found:
    """Local support indices of one cloud -> global ones (missing stay -1)."""
    index, dist = found
    if base:
        np.add(index, base, out=index, where=index >= 0)
    return index, dist


def _pykdtree_search(*args: Any) -> tuple[Tensor, Tensor]:
    from pykdtree.kdtree import KDTree

    return _kdtree_search(lambda pts: KDTree(pts, leafsize=16), scipy_like=False)(*args)


def _scipy_search(*args: Any) -> tuple[Tensor, Tensor]:
    from scipy.spatial import cKDTree

    return _kdtree_search(lambda pts: cKDTree(pts, leafsize=16), scipy_like=True)(*args)


def _brute_cloud(q: Tensor, s: Tensor, k: int, radius: float | None) -> tuple[Tensor, Tensor]:
    """Chunked brute force: every query-support distance, the k smallest kept (``topk``).

    Up to 3 dimensions (point clouds) the distances are summed from coordinate differences
    (``cdist`` without its matrix-product form), in the input's precision: the difference of
    two nearby coordinates is exact, so no cloud is too large against its spacing. Above,
    the ranking is ``|s|^2 - 2 q.s`` (one matrix product) in float64 around the median, and the
    k kept get their distances recomputed from differences; that form cancels for clusters
    far apart against their spread (float64 holds 1 mm clusters 1 km apart, not 100 km).
    """
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    direct = q.shape[1] <= 3
    rank_dtype = work if direct else torch.float64
    sw, qw = s.to(rank_dtype), q.to(rank_dtype)
    if not direct:  # the median: one far outlier would move the mean far from every other point
        center = sw.median(dim=0, keepdim=True).values  # (1, D)
        sw, qw = sw - center, qw - center
        s_sq = sw.square().sum(dim=1).unsqueeze(0)  # (1, n)
    budget = (1 << (26 if q.is_cuda else 22)) // (rank_dtype.itemsize // 4)  # distance-matrix elements per chunk
    chunk = max(1, budget // max(1, s.shape[0]))
    index_parts, dist_parts = [], []
    for start in range(0, qw.shape[0], chunk):
        qb = qw[start : start + chunk]  # (c, D)
        if direct:
            d, idx = torch.cdist(qb, sw, compute_mode="donot_use_mm_for_euclid_dist").topk(k, dim=1, largest=False, sorted=True)  # (c, k)
        else:
            rank = torch.addmm(s_sq, qb, sw.T, alpha=-2.0)  # (c, n): |q-s|^2 - |q|^2
            idx = rank.topk(k, dim=1, largest=False, sorted=False).indices  # (c, k)
            d, order = (qb.unsqueeze(1) - sw[idx]).square().sum(dim=-1).sqrt().sort(dim=1)  # (c, k) exact
            idx = idx.gather(1, order)
        index_parts.append(idx)
        dist_parts.append(d)
    index, dist = torch.cat(index_parts), torch.cat(dist_parts)  # (M, k)
    if radius is not None:
        miss = dist > radius
        index, dist = index.masked_fill(miss, -1), dist.masked_fill(miss, float("inf"))
    return index, dist.to(q.dtype)


def _brute_search(query: Tensor, support: Tensor, q_sizes: list[int], s_sizes: list[int], k: int,
                  radius: float | None) -> tuple[Tensor, Tensor]:
    if len(q_sizes) == 1 and s_sizes[0] >= k:
        return _brute_cloud(query, support, k, radius)

    def one(rows: slice, cols: slice, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
        local, d = _brute_cloud(query[rows], support[cols], kk, radius)  # (mq, kk)
        return torch.where(local >= 0, local + cols.start, local), d

    m = query.shape[0]
    return per_cloud(one, torch.full((m, k), -1, dtype=torch.int64, device=query.device),
                     torch.full((m, k), float("inf"), dtype=query.dtype, device=query.device), q_sizes, s_sizes, k)


def _torch_cluster_search(query: Tensor, support: Tensor, q_sizes: list[int], s_sizes: list[int], k: int,
                          radius: float | None) -> tuple[Tensor, Tensor]:
    """``torch_cluster.knn`` over the whole batch, reshaped to (M, k) and sorted by distance."""
    import torch_cluster

    device, m = query.device, query.shape[0]
    arange = torch.arange(len(q_sizes), device=device)
    batch_q = torch.repeat_interleave(arange, torch.tensor(q_sizes, device=device))
    batch_s = torch.repeat_interleave(arange, torch.tensor(s_sizes, device=device))
    row, col = torch_cluster.knn(support, query, k, batch_s, batch_q)  # row: query, col: support
    order = torch.argsort(row, stable=True)
    row, col = row[order], col[order]
    counts = torch.bincount(row, minlength=m)
    pos = torch.arange(row.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[row]
    keep = pos < k
    index = torch.full((m, k), -1, dtype=torch.int64, device=device)
    index[row[keep], pos[keep]] = col[keep]
    missing = index < 0
    dist = (query.unsqueeze(1) - support[index.clamp(min=0)]).square().sum(dim=-1).sqrt()
    dist = dist.masked_fill(missing, float("inf"))
    dist, order = dist.sort(dim=1)
    index = index.gather(1, order)
    if radius is not None:
        miss = dist > radius
        index, dist = index.masked_fill(miss, -1), dist.masked_fill(miss, float("inf"))
    return index, dist


@functools.cache
def has_module(name: str) -> bool:
    """Whether an optional package is importable (checked once, without importing it)."""
    return importlib.util.find_spec(name) is not None


def _grid_backend(query: Tensor, support: Tensor, q_sizes: list[int], s_sizes: list[int], k: int,
                  radius: float | None) -> tuple[Tensor, Tensor]:
    fallback = _pykdtree_search if has_module("pykdtree") else _scipy_search  # rows the kernel leaves
    return grid_search(query, support, q_sizes, s_sizes, k, radius, fallback=fallback, threads=search_threads(query.shape[0]))


SEARCH_BACKENDS: dict[str, SearchFn] = {
    "grid": _grid_backend,
    "pykdtree": _pykdtree_search,
    "scipy": _scipy_search,
    "brute": _brute_search,
    "torch_cluster": _torch_cluster_search,
}
