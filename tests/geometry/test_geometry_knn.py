"""kNN against scipy cKDTree, per cloud of packed batches of unequal sizes, on every backend."""

from __future__ import annotations

import importlib
import importlib.machinery
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from geometry_oracles import clouds, knn_oracle, random_batch

from sciformer.errors import DataError
from sciformer.geometry import knn, radius
from sciformer.geometry.knn import available_backends, has_module

CPU_BACKENDS = ["brute", "scipy"] + (["pykdtree"] if available_backends()["pykdtree"] else []) + (["grid"] if available_backends()["grid"] else [])
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def assert_matches(index, dist, support, query, oracle_idx, oracle_dist, q_offset, atol):
    """Distances match the oracle's; index sets match up to ties at the k-th distance."""
    index, dist = index.cpu().numpy(), dist.cpu().double().numpy()
    for (q0, q1), o_idx, o_dist in zip(clouds(q_offset), oracle_idx, oracle_dist):
        kk = o_idx.shape[1]
        np.testing.assert_allclose(dist[q0:q1, :kk], o_dist, atol=atol, rtol=0)
        for row in range(q1 - q0):
            ours, theirs = set(index[q0 + row, :kk].tolist()), set(o_idx[row].tolist())
            if ours != theirs:  # only points tied with the k-th neighbour may differ
                for j in ours ^ theirs:
                    d = np.linalg.norm(support[j] - query[q0 + row])
                    assert abs(d - o_dist[row, -1]) <= atol, (row, j)
        # returned distances are the distances of the returned points
        true = np.linalg.norm(support[index[q0:q1, :kk]] - query[q0:q1, None, :], axis=-1)
        np.testing.assert_allclose(dist[q0:q1, :kk], true, atol=atol, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS + ["auto", "kdtree"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_knn_cross_query_matches_ckdtree(backend, dtype):
    rng = np.random.default_rng(0)
    support, s_off = random_batch(rng, [37, 200, 120])
    query, q_off = random_batch(rng, [20, 55, 31])
    query[:20] = support[:20] + 0.01  # queries near their own cloud
    res = knn(
        torch.from_numpy(query).to(dtype), torch.from_numpy(support).to(dtype), 8,
        torch.from_numpy(q_off), torch.from_numpy(s_off), backend=backend,
    )
    assert res.index.dtype == torch.int64 and res.index.shape == (106, 8)
    assert res.dist.dtype == dtype
    o_idx, o_dist = knn_oracle(query, support, 8, q_off, s_off)
    atol = 1e-9 if dtype == torch.float64 else 2e-4
    assert_matches(res.index, res.dist, support, query, o_idx, o_dist, q_off, atol)
    # never across clouds
    for (q0, q1), (s0, s1) in zip(clouds(q_off), clouds(s_off)):
        block = res.index[q0:q1]
        assert bool(((block >= s0) & (block < s1)).all())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_knn_self_query_includes_self_like_ptv1(backend):
    rng = np.random.default_rng(1)
    pts, off = random_batch(rng, [64, 19, 100])
    x, o = torch.from_numpy(pts), torch.from_numpy(off)
    res = knn(x, None, 16, o, backend=backend)
    assert torch.equal(res.index[:, 0], torch.arange(len(pts)))  # no duplicates: self first
    assert bool((res.dist[:, 0] == 0).all())
    o_idx, o_dist = knn_oracle(pts, pts, 16, off, off)
    assert_matches(res.index, res.dist, pts, pts, o_idx, o_dist, off, 1e-9)
    same = knn(x, x, 16, o, o, backend=backend)  # explicit support == query
    assert torch.equal(same.index, res.index)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_knn_exclude_self_matches_oracle_without_self(backend):
    rng = np.random.default_rng(2)
    pts, off = random_batch(rng, [40, 70])
    res = knn(torch.from_numpy(pts), None, 6, torch.from_numpy(off), include_self=False, backend=backend)
    rows = torch.arange(len(pts)).unsqueeze(1)
    assert not bool((res.index == rows).any())
    o_idx, o_dist = knn_oracle(pts, pts, 7, off, off)
    o_idx = [i[:, 1:] for i in o_idx]  # drop self (distinct points: self is nearest)
    o_dist = [d[:, 1:] for d in o_dist]
    assert_matches(res.index, res.dist, pts, pts, o_idx, o_dist, off, 1e-9)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_knn_duplicates_are_distinct_neighbours(backend):
    rng = np.random.default_rng(3)
    base = rng.normal(size=(30, 3))
    pts = np.concatenate([base, base[:10]])  # points 30..39 duplicate 0..9
    x = torch.from_numpy(pts)
    with_self = knn(x, None, 4, backend=backend)
    for i in range(10):  # both copies at distance 0
        assert set(with_self.index[i, :2].tolist()) == {i, i + 30}
        assert with_self.dist[i, :2].tolist() == [0.0, 0.0]
    without = knn(x, None, 4, include_self=False, backend=backend)
    for i in range(10):  # own index removed, the duplicate stays first
        assert i not in without.index[i].tolist()
        assert int(without.index[i, 0]) == i + 30 and float(without.dist[i, 0]) == 0.0
        assert int(without.index[i + 30, 0]) == i


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_knn_fill_policies_for_small_clouds(backend):
    rng = np.random.default_rng(4)
    pts, off = random_batch(rng, [5, 30, 2])
    x, o = torch.from_numpy(pts), torch.from_numpy(off)
    with pytest.raises(DataError, match="cloud 0 of support has 5 points"):
        knn(x, None, 8, o, backend=backend)
    sent = knn(x, None, 8, o, fill="sentinel", backend=backend)
    near = knn(x, None, 8, o, fill="nearest", backend=backend)
    o_idx, o_dist = knn_oracle(pts, pts, 8, off, off)
    for (q0, q1), oi, od in zip(clouds(off), o_idx, o_dist):
        kk = oi.shape[1]
        assert torch.equal(sent.index[q0:q1, :kk], torch.from_numpy(oi))
        np.testing.assert_allclose(sent.dist[q0:q1, :kk].numpy(), od, atol=1e-9)
        assert bool((sent.index[q0:q1, kk:] == -1).all()) and bool(torch.isinf(sent.dist[q0:q1, kk:]).all())
        assert torch.equal(near.index[q0:q1, :kk], sent.index[q0:q1, :kk])
        assert bool((near.index[q0:q1, kk:] == near.index[q0:q1, :1]).all())
        assert bool((near.dist[q0:q1, kk:] == near.dist[q0:q1, :1]).all())
    # without self a 2-point cloud has 1 neighbour per point
    ex = knn(x, None, 3, o, include_self=False, fill="sentinel", backend=backend)
    assert ex.index[-2:].tolist() == [[36, -1, -1], [35, -1, -1]]


@pytest.mark.parametrize("backend", ["scipy"] + CPU_BACKENDS[2:])
@pytest.mark.parametrize("path", ["union", "per_cloud"])
def test_spatially_sorted_query_path_matches_ckdtree(backend, path, monkeypatch):
    backends = importlib.import_module("sciformer.geometry.knn_backends")
    monkeypatch.setattr(importlib.import_module("sciformer.geometry.point_order"), "_SORT_MIN", 1000)
    if path == "per_cloud":  # one tree per cloud, clouds 0 and 2 (scattered) in Morton order
        monkeypatch.setattr(backends, "_UNION_MAX_MEAN", 100)
    rng = np.random.default_rng(5)
    pts, off = random_batch(rng, [3000, 500, 2500])
    x, o = torch.from_numpy(pts), torch.from_numpy(off)
    res = knn(x, None, 8, o, backend=backend)
    o_idx, o_dist = knn_oracle(pts, pts, 8, off, off)
    assert_matches(res.index, res.dist, pts, pts, o_idx, o_dist, off, 1e-9)
    ball = radius(x, None, 0.5, 8, o, backend=backend)
    want = radius(x, None, 0.5, 8, o, backend="brute")
    assert torch.equal(ball.index.sort(dim=1).values, want.index.sort(dim=1).values)
    query, q_off = random_batch(rng, [1500, 800, 40])  # cross query: separate orders
    q, qo = torch.from_numpy(query), torch.from_numpy(q_off)
    cross = knn(q, x, 8, qo, o, backend=backend)
    o_idx, o_dist = knn_oracle(query, pts, 8, q_off, off)
    assert_matches(cross.index, cross.dist, pts, query, o_idx, o_dist, q_off, 1e-9)
    ball = radius(q, x, 2.0, 8, qo, o, backend=backend)
    want = radius(q, x, 2.0, 8, qo, o, backend="brute")
    assert torch.equal(ball.index.sort(dim=1).values, want.index.sort(dim=1).values)


@pytest.mark.parametrize("backend", CPU_BACKENDS[1:])
def test_one_tree_for_many_clouds_never_crosses_clouds(backend):
    """Overlapping clouds far from the origin (UTM-like), some smaller than k, in float32 and float64."""
    rng = np.random.default_rng(11)
    sizes = [40, 3, 1024, 7, 300] * 4
    base = np.array([6.9e5, 6.26e6, 120.0])  # every cloud at the same place: overlaps
    parts = [base + rng.normal(size=(n, 3)) * 20 for n in sizes]
    pts, off = np.concatenate(parts), np.cumsum(sizes)
    for dtype, atol in ((torch.float64, 1e-9), (torch.float32, 1e-4)):
        x, o = torch.from_numpy(pts).to(dtype), torch.from_numpy(off)
        res = knn(x, None, 16, o, fill="sentinel", backend=backend)
        ref = x.double().numpy()
        o_idx, o_dist = knn_oracle(ref, ref, 16, off, off)
        assert_matches(res.index, res.dist, ref, ref, o_idx, o_dist, off, atol)
        for (s0, s1), size in zip(clouds(off), sizes):
            block = res.index[s0:s1]
            assert bool((((block >= s0) & (block < s1)) | (block == -1)).all())
            assert bool((block[:, : min(size, 16)] >= 0).all()) and bool((block[:, size:] == -1).all())


def test_morton_order_only_where_the_stored_order_is_scattered():
    from sciformer.geometry.point_order import is_scattered, spatial_order

    rng = np.random.default_rng(12)
    # an airborne-tile-like scan: lines along x, one after the other in y, slight noise
    xs, ys = np.meshgrid(np.linspace(0, 100, 300), np.linspace(0, 100, 200))
    scan = np.stack([xs.ravel(), ys.ravel(), rng.normal(size=xs.size) * 0.1], axis=1)
    assert not is_scattered(scan)
    assert is_scattered(scan[rng.permutation(len(scan))])
    assert is_scattered(rng.random((50_000, 3)))
    assert not is_scattered(rng.random((1000, 3)))  # small clouds: never
    order = spatial_order(scan[rng.permutation(len(scan))])
    assert np.array_equal(np.sort(order), np.arange(len(scan)))  # a permutation
    cells = np.array([[0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0.5]])
    assert spatial_order(cells).tolist() == [0, 5, 2, 3, 4, 1]  # z-curve: x lowest bit


@pytest.mark.filterwarnings("error")
def test_morton_order_of_clouds_whose_span_overflows_or_holds_nan():
    """Finite float64 coordinates near the largest float (their span overflows) and NaN
    give a permutation and a decision, no warning or error; the order of a scaled-down
    copy (exact, by a power of two) is the same."""
    from sciformer.geometry.point_order import is_scattered, spatial_order

    rng = np.random.default_rng(13)
    unit = rng.random((9000, 3)) - 0.5
    top = np.finfo(np.float64).max
    huge = unit * top  # finite; with the extremes below, the span overflows float64
    huge[0], huge[1] = top, -top
    with np.errstate(over="ignore"):
        assert np.isfinite(huge).all() and not np.isfinite(huge.max(0) - huge.min(0)).any()
    assert np.array_equal(spatial_order(huge), spatial_order(huge / 4))  # exact rescaling: same cells
    assert is_scattered(huge) and is_scattered(unit)
    with_nan = unit.copy()
    with_nan[::7, 1] = np.nan
    assert np.array_equal(np.sort(spatial_order(with_nan)), np.arange(9000))
    is_scattered(with_nan)


@pytest.mark.skipif(not available_backends()["pykdtree"], reason="pykdtree not installed")
def test_pykdtree_threads_follow_torch_and_are_restored():
    pytest.importorskip("threadpoolctl")
    from sciformer.geometry.knn_backends import _pykdtree_openmp, openmp_threads, search_threads

    libs = _pykdtree_openmp()
    assert libs, "pykdtree's OpenMP runtime not found"
    before = [lib.get_num_threads() for lib in libs]
    with openmp_threads(1):
        assert all(lib.get_num_threads() == 1 for lib in libs)
    assert [lib.get_num_threads() for lib in libs] == before
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert search_threads(10**6) == 1
    finally:
        torch.set_num_threads(threads)
    assert search_threads(100) == 1


def test_high_dimensional_auto_uses_brute_force_and_matches_oracle():
    from sciformer.geometry.knn import resolve_backend

    assert resolve_backend("auto", torch.device("cpu"), 16) == "brute"
    assert resolve_backend("auto", torch.device("cpu"), 3) in ("grid", "pykdtree", "scipy")
    rng = np.random.default_rng(10)
    pts, off = random_batch(rng, [150, 90], dim=16)
    res = knn(torch.from_numpy(pts), None, 5, torch.from_numpy(off))
    o_idx, o_dist = knn_oracle(pts, pts, 5, off, off)
    assert_matches(res.index, res.dist, pts, pts, o_idx, o_dist, off, 1e-9)


def test_backends_agree_with_each_other():
    rng = np.random.default_rng(6)
    pts, off = random_batch(rng, [300, 150])
    x, o = torch.from_numpy(pts), torch.from_numpy(off)
    results = [knn(x, None, 10, o, backend=b) for b in CPU_BACKENDS]
    for other in results[1:]:
        torch.testing.assert_close(other.dist, results[0].dist, atol=1e-9, rtol=0)
        assert torch.equal(other.index.sort(dim=1).values, results[0].index.sort(dim=1).values)


def test_knn_outputs_carry_no_autograd_and_keep_device():
    x = torch.rand(50, 3, requires_grad=True)
    res = knn(x, None, 4)
    assert not res.index.requires_grad and not res.dist.requires_grad
    assert res.index.device == x.device


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: knn(torch.rand(10, 3).numpy(), None, 2), "torch.Tensor"),
        (lambda: knn(torch.rand(10), None, 2), "shape"),
        (lambda: knn(torch.randint(0, 5, (10, 3)), None, 2), "floating"),
        (lambda: knn(torch.rand(10, 3), torch.rand(10, 2), 2), "D=3"),
        (lambda: knn(torch.tensor([[0.0, 0, 0], [float("nan"), 0, 0]]), None, 1), "non-finite"),
        (lambda: knn(torch.rand(10, 3), None, 2, torch.tensor([4, 4, 10])), "cloud 1 of query is empty"),
        (lambda: knn(torch.rand(10, 3), None, 2, torch.tensor([4, 9])), "must equal the number of points"),
        (lambda: knn(torch.rand(10, 3), None, 2, torch.tensor([6, 4, 10])), "non-decreasing"),
        (lambda: knn(torch.rand(10, 3), None, 2, torch.tensor([4.0, 10.0])), "integer"),
        (lambda: knn(torch.rand(10, 3), torch.rand(8, 3), 2, torch.tensor([4, 10])), "both"),
        (lambda: knn(torch.rand(10, 3), torch.rand(8, 3), 2, torch.tensor([10]), torch.tensor([4, 8])), "clouds"),
        (lambda: knn(torch.rand(10, 3), None, 0), "k must be"),
        (lambda: knn(torch.rand(10, 3), None, 2, fill="pad"), "fill must be"),
        (lambda: knn(torch.rand(10, 3), None, 2, backend="faiss"), "backend must be"),
        (lambda: knn(torch.rand(10, 3), torch.rand(10, 3), 2, include_self=False), "same points"),
        (lambda: knn(torch.rand(0, 3), None, 2), "empty"),
    ],
)
def test_knn_bad_input_gives_one_line_data_error(call, message):
    with pytest.raises(DataError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def _fake_torch_cluster():
    """A stand-in with torch_cluster.knn's contract (edges [2, E], query row first), shuffled."""
    module = types.ModuleType("torch_cluster")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_cluster", None)

    def fake_knn(x, y, k, batch_x=None, batch_y=None):
        rows, cols = [], []
        for i in range(len(y)):
            same = (batch_x == batch_y[i]).nonzero().flatten()
            d = (x[same] - y[i]).norm(dim=1)
            take = same[d.argsort()[:k]]
            rows += [i] * len(take)
            cols += take.tolist()
        perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))
        return torch.tensor([rows, cols])[:, perm]

    module.knn = fake_knn
    return module


