"""The compiled grid kNN (backend "grid") against scipy's cKDTree, on every shape of cloud
that changes its path: volumes, planes, lines, duplicates, far outliers (coarse grids and
the KD-tree fallback), queries far outside the support, batches of unequal clouds, real scans.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from geometry_oracles import clouds, knn_oracle
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sciformer.errors import DataError
from sciformer.geometry import grid_knn, knn
from sciformer.geometry.knn import available_backends, resolve_backend

needs_kernel = pytest.mark.skipif(grid_knn.kernel() is None, reason="the compiled grid kernel is not built")
DATA = Path(__import__("os").environ.get("SCIFORMER_DATA", Path(__file__).parents[3] / "shared" / "data"))


def check_against_oracle(query: np.ndarray, support: np.ndarray, k: int, q_off: np.ndarray, s_off: np.ndarray, *,
                         same: bool, threads: int | None = None) -> torch.Tensor:
    """knn(backend="grid") in float32 equals cKDTree's (float64 on the same float32 values):
    the same distances, the same sets up to points tied with the k-th; never across clouds."""
    q32 = torch.from_numpy(query.astype(np.float32))
    s32 = q32 if same else torch.from_numpy(support.astype(np.float32))
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        res = knn(q32, None if same else s32, k, torch.from_numpy(q_off), torch.from_numpy(s_off), fill="sentinel", backend="grid")
    finally:
        torch.set_num_threads(before)
    q64, s64 = q32.double().numpy(), s32.double().numpy()
    o_idx, o_dist = knn_oracle(q64, s64, k, q_off, s_off)
    index, dist = res.index.numpy(), res.dist.double().numpy()
    for ((q0, q1), (s0, s1)), oi, od in zip(zip(clouds(q_off), clouds(s_off)), o_idx, o_dist):
        kk = oi.shape[1]
        scale = max(float(np.abs(s64[s0:s1]).max()), float(np.abs(q64[q0:q1]).max()), 1.0)
        atol = 1e-5 * scale
        np.testing.assert_allclose(dist[q0:q1, :kk], od, atol=atol, rtol=0)
        assert ((index[q0:q1, :kk] >= s0) & (index[q0:q1, :kk] < s1)).all()
        assert (index[q0:q1, kk:] == -1).all() and np.isinf(dist[q0:q1, kk:]).all()
        true = np.linalg.norm(s64[index[q0:q1, :kk]] - q64[q0:q1, None, :], axis=-1)  # (m, kk)
        np.testing.assert_allclose(dist[q0:q1, :kk], true, atol=atol, rtol=0)
        for row in np.flatnonzero((np.sort(index[q0:q1, :kk], axis=1) != np.sort(oi, axis=1)).any(axis=1)):
            ours, theirs = set(index[q0 + row, :kk].tolist()), set(oi[row].tolist())
            for j in ours ^ theirs:  # only points tied with the k-th neighbour may differ
                assert abs(np.linalg.norm(s64[j] - q64[q0 + row]) - od[row, -1]) <= atol, (row, j)
        for row in range(q1 - q0):  # no point twice in a row
            assert len(set(index[q0 + row, :kk].tolist())) == kk
        assert (np.diff(dist[q0:q1, :kk], axis=1) >= 0).all()  # rows ascending
    return res.index


def shapes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Clouds of n points whose density and dimension differ."""
    t = rng.random(n)
    far = rng.normal(size=(n, 3)) * 0.1
    far[: max(1, n // 50)] = rng.normal(size=(max(1, n // 50), 3)) * 1e4  # a few far outliers
    dup = rng.random((max(1, n // 8), 3))[rng.integers(0, max(1, n // 8), n)]  # every point ~8 times
    return {
        "volume": rng.random((n, 3)),
        "plane": np.c_[rng.random((n, 2)) * 100, np.zeros(n)],
        "line": np.c_[t, 2 * t, -t],
        "sphere surface": (lambda v: v / np.linalg.norm(v, axis=1, keepdims=True))(rng.normal(size=(n, 3))),
        "outliers": far,
        "duplicates": dup,
        "one point repeated": np.ones((n, 3)),
        "clusters of very different density": np.concatenate(
            [rng.random((n // 2, 3)) * 1e-3, rng.random((n - n // 2, 3)) * 1e3 + 5]),
        "integer lattice (many ties)": rng.integers(0, 6, size=(n, 3)).astype(float),
    }


@needs_kernel
@pytest.mark.parametrize("n", [1, 17, 300, 5000])
@pytest.mark.parametrize("k", [1, 16])
def test_self_query_on_every_shape(n, k):
    rng = np.random.default_rng(n + k)
    for name, pts in shapes(rng, n).items():
        try:
            check_against_oracle(pts, pts, k, np.array([n]), np.array([n]), same=True)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from err


@needs_kernel
def test_batches_of_unequal_clouds_cross_query_and_far_queries():
    rng = np.random.default_rng(1)
    sizes_s, sizes_q = [3, 1024, 40, 2000, 1], [7, 900, 1, 2500, 4]
    support = np.concatenate([rng.normal(size=(n, 3)) * rng.uniform(0.01, 50) + rng.uniform(-1e3, 1e3, 3) for n in sizes_s])
    query = np.concatenate([rng.normal(size=(n, 3)) * 30 for n in sizes_q])
    query[:5] *= 1e4  # queries far outside their cloud's box
    check_against_oracle(query, support, 16, np.cumsum(sizes_q), np.cumsum(sizes_s), same=False)
    check_against_oracle(support, support, 16, np.cumsum(sizes_s), np.cumsum(sizes_s), same=True, threads=2)


@needs_kernel
def test_grid_memory_kept_between_calls_serves_every_kind_of_grid():
    """A thread keeps its last grid's memory (under 32 MB) for its next call: a sequence of
    clouds that switches between the dense table of cells (a thin layer), the table of
    columns (vertical poles), the hash of column blocks (scan lines far apart), coarse grids
    and brute force (strays), growing and shrinking, with a grid past the limit (freed) and a
    cloud smaller than k in between, each answered as a fresh search would (cKDTree)."""
    rng = np.random.default_rng(9)
    layer = np.c_[rng.random((30_000, 2)) * 1000, rng.random(30_000) * 0.01]
    poles = np.concatenate([np.c_[np.full((100, 2), xy), np.arange(100) * 0.1] for xy in rng.random((300, 2)) * 100])
    lines = np.concatenate([np.c_[np.arange(1000) * 0.1, np.full(1000, 300.0 * i), rng.random(1000) * 0.05]
                            for i in range(30)])
    strays = np.concatenate([lines, rng.random((40, 3)) * 1e5])
    large = rng.random((600_000, 3))
    sequence = [layer, lines, poles, rng.random((200, 3)), strays, large, rng.random((9, 3)), poles[::3], lines, layer]
    for pts in sequence:
        n = np.array([len(pts)])
        if len(pts) > 100_000:  # the oracle is slow here: the kernel against itself, cold and warm
            p32 = np.ascontiguousarray(pts, dtype=np.float32)
            first = grid_knn.grid_knn(p32, p32, [len(pts)], [len(pts)], 8, 1)
            again = grid_knn.grid_knn(p32, p32, [len(pts)], [len(pts)], 8, 1)
            np.testing.assert_array_equal(first[0], again[0])
            continue
        check_against_oracle(pts, pts, 16, n, n, same=True)
        check_against_oracle(pts[: len(pts) // 2], pts, 8, n // 2, n, same=False, threads=2)


@needs_kernel
@pytest.mark.parametrize("strays", [300, 3000])
def test_outliers_go_to_brute_force_when_few_else_to_coarse_grids_and_the_kd_tree_exactly(strays):
    rng = np.random.default_rng(2)
    dense = rng.random((20_000, 3)).astype(np.float32)
    sparse = (rng.normal(size=(strays, 3)) * np.logspace(1, 6, strays)[:, None]).astype(np.float32)  # 10 .. 1e6 away
    pts = np.ascontiguousarray(np.concatenate([dense, sparse]))
    _, _, unsettled = grid_knn.grid_knn(pts, pts, [len(pts)], [len(pts)], 16, 1)
    if strays * len(pts) <= 2**24:  # few: the kernel compares them with every point
        assert not unsettled.any()
    else:  # many: some really do reach the KD-tree
        assert unsettled.any()
    check_against_oracle(pts, pts, 16, np.array([len(pts)]), np.array([len(pts)]), same=True)


@needs_kernel
@pytest.mark.parametrize("k", [1, 5, 16])
def test_brute_forced_outliers_are_exact(k):
    """Outliers no grid serves are compared with every point in the kernel: their neighbour
    sets and distances equal a float64 KD-tree's (random coordinates: no exact ties)."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(7)
    dense = rng.random((5000, 3))
    strays = rng.normal(size=(40, 3)) * np.logspace(2, 5, 40)[:, None]  # 100 .. 1e5 away
    pts = np.ascontiguousarray(np.concatenate([dense, strays]).astype(np.float32))
    index, dist, unsettled = grid_knn.grid_knn(pts, pts, [len(pts)], [len(pts)], k, 1)
    assert not unsettled.any()
    p64 = pts.astype(np.float64)
    ref_d, ref_i = cKDTree(p64).query(p64, k=k)
    ref_d, ref_i = ref_d.reshape(len(pts), k), ref_i.reshape(len(pts), k)
    np.testing.assert_array_equal(np.sort(index, 1), np.sort(ref_i, 1))
    np.testing.assert_allclose(dist, ref_d, rtol=1e-6, atol=0)
    assert (np.diff(dist, axis=1) >= 0).all()


@needs_kernel
def test_brute_forced_outlier_among_thousands_of_tied_points():
    """A stray query whose nearest points are 3000 copies of one point (all tied): any 16 of
    the copies, at their exact distance, in both thread counts alike."""
    rng = np.random.default_rng(5)
    pts = np.concatenate([rng.random((6000, 3)), np.full((3000, 3), 2.0), [[500.0, 500.0, 500.0]]]).astype(np.float32)
    runs = [grid_knn.grid_knn(pts, pts, [len(pts)], [len(pts)], 16, t) for t in (1, 2)]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    index, dist, unsettled = runs[0]
    assert not unsettled[-1]
    assert ((index[-1][1:] >= 6000) & (index[-1][1:] < 9000)).all() and index[-1][0] == 9000
    want = np.linalg.norm(np.array([498.0] * 3))
    np.testing.assert_allclose(dist[-1][1:], want, rtol=1e-6)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.0, 1e5, -3e6]), st.integers(1, 24), st.integers(1, 60))
def test_brute_force_passing_over_far_runs_misses_no_neighbour(seed, offset, k, strays):
    """Outliers brute-forced with runs of 64 points passed over when their box lies beyond the
    k-th distance: on integer lattices far from the origin (float32 differences round, ties
    everywhere) and strays whose nearest points sit exactly on the faces of run boxes, every
    answer equals a float64 brute force up to ties."""
    rng = np.random.default_rng(seed)
    lattice = rng.integers(0, 12, size=(int(rng.integers(200, 3000)), 3)).astype(np.float64)
    face = lattice[rng.integers(0, len(lattice), strays)]  # strays straight out from lattice points
    axis = rng.integers(0, 3, strays)
    stray = face.copy()
    stray[np.arange(strays), axis] += rng.choice([-1, 1], strays) * rng.integers(40, 400, strays)
    pts = np.concatenate([lattice, stray]) + offset
    pts = pts[rng.permutation(len(pts))]
    _, _, unsettled = grid_knn.grid_knn(pts.astype(np.float32), pts.astype(np.float32), [len(pts)], [len(pts)], k, 1)
    if unsettled.any():  # strays among the grid fit's 16 sampled points spread its k-th distances over 25x:
        assert unsettled.all()  # the whole cloud goes to the KD-tree, no brute force to test here
        assume(False)
    check_against_oracle(pts, pts, k, np.array([len(pts)]), np.array([len(pts)]), same=True)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_far_cross_queries_are_brute_forced_exactly_and_alike_on_any_thread_count(threads):
    """Queries of another set lying far outside the support (no box reaches them cheaply),
    in two clouds of a batch, with duplicated support points (exact ties): every answer is a
    float64 KD-tree's up to ties, and 1 and 2 threads give the same bits."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(11)
    sup = rng.random((6000, 3)).astype(np.float32)
    sup[3000:3100] = sup[:100]  # duplicates
    far = (rng.normal(size=(50, 3)) * 1e3).astype(np.float32)
    near = rng.random((500, 3)).astype(np.float32)
    qry = np.ascontiguousarray(np.concatenate([near[:250], far[:25], near[250:], far[25:]]))
    q_sizes, s_sizes = [275, 275], [3000, 3000]
    runs = [grid_knn.grid_knn(qry, sup, q_sizes, s_sizes, 8, t) for t in (1, threads)]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    index, dist, unsettled = runs[0]
    assert not unsettled.any()
    for (q0, q1), (s0, s1) in (((0, 275), (0, 3000)), ((275, 550), (3000, 6000))):
        ref_d, ref_i = cKDTree(sup[s0:s1].astype(np.float64)).query(qry[q0:q1].astype(np.float64), k=8)
        np.testing.assert_allclose(dist[q0:q1], ref_d, rtol=1e-6, atol=1e-7)
        for row in range(q1 - q0):
            ours, theirs = set((index[q0 + row] - s0).tolist()), set(ref_i[row].tolist())
            for j in ours ^ theirs:  # only points tied with the k-th may differ
                gap = np.linalg.norm(sup[s0 + j].astype(np.float64) - qry[q0 + row]) - ref_d[row, -1]
                assert abs(gap) <= 1e-6 * max(ref_d[row, -1], 1e-30), (row, j)


@needs_kernel
def test_threads_and_input_order_do_not_change_the_answer():
    rng = np.random.default_rng(3)
    pts = np.concatenate([rng.random((30_000, 3)), rng.random((3000, 3)) * 50]).astype(np.float32)
    sizes, offset = [20_000, 13_000], torch.tensor([20_000, 33_000])
    one = grid_knn.grid_knn(pts, pts, sizes, sizes, 16, 1)
    two = grid_knn.grid_knn(pts, pts, sizes, sizes, 16, 2)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))
    assert one[2][:20_000].sum() == 0 and (one[2][20_000:] == 1).all()  # the second cloud is too uneven
    assert (one[0][one[2] > 0] == -1).all() and np.isinf(one[1][one[2] > 0]).all()
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(knn(torch.from_numpy(pts), None, 16, offset, backend="grid"))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0].index, results[1].index) and torch.equal(results[0].dist, results[1].dist)
    perm = np.concatenate([rng.permutation(20_000), 20_000 + rng.permutation(13_000)])
    shuffled = knn(torch.from_numpy(pts[perm]), None, 16, offset, backend="grid")
    np.testing.assert_allclose(shuffled.dist.numpy(), results[0].dist.numpy()[perm], rtol=1e-6)


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(-3, 3)), min_size=1, max_size=80),
       st.integers(1, 20), st.sampled_from([1e-3, 1.0, 1e4]))
def test_any_small_cloud_with_ties(cells, k, scale):
    pts = np.asarray(cells, dtype=np.float64) * scale
    check_against_oracle(pts, pts, k, np.array([len(pts)]), np.array([len(pts)]), same=True)


@needs_kernel
@pytest.mark.parametrize("name", ["semantickitti_scans/seq01_000000_points.npy", "lidar"])
def test_real_scans(name):
    path = DATA / name
    if name == "lidar":
        from sciformer.data.pointcloud.io import read_point_file

        tiles = sorted(path.glob("*.la[sz]"), key=lambda p: p.stat().st_size)
        if not tiles:
            pytest.skip("no LiDAR tiles")
        pts = np.asarray(read_point_file(tiles[-1])["coord"], dtype=np.float64)
    else:
        if not path.is_file():
            pytest.skip(f"{path} missing")
        pts = np.load(path).astype(np.float64)[:, :3]
    pts = pts[:, :3] - pts[:, :3].min(axis=0)  # as the datasets feed them
    check_against_oracle(pts, pts, 16, np.array([len(pts)]), np.array([len(pts)]), same=True, threads=2)


def test_without_the_kernel_auto_uses_the_kd_tree_and_grid_is_refused(monkeypatch):
    monkeypatch.setattr(grid_knn, "kernel", lambda: None)
    assert resolve_backend("auto", torch.device("cpu"), 3) in ("pykdtree", "scipy")
    assert available_backends()["grid"] is False
    with pytest.raises(DataError, match="compiled kernel"):
        knn(torch.rand(50, 3), None, 4, backend="grid")


@needs_kernel
def test_auto_uses_the_kernel_in_3d_and_grid_hands_other_cases_to_the_kd_tree():
    assert resolve_backend("auto", torch.device("cpu"), 3) == "grid"
    assert resolve_backend("auto", torch.device("cpu"), 2) in ("pykdtree", "scipy")
    assert resolve_backend("auto", torch.device("cpu"), 3, large_cross=True) in ("pykdtree", "scipy")
    rng = np.random.default_rng(4)
    for pts in (rng.random((500, 3)), rng.random((500, 2)).astype(np.float32)):  # float64; 2-D
        x = torch.from_numpy(pts)
        got, want = knn(x, None, 8, backend="grid"), knn(x, None, 8, backend="scipy")
        torch.testing.assert_close(got.dist, want.dist)


@needs_kernel
def test_one_stray_point_far_away_does_not_stretch_the_grid():
    rng = np.random.default_rng(5)
    pts = (rng.random((60_000, 3)) * [100, 100, 10]).astype(np.float32)
    pts[7] = [1e8, 0, 0]  # a bogus return: the box is 1e6 times the scan
    _, _, unsettled = grid_knn.grid_knn(pts, pts, [len(pts)], [len(pts)], 16, 1)
    assert unsettled.sum() <= 1  # only the stray point itself may need the KD-tree
    check_against_oracle(pts, pts, 16, np.array([len(pts)]), np.array([len(pts)]), same=True)


@needs_kernel
def test_many_copies_of_one_point_are_answered_in_the_grid():
    rng = np.random.default_rng(6)
    pts = np.concatenate([rng.random((20_000, 3)) * 50, np.zeros((20_000, 3))]).astype(np.float32)  # no-data at 0
    _, _, unsettled = grid_knn.grid_knn(pts, pts, [len(pts)], [len(pts)], 16, 1)
    assert not unsettled[20_000:].any()
    check_against_oracle(pts, pts, 16, np.array([len(pts)]), np.array([len(pts)]), same=True)
    one, two = (grid_knn.grid_knn(pts, pts, [len(pts)], [len(pts)], 16, t) for t in (1, 2))
    assert all(np.array_equal(a, b) for a, b in zip(one, two))  # ties among copies resolved alike


@needs_kernel
def test_queries_beside_the_support_in_one_axis_only():
    rng = np.random.default_rng(7)
    support = rng.random((30_000, 3))
    query = rng.random((3000, 3))
    query[:, 2] += 1.5  # inside the box in x and y, above it in z
    check_against_oracle(query, support, 8, np.array([3000]), np.array([30_000]), same=False)


@needs_kernel
@pytest.mark.parametrize("spacing", [1e-23, 1e-30])
def test_neighbours_closer_than_float32_squares_resolve_exactly(spacing):
    rng = np.random.default_rng(8)
    tiny = np.array([[0.0, 0, 0], [3, 0, 0], [1, 0, 0], [2, 0, 0]]) * spacing
    for pts in (tiny, np.concatenate([tiny, rng.random((5000, 3))])):  # alone, or inside a normal cloud
        x = torch.from_numpy(pts.astype(np.float32))
        got = knn(x, None, 3, backend="grid")
        want = knn(x.double(), None, 3, backend="scipy")
        assert got.index[:4, 0].tolist() == [0, 1, 2, 3]  # self first: no two points coincide
        np.testing.assert_allclose(got.dist[:4].double().numpy(), want.dist[:4].numpy(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", ["grid", "pykdtree", "scipy", "brute"])
def test_one_tensor_as_query_and_support_with_different_clouds(backend):
    if not available_backends()[backend] if backend in ("grid", "pykdtree") else False:
        pytest.skip(f"{backend} not available")
    x = torch.rand(4000, 3, generator=torch.Generator().manual_seed(0))
    q_off, s_off = torch.tensor([3900, 4000]), torch.tensor([100, 4000])
    res = knn(x, x, 4, q_off, s_off, backend=backend)
    assert bool((res.index[:3900] < 100).all()) and bool((res.index[3900:] >= 100).all())


_NO_THREADS = r"""
import resource, sys
import numpy as np
from sciformer.geometry import grid_knn
rng = np.random.default_rng(0)
pts = rng.random((60_000, 3)).astype(np.float32)
sizes = [60_000]
before = grid_knn.grid_knn(pts, pts, sizes, sizes, 8, 1)
status = open("/proc/self/status").read()
vm = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmSize:"))) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
after = grid_knn.grid_knn(pts, pts, sizes, sizes, 8, 4)  # no 1 GiB thread stack fits in what is left
assert all(np.array_equal(a, b) for a, b in zip(before, after))
print("same")
"""


@needs_kernel
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="POSIX resource limits")
def test_threads_that_cannot_be_started_leave_the_work_to_those_that_were() -> None:
    """Where no thread can be created (here: each would need a 1 GiB stack beyond the address-space
    limit), the search runs on the calling thread with the same answer instead of aborting the process."""
    import resource
    import subprocess
    import sys

    def big_stacks() -> None:  # glibc sizes new threads' stacks from this limit, read at start-up
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 30, resource.getrlimit(resource.RLIMIT_STACK)[1]))

    proc = subprocess.run([sys.executable, "-c", _NO_THREADS], capture_output=True, text=True, preexec_fn=big_stacks, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "same", (proc.returncode, proc.stderr[-2000:])
