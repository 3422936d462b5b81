"""Neighbourhood builders: sciformer.geometry vs every peer present, measured in one run.

Rows: kNN (k=16, self-query) at 10k / 100k / 1M points, FPS to N/4 at 10k / 80k points,
grid pooling at 1M points; GPU rows when CUDA exists. Data: uniform random float32 points
in the unit cube (fixed seed). The methods of one case run round-robin, ``--repeats`` times
and on until each has used 3 s (at most 40 runs), and each keeps its best time: on a busy
machine the best of many runs is the one least disturbed, for every method alike. The ratio column
divides by the fastest *peer* (non-sciformer row) of the same case; every FPS peer listed
is exact. "agrees" compares each peer's output with sciformer's. Peers that are not
installed print as "absent"; peers whose estimated time (scaled from the previous size)
exceeds ``--budget`` print as "skipped (> budget)" with the estimate.

    python benchmarks/bench_geometry.py            # both tables (~3-5 min, plus ~8 min for real data)
    python benchmarks/bench_geometry.py --quick    # 1 repeat, 1 s per method, 10 s budget, 3 real-data runs
    python benchmarks/bench_geometry.py --only knn fps --knn-sizes 10000 100000
    python benchmarks/bench_geometry.py --only real   # real data only (~8 min on 2 loaded cores)

Real-data cases (``real``, from ``$SCIFORMER_DATA``): kNN (k=16) on the largest LiDAR tiles
and the SemanticKITTI scans, in file order and shuffled, on uniform random 100k points and
on a batch of 32 ModelNet10 clouds x 1024 points at 1 and 2 torch threads (pykdtree and
scipy then loop over the clouds with the same threads); FPS to N/4 on the tiles vs
fpsample. Each method runs round-robin ``--real-repeats`` times; the median time is kept,
and the ratio to the peer is the median of the per-round ratios (each round's methods run
back to back, so a drift of the machine's speed between rounds cancels).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from sciformer.geometry import fps, grid_pool, knn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # geometry_real / geometry_table beside this script, however it is loaded
from geometry_real import K, bench_real_fps, bench_real_knn, print_real  # noqa: E402
from geometry_table import Bench, has  # noqa: E402

# --------------------------------------------------------------------------- kNN


def knn_peers(x_np: np.ndarray, device: str) -> dict[str, Callable[[], tuple[np.ndarray, np.ndarray]] | None]:
    """Each peer returns (indices (N, K), distances) for the self-query."""
    peers: dict[str, Callable | None] = {}
    if device == "cpu":
        from scipy.spatial import cKDTree

        peers["scipy cKDTree (workers=-1)"] = lambda: cKDTree(x_np).query(x_np, k=K, workers=-1)[::-1]
        if has("pykdtree"):
            from pykdtree.kdtree import KDTree

            peers["pykdtree"] = lambda: KDTree(x_np).query(x_np, k=K)[::-1]
        else:
            peers["pykdtree"] = None
        if has("open3d"):
            import open3d.core as o3c

            def o3d_knn():
                pts = o3c.Tensor(x_np)
                nns = o3c.nns.NearestNeighborSearch(pts)
                nns.knn_index()
                idx, d2 = nns.knn_search(pts, K)
                return idx.numpy(), d2.numpy()

            peers["open3d NearestNeighborSearch"] = o3d_knn
        else:
            peers["open3d NearestNeighborSearch"] = None
    x = torch.from_numpy(x_np).to(device)
    if has("torch_cluster"):
        import torch_cluster

        peers["torch_cluster.knn"] = lambda: torch_cluster.knn(x, x, K)
    else:
        peers["torch_cluster.knn"] = None
    peers["torch brute force (cdist+topk)"] = lambda: brute_knn(x)
    return peers


def brute_knn(x: torch.Tensor, rows: int | None = None):
    """Chunked ``cdist`` + ``topk`` for the first ``rows`` queries (all by default)."""
    out = []
    chunk = max(1, (1 << 24) // len(x))
    for s in range(0, len(x) if rows is None else rows, chunk):
        out.append(torch.cdist(x[s : s + chunk], x).topk(K, largest=False).indices)
    result = torch.cat(out)
    if x.is_cuda:
        torch.cuda.synchronize()
    return result


def neighbour_agreement(ours: torch.Tensor, theirs, rows: np.ndarray) -> str:
    """Share of sampled rows whose neighbour sets are identical."""
    if isinstance(theirs, tuple):
        theirs = theirs[0]
    if isinstance(theirs, torch.Tensor) and theirs.ndim == 2 and theirs.shape[0] == 2 and ours.shape[0] != 2:
        return ""  # edge-list format (torch_cluster): not compared
    theirs = np.asarray(theirs.cpu() if isinstance(theirs, torch.Tensor) else theirs)[rows].astype(np.int64)
    same = (np.sort(ours.cpu().numpy()[rows], axis=1) == np.sort(theirs, axis=1)).all(axis=1).mean()
    return f"{100 * same:.2f}% rows"


def bench_knn(bench: Bench, sizes: list[int], device: str, rng: np.random.Generator) -> None:
    brute_rate = None  # seconds per (query x support) pair: probe, then the previous size
    for n in sizes:
        case = f"kNN k={K}, N={n // 1000}k{' (GPU)' if device != 'cpu' else ''}"
        x_np = rng.random((n, 3), dtype=np.float32)
        x = torch.from_numpy(x_np).to(device)
        sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

        def ours():
            res = knn(x, None, K)
            sync()
            return res

        bench.add(case, "sciformer knn (auto)", ours, peer=False)
        if device == "cpu":  # the KD-tree path, what runs without the compiled kernel
            bench.add(case, "sciformer knn (kdtree)", lambda: knn(x, None, K, backend="kdtree"), peer=False)
        ours_idx = knn(x, None, K).index
        rows = rng.choice(n, size=min(n, 20_000), replace=False)
        brute = None
        if brute_rate is None:  # probe 1000 queries
            t0 = time.perf_counter()
            brute_knn(x, rows=min(n, 1000))
            brute_rate = (time.perf_counter() - t0) / (min(n, 1000) * n)
        for name, fn in knn_peers(x_np, device).items():
            estimate = brute_rate * n * n if name.startswith("torch brute") else None
            check = None if fn is None else (lambda out: neighbour_agreement(ours_idx, out, rows))
            row = bench.add(case, name, fn, estimate=estimate, check=check)
            brute = row if name.startswith("torch brute") else brute
        bench.measure()
        if brute is not None and brute.seconds is not None:
            brute_rate = brute.seconds / (n * n)


# --------------------------------------------------------------------------- FPS


def torch_loop_fps(x: torch.Tensor, m: int) -> torch.Tensor:
    """The vectorised torch loop users write (one cloud, start 0)."""
    n = len(x)
    dist = torch.full((n,), float("inf"), device=x.device)
    out = torch.zeros(m, dtype=torch.long, device=x.device)
    far = torch.zeros((), dtype=torch.long, device=x.device)
    for i in range(m):
        out[i] = far
        dist = torch.minimum(dist, ((x - x[far]) ** 2).sum(-1))
        far = dist.argmax()
    if x.is_cuda:
        torch.cuda.synchronize()
    return out


def bench_fps(bench: Bench, sizes: list[int], device: str, rng: np.random.Generator) -> None:
    for n in sizes:
        m = n // 4
        case = f"FPS N={n // 1000}k -> {m // 1000 if m >= 1000 else m}{'k' if m >= 1000 else ''}{' (GPU)' if device != 'cpu' else ''}"
        x_np = rng.random((n, 3), dtype=np.float32)
        x = torch.from_numpy(x_np).to(device)
        sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

        def ours():
            res = fps(x, n=m, start=0)
            sync()
            return res.index

        bench.add(case, "sciformer fps (auto, exact)", ours, peer=False)
        ours_idx = fps(x, n=m, start=0).index.cpu().numpy()

        def same_as_ours(out) -> str:
            out = np.asarray(out.cpu() if isinstance(out, torch.Tensor) else out)
            if out.ndim == 2:  # sampled points in index order, not FPS order (open3d): compare sets
                ours_pts = x_np[ours_idx].astype(out.dtype)
                same = np.array_equal(out[np.lexsort(out.T)], ours_pts[np.lexsort(ours_pts.T)])
                return "same point set" if same else "different point set"
            out = out.astype(np.int64)
            if np.array_equal(out, ours_idx):
                return "identical"
            if out[0] != ours_idx[0]:
                return f"starts at {out[0]}, not 0"
            first = int(np.argmax(out != ours_idx))
            # at the first difference both picks should be (almost) equally far from the prefix
            from scipy.spatial import cKDTree

            prefix = cKDTree(x_np[out[:first]].astype(np.float64))
            d_theirs, d_ours = prefix.query(x_np[[out[first], ours_idx[first]]].astype(np.float64))[0]
            gap = abs(d_theirs - d_ours) / max(d_theirs, d_ours, 1e-300)
            kind = "same set" if np.array_equal(np.sort(out), np.sort(ours_idx)) else "sets differ"
            return f"first {first} equal (tie: rel. gap {gap:.0e}), {kind}"

        def add_quadratic(name, make, peer=True, note=""):
            """O(N*M) methods: ``make(m)`` builds the call; a 200-sample probe estimates the time."""
            if make is None:
                bench.add(case, name, None)
                return
            probe = min(m, 200)
            t0 = time.perf_counter()
            make(probe)()
            estimate = (time.perf_counter() - t0) * m / probe
            bench.add(case, name, make(m), peer=peer, estimate=estimate, check=same_as_ours, note=note)

        if device == "cpu":
            add_quadratic(
                "sciformer fps (numpy fallback)",
                lambda k: lambda: fps(x, n=k, start=0, backend="numpy").index, peer=False,
            )
            if has("fpsample"):
                import fpsample

                height = int(min(max(round(np.log2(n) / 2 - 1), 1), np.floor(np.log2(n))))
                bench.add(
                    case, f"fpsample.bucket_fps_kdline_sampling (h={height})",
                    lambda: fpsample.bucket_fps_kdline_sampling(x_np, m, height, start_idx=0),
                    check=same_as_ours, note="exact, but start_idx is read after its KD reordering",
                )
                add_quadratic("fpsample.fps_sampling (plain)", lambda k: lambda: fpsample.fps_sampling(x_np, k, start_idx=0))
            else:
                bench.add(case, "fpsample.bucket_fps_kdline_sampling", None)
                add_quadratic("fpsample.fps_sampling (plain)", None)
            if has("open3d"):
                import open3d as o3d

                def o3d_fps(k):
                    def run():
                        pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(x_np.astype(np.float64)))
                        return np.asarray(pcd.farthest_point_down_sample(k, 0).points)

                    return run

                add_quadratic("open3d farthest_point_down_sample", o3d_fps, note="returns points (index order), not indices")
            else:
                add_quadratic("open3d farthest_point_down_sample", None)
        if has("torch_cluster"):
            import torch_cluster

            add_quadratic("torch_cluster.fps", lambda k: lambda: torch_cluster.fps(x, ratio=k / n, random_start=False))
        else:
            add_quadratic("torch_cluster.fps", None)
        add_quadratic("torch loop (vectorised)", lambda k: lambda: torch_loop_fps(x, k))
        bench.measure()


# --------------------------------------------------------------------------- grid


def numpy_grid(x_np: np.ndarray, size: float):
    """Pointcept-style: integer voxel key, np.unique with inverse, mean by bincount."""
    cell = np.floor((x_np - x_np.min(0)) / size).astype(np.int64)
    ext = cell.max(0) + 1
    key = (cell[:, 0] * ext[1] + cell[:, 1]) * ext[2] + cell[:, 2]
    _, inverse, count = np.unique(key, return_inverse=True, return_counts=True)
    mean = np.stack([np.bincount(inverse, weights=x_np[:, d]) for d in range(3)], 1) / count[:, None]
    return inverse, mean


def bench_grid(bench: Bench, n: int, device: str, rng: np.random.Generator) -> None:
    size = 0.01  # ~1M cells for 1M uniform points in the unit cube: ~63% occupied
    case = f"grid pool N={n // 1000}k, voxel {size}{' (GPU)' if device != 'cpu' else ''}"
    x_np = rng.random((n, 3), dtype=np.float32)
    x = torch.from_numpy(x_np).to(device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def ours():
        res = grid_pool(x, size)
        sync()
        return res

    bench.add(case, "sciformer grid_pool (mean coord)", ours, peer=False)
    n_vox = grid_pool(x, size).coord.shape[0]
    count = lambda out: f"{len(out) if not isinstance(out, tuple) else len(out[1])} voxels vs {n_vox}"  # noqa: E731
    if device == "cpu":
        bench.add(case, "numpy unique + bincount (Pointcept-style)", lambda: numpy_grid(x_np, size), check=count)
        if has("open3d"):
            import open3d as o3d

            def o3d_voxel():
                pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(x_np.astype(np.float64)))
                return np.asarray(pcd.voxel_down_sample(size).points)

            bench.add(case, "open3d voxel_down_sample", o3d_voxel, check=count, note="single cloud only")
        else:
            bench.add(case, "open3d voxel_down_sample", None)
    if has("torch_cluster"):
        import torch_cluster

        bench.add(case, "torch_cluster.grid_cluster", lambda: torch_cluster.grid_cluster(x, torch.full((3,), size, device=device)))
    else:
        bench.add(case, "torch_cluster.grid_cluster", None)
    bench.measure()


# --------------------------------------------------------------------------- main


def versions() -> str:
    out = [f"python {platform.python_version()}", f"torch {torch.__version__}", f"numpy {np.__version__}"]
    for name in ("scipy", "pykdtree", "fpsample", "open3d", "torch_cluster"):
        if has(name):
            try:
                from importlib.metadata import version

                out.append(f"{name} {version(name)}")
            except Exception:  # pragma: no cover - metadata missing
                out.append(f"{name} ?")
        else:
            out.append(f"{name} absent")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 s per method, 10 s budget (1M rows still run)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per measurement, best kept (default 3, quick 1)")
    parser.add_argument("--budget", type=float, default=None, help="skip peers estimated slower than this (s; default 30, quick 10)")
    parser.add_argument("--only", nargs="+", choices=["knn", "fps", "grid", "real"], default=["knn", "fps", "grid", "real"])
    parser.add_argument("--real-repeats", type=int, default=None, help="interleaved runs per real-data case, median kept (default 7, quick 3)")
    parser.add_argument("--tiles", type=int, default=2, help="how many of the largest LiDAR tiles (default 2)")
    parser.add_argument("--knn-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--fps-sizes", type=int, nargs="+", default=[10_000, 80_000])
    parser.add_argument("--grid-size", type=int, default=1_000_000)
    parser.add_argument("--no-cuda", action="store_true", help="skip GPU rows even when CUDA exists")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    budget = args.budget or (10.0 if args.quick else 30.0)

    print(f"# bench_geometry: {versions()}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# cpus {os.cpu_count()}, torch threads {torch.get_num_threads()}, load {load:.1f}, "
          f"repeats {repeats}, budget {budget:.0f} s, cuda {torch.cuda.is_available()}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and not args.no_cuda else [])
    bench = Bench(repeats, budget, min_time=1.0 if args.quick else 3.0)
    warm = torch.rand(2000, 3)  # imports and first-call costs out of the timings
    knn(warm, None, K), fps(warm, n=500), grid_pool(warm, 0.1)
    for device in devices:
        rng = np.random.default_rng(0)
        if "knn" in args.only:
            bench_knn(bench, sorted(args.knn_sizes), device, rng)
        if "fps" in args.only:
            bench_fps(bench, sorted(args.fps_sizes), device, rng)
        if "grid" in args.only:
            bench_grid(bench, args.grid_size, device, rng)
    real: list[list[str]] = []
    real_repeats = args.real_repeats or (3 if args.quick else 7)
    if "real" in args.only:
        from sciformer.contracts import default_data_root

        root = default_data_root()
        if not (root / "lidar").is_dir():
            print(f"# real-data cases skipped: no {root / 'lidar'} (set SCIFORMER_DATA)")
        else:
            rng = np.random.default_rng(0)
            real = bench_real_knn(root, real_repeats, args.tiles, rng)
            if has("fpsample"):
                real += bench_real_fps(root, real_repeats, args.tiles, rng)
    if bench.rows:
        print()
        bench.print_table()
    if real:
        print()
        print(f"# real data: median of {real_repeats} interleaved runs per method; sciformer / peer: median of the "
              "per-round ratios; pykdtree and scipy at the case's threads")
        print_real(real)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