def test_torch_cluster_backend_conversion_with_stand_in(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_cluster", _fake_torch_cluster())
    has_module.cache_clear()
    try:
        rng = np.random.default_rng(7)
        pts, off = random_batch(rng, [6, 40, 25])
        x, o = torch.from_numpy(pts), torch.from_numpy(off)
        got = knn(x, None, 8, o, fill="sentinel", backend="torch_cluster")
        want = knn(x, None, 8, o, fill="sentinel", backend="scipy")
        assert torch.equal(got.index, want.index)
        torch.testing.assert_close(got.dist, want.dist)
    finally:
        has_module.cache_clear()


@pytest.mark.skipif(not has_module("torch_cluster"), reason="torch_cluster not installed")
def test_real_torch_cluster_matches_kdtree():
    rng = np.random.default_rng(8)
    pts, off = random_batch(rng, [100, 250])
    x, o = torch.from_numpy(pts).float(), torch.from_numpy(off)
    got = knn(x, None, 12, o, backend="torch_cluster")
    want = knn(x, None, 12, o, backend="scipy")
    torch.testing.assert_close(got.dist, want.dist, atol=1e-5, rtol=0)


def test_library_works_without_optional_packages():
    code = (
        "import sys\n"
        "for m in ('pykdtree', 'fpsample', 'torch_geometric', 'torch_cluster'): sys.modules[m] = None\n"
        "import torch\n"
        "from sciformer.geometry import knn, fps, available_backends\n"
        "from sciformer.geometry.knn import resolve_backend\n"
        "import sciformer.geometry.grid_knn as grid_knn\n"
        "grid_knn.kernel = lambda: None\n"  # as installed without a C++ compiler
        "assert resolve_backend('auto', torch.device('cpu')) == 'scipy'\n"
        "x = torch.rand(500, 3)\n"
        "i, d = knn(x, None, 8)\n"
        "assert i.shape == (500, 8)\n"
        "s = fps(x, ratio=0.25)\n"
        "assert torch.equal(s.index, fps(x, ratio=0.25, backend='torch').index)\n"
        "assert 'torch_geometric' not in [k for k, v in sys.modules.items() if v is not None]\n"
        "print('ok', available_backends())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")


@cuda
@pytest.mark.cuda
def test_knn_cuda_brute_matches_cpu_kdtree():
    rng = np.random.default_rng(9)
    pts, off = random_batch(rng, [500, 1200, 30])
    x, o = torch.from_numpy(pts).float(), torch.from_numpy(off)
    got = knn(x.cuda(), None, 16, o.cuda(), backend="auto")
    assert got.index.is_cuda and got.dist.is_cuda
    want = knn(x, None, 16, o)
    torch.testing.assert_close(got.dist.cpu(), want.dist, atol=1e-4, rtol=0)
    agree = (got.index.cpu().sort(1).values == want.index.sort(1).values).all(1).float().mean()
    assert float(agree) > 0.99


@pytest.mark.parametrize("backend", CPU_BACKENDS + ["auto"])
@pytest.mark.parametrize("far", [3.4e38, 1e30, 1e20, 1e5])
def test_float32_cloud_with_a_far_point_matches_float64_ckdtree(backend, far):
    """Squared distances past float32's range (a FLT_MAX no-data point) once made KD-trees
    return indices past the end (4294967295); brute force, centred on the mean, got every
    neighbour wrong from an outlier at 1e4."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(5)
    pts = rng.random((140, 3)).astype(np.float32)
    pts[0] = far
    res = knn(torch.from_numpy(pts), None, 16, backend=backend)
    assert res.dist.dtype == torch.float32
    o_dist, o_idx = cKDTree(pts.astype(np.float64)).query(pts.astype(np.float64), k=16)
    index = res.index.numpy()
    assert index.min() >= 0 and index.max() < 140
    np.testing.assert_array_equal(index[1:], o_idx[1:])  # the near points: exact neighbours
    assert set(index[0].tolist()) == set(o_idx[0].tolist()) or index[0, 0] == 0  # far point: itself first
    np.testing.assert_allclose(res.dist.numpy()[1:], o_dist[1:], rtol=1e-5, atol=1e-6)
