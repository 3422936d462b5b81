"""PLY / PCD read time on 1M points: sciformer's pure readers vs open3d, one run.

Data: the SemanticKITTI scans of ``$SCIFORMER_DATA/semantickitti_scans`` stacked (copies
side by side) to ``--points`` real points, with 8-bit colours and unit normals, written as
binary PLY (sciformer's writer) and as binary and binary_compressed PCD (open3d's writer;
without open3d only the PLY row runs). Columns, each the median of ``--repeats``
round-robin reads: ``pure`` = ``read_point_file`` with ``SCIFORMER_NO_OPEN3D=1``;
``open3d`` = ``open3d.io.read_point_cloud`` plus the numpy arrays; ``sciformer`` =
``read_point_file`` as shipped (open3d for compressed PCD when installed, else pure).
``identical`` compares the shipped reader's arrays with the pure reader's.

    python benchmarks/bench_point_io.py                 # 1M points, 5 repeats
    python benchmarks/bench_point_io.py --points 200000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from sciformer.contracts import default_data_root
from sciformer.data.pointcloud.io import read_point_file
from sciformer.data.pointcloud.open3d_io import open3d_available
from sciformer.data.pointcloud.ply import write_ply


def real_points(n: int) -> np.ndarray:
    scans = sorted((default_data_root() / "semantickitti_scans").glob("*_points.npy"))
    if not scans:
        raise SystemExit("no SemanticKITTI scans under $SCIFORMER_DATA/semantickitti_scans")
    stack = np.concatenate([np.load(p).astype(np.float64)[:, :3] for p in scans])  # (m, 3)
    reps = -(-n // len(stack))
    shifted = [stack + np.array([200.0 * r, 0.0, 0.0]) for r in range(reps)]  # copies side by side, never duplicates
    return np.concatenate(shifted)[:n]


def timed(path: Path, how: str) -> tuple[float, dict]:
    """Seconds and arrays of one read: ``pure``, ``open3d`` (direct) or ``sciformer`` (as shipped)."""
    os.environ.pop("SCIFORMER_NO_OPEN3D", None)
    if how == "pure":
        os.environ["SCIFORMER_NO_OPEN3D"] = "1"
    start = time.perf_counter()
    if how == "open3d":
        import open3d as o3d

        cloud = o3d.io.read_point_cloud(str(path))
        data = {"coord": np.asarray(cloud.points), "colour": np.asarray(cloud.colors), "normal": np.asarray(cloud.normals)}
    else:
        data = read_point_file(path)
    return time.perf_counter() - start, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    coord = real_points(args.points)
    rng = np.random.default_rng(0)
    colour = rng.integers(0, 256, size=(len(coord), 3), dtype=np.uint8)
    normal = (coord / np.linalg.norm(coord, axis=1, keepdims=True)).astype(np.float32)
    have_o3d = open3d_available()
    with tempfile.TemporaryDirectory() as tmp:
        files = {"PLY binary": write_ply(Path(tmp) / "cloud.ply", coord.astype(np.float32), colour, normal=normal)}
        if have_o3d:
            import open3d as o3d

            cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(coord.astype(np.float32).astype(np.float64)))
            cloud.colors = o3d.utility.Vector3dVector(colour / 255.0)
            cloud.normals = o3d.utility.Vector3dVector(normal.astype(np.float64))
            for name, compressed in (("PCD binary", False), ("PCD binary_compressed", True)):
                path = Path(tmp) / f"cloud_{int(compressed)}.pcd"
                o3d.io.write_point_cloud(str(path), cloud, compressed=compressed)
                files[name] = path
        print(f"{args.points:,} real points (SemanticKITTI), colour + normals; median of {args.repeats} reads; "
              f"open3d {'present' if have_o3d else 'absent'}")
        print(f"{'file':<24}{'size MB':>9}{'pure (s)':>10}{'open3d (s)':>12}{'sciformer (s)':>15}  identical")
        hows = ("pure", "open3d", "sciformer") if have_o3d else ("pure",)
        for name, path in files.items():
            times: dict[str, list[float]] = {h: [] for h in hows}
            arrays: dict[str, dict] = {}
            for _ in range(args.repeats):
                for how in hows:
                    t, arrays[how] = timed(path, how)
                    times[how].append(t)
            med = {h: statistics.median(v) for h, v in times.items()}
            size = path.stat().st_size / 1e6
            if have_o3d:
                pure, shipped = arrays["pure"], arrays["sciformer"]
                same = sorted(pure) == sorted(shipped) and all(np.array_equal(pure[k], shipped[k]) for k in pure)
                print(f"{name:<24}{size:>9.1f}{med['pure']:>10.3f}{med['open3d']:>12.3f}{med['sciformer']:>15.3f}  {same}")
            else:
                print(f"{name:<24}{size:>9.1f}{med['pure']:>10.3f}{'absent':>12}{med['pure']:>15.3f}")
    os.environ.pop("SCIFORMER_NO_OPEN3D", None)


if __name__ == "__main__":
    main()
