"""Real-data cases of ``bench_geometry.py`` (``--only real``): kNN on the largest LiDAR tiles and
the SemanticKITTI scans in file order and shuffled, uniform random points, a batch of ModelNet10
clouds at 1 and 2 threads; FPS on the tiles. Sciformer vs pykdtree / scipy / fpsample, methods
interleaved round by round (median time; ratio = median of the per-round ratios)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from sciformer.geometry import fps, knn

K = 16


def real_clouds(root, rng: np.random.Generator, tiles: int) -> list[tuple[str, np.ndarray]]:
    """(name, points) of the largest LAS/LAZ tiles and the SemanticKITTI scans, each in file
    order and shuffled, then uniform random 100k; float32, shifted to the cloud's minimum
    corner (as the datasets feed them)."""
    from pathlib import Path

    from sciformer.data.pointcloud.io import read_point_file

    out: list[tuple[str, np.ndarray]] = []
    found = []
    for path in sorted(Path(root, "lidar").glob("*.la[sz]")):
        coord = np.asarray(read_point_file(path)["coord"], dtype=np.float64)
        found.append((len(coord), path.name, coord))
    found.sort(key=lambda t: -t[0])
    scans = [(p.name.removesuffix("_points.npy"), np.load(p).astype(np.float64))
             for p in sorted(Path(root, "semantickitti_scans").glob("*_points.npy"))]
    for name, coord in [(n, c) for _, n, c in found[:tiles]] + scans:
        pts = np.ascontiguousarray((coord[:, :3] - coord[:, :3].min(axis=0)).astype(np.float32))
        out.append((f"{name} (file order)", pts))
        out.append((f"{name} (shuffled)", np.ascontiguousarray(pts[rng.permutation(len(pts))])))
    out.append(("uniform random", rng.random((100_000, 3), dtype=np.float32)))
    return out


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Seconds of each function in each of ``repeats`` round-robin rounds (after one warm-up),
    and each function's last result."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    last = {name: fn() for name, fn in fns.items()}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            last[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return times, last


def same_rows(ours: torch.Tensor, theirs: np.ndarray) -> str:
    """Share of rows with the same neighbour set (ties at the k-th distance may differ)."""
    a, b = np.sort(ours.numpy(), axis=1), np.sort(theirs.astype(np.int64), axis=1)
    return f"{100 * (a == b).all(axis=1).mean():.2f}%"


def bench_real_knn(root, repeats: int, tiles: int, rng: np.random.Generator) -> list[list[str]]:
    """kNN (k=16, self-query) on real clouds and a ModelNet10 batch, sciformer vs pykdtree vs scipy."""
    from pykdtree.kdtree import KDTree
    from scipy.spatial import cKDTree
    from threadpoolctl import threadpool_limits

    rows = []
    threads = torch.get_num_threads()
    for name, pts in real_clouds(root, rng, tiles):
        print(f"# measuring kNN on {name} ...", file=sys.stderr, flush=True)
        x = torch.from_numpy(pts)
        times, last = interleaved({
            "sciformer": lambda: knn(x, None, K).index,
            "pykdtree": lambda: KDTree(pts, leafsize=16).query(pts, k=K)[1],
            "scipy": lambda: cKDTree(pts, leafsize=16).query(pts, k=K, workers=threads)[1],
        }, repeats)
        rows.append([f"kNN k={K}, {name}", f"{len(pts)}", str(threads), *fmt_times(times), same_rows(last["sciformer"], last["pykdtree"])])
    h5 = os.path.join(root, "modelnet10_hdf5_1024", "ply_data_train0.h5")
    import h5py

    with h5py.File(h5, "r") as f:
        batch = np.asarray(f["data"][:32], dtype=np.float32)  # (32, 1024, 3)
    clouds = [np.ascontiguousarray(c) for c in batch]
    x, offset = torch.from_numpy(batch.reshape(-1, 3)), torch.arange(1, 33) * batch.shape[1]
    for t in (1, 2):
        print(f"# measuring kNN on the ModelNet10 batch, {t} thread(s) ...", file=sys.stderr, flush=True)
        torch.set_num_threads(t)
        with threadpool_limits(t, user_api="openmp"):  # pykdtree gets the same threads
            times, last = interleaved({
                "sciformer": lambda: knn(x, None, K, offset).index,
                "pykdtree": lambda: np.concatenate(
                    [KDTree(c, leafsize=16).query(c, k=K)[1].astype(np.int64) + 1024 * b for b, c in enumerate(clouds)]),
                "scipy": lambda: np.concatenate(
                    [cKDTree(c, leafsize=16).query(c, k=K, workers=t)[1] + 1024 * b for b, c in enumerate(clouds)]),
            }, repeats)
        rows.append([f"kNN k={K}, ModelNet10 batch 32 x 1024 (one call vs a loop over clouds)", "32768", str(t),
                     *fmt_times(times), same_rows(last["sciformer"], last["pykdtree"])])
    torch.set_num_threads(threads)
    return rows


def fmt_times(times: dict[str, list[float]]) -> list[str]:
    """Median seconds of sciformer, the reference peer and scipy ("-" if none), and the median
    over rounds of sciformer's time / the peer's in the same round (robust to the machine's
    speed drifting between rounds)."""
    ours, peer, *rest = times.values()
    ratio = statistics.median(a / b for a, b in zip(ours, peer))
    med = [f"{statistics.median(t):.4f}" for t in (ours, peer, *rest)]
    return [med[0], med[1], med[2] if rest else "-", f"**{ratio:.2f}x**"]


def bench_real_fps(root, repeats: int, tiles: int, rng: np.random.Generator) -> list[list[str]]:
    """FPS to N/4 from index 0 on the largest LiDAR tiles, sciformer vs fpsample's bucket FPS."""
    import fpsample

    rows = []
    for name, pts in [c for c in real_clouds(root, rng, tiles) if "(file order)" in c[0]][:tiles]:
        print(f"# measuring FPS on {name} ...", file=sys.stderr, flush=True)
        x, m = torch.from_numpy(pts), len(pts) // 4
        height = int(min(max(round(np.log2(len(pts)) / 2 - 1), 1), np.floor(np.log2(len(pts)))))
        times, last = interleaved({
            "sciformer": lambda: fps(x, n=m, start=0).index,
            "fpsample": lambda: fpsample.bucket_fps_kdline_sampling(pts, m, height, start_idx=0),
        }, repeats)
        theirs = last["fpsample"].astype(np.int64)  # starts where its KD reordering put index 0
        ours = fps(x, n=m, start=int(theirs[0])).index.numpy()
        first = int(np.argmax(ours != theirs)) if not np.array_equal(ours, theirs) else m
        same = "identical" if first == m else f"first {first} equal (float32 near-tie), " + (
            "same set" if np.array_equal(np.sort(ours), np.sort(theirs)) else "sets differ")
        rows.append([f"FPS {name} -> N/4", f"{len(pts)}", str(torch.get_num_threads()), *fmt_times(times), same])
    return rows


def print_real(rows: list[list[str]]) -> None:
    print("| case | points | threads | sciformer (s) | pykdtree / fpsample (s) | scipy cKDTree (s) | sciformer / peer | agrees |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
