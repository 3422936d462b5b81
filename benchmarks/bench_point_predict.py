"""Whole-scene prediction in bounded memory: a 1,000,000-point scene through the chunked path.

Builds a synthetic airborne-LiDAR-like scene (ground plane, box buildings, round trees;
4 classes, intensity as the feature), a default-size ``point_transformer_seg`` (channels
32/64/128/256/512, blocks 1/2/3/5/2, untrained: the cost does not depend on the weights),
and predicts every point through the data layer's scene path (``SceneEvalDataset`` +
``predict_scene``, as ``sciformer predict`` does for a LAS tile): overlapping chunks of at
most ``--max-points`` points, softmax summed per point. The work runs in a child process
whose peak resident memory (``ru_maxrss``) is printed with the time, so nothing of the
parent (or of earlier runs) counts.

    python benchmarks/bench_point_predict.py                    # 1M points, chunks of 100k
    python benchmarks/bench_point_predict.py --points 200000 --max-points 50000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

LIMIT_GB = 4.0


def synthetic_scene(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """coord (n, 3) float64 over 300 m x 300 m, label (n,) int64, intensity (n,) float32."""
    rng = np.random.default_rng(seed)
    size = 300.0
    n_ground, n_build = int(0.5 * n), int(0.25 * n)
    n_tree = n - n_ground - n_build
    ground = np.column_stack([rng.uniform(0, size, (n_ground, 2)), rng.normal(0, 0.05, n_ground)])
    centres = rng.uniform(20, size - 20, (40, 2))
    b = rng.integers(0, 40, n_build)
    roof = centres[b] + rng.uniform(-8, 8, (n_build, 2))
    build = np.column_stack([roof, 6.0 + 0.3 * (b % 5) + rng.normal(0, 0.05, n_build)])
    trunks = rng.uniform(0, size, (400, 2))
    t = rng.integers(0, 400, n_tree)
    d = rng.normal(0, 1.0, (n_tree, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    tree = np.column_stack([trunks[t], np.full(n_tree, 5.0)]) + d * rng.uniform(0, 3, (n_tree, 1))
    coord = np.concatenate([ground, build, tree])
    label = np.concatenate([np.zeros(n_ground), np.full(n_build, 2), np.ones(n_tree)]).astype(np.int64)
    intensity = rng.uniform(0, 1, n).astype(np.float32)
    return {"coord": coord, "label": label, "intensity": intensity}


def child(args: argparse.Namespace) -> None:
    import torch

    from sciformer.contracts import DataInfo
    from sciformer.data.pointcloud.sample import collate_points
    from sciformer.data.pointcloud.scenes import (
        ArrayScene,
        SceneEvalDataset,
        predict_scene,
    )
    from sciformer.registry import MODELS

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sample = synthetic_scene(args.points)
    entry = MODELS.get("point_transformer_seg")
    info = DataInfo(4, ["ground", "vegetation", "building", "other"], 1, task="segmentation")
    model = entry.builder(entry.config(), info).eval()
    params = sum(p.numel() for p in model.parameters())
    dataset = SceneEvalDataset(ArrayScene(sample, "synthetic"), grid_size=None, max_points=args.max_points,
                               part_z="min", transform=None, features=["intensity"], seed=0)

    def predict(batch: dict) -> torch.Tensor:
        with torch.no_grad():
            return model(batch)

    start = time.perf_counter()
    cpu = time.process_time()
    pred = predict_scene(dataset, 0, predict, collate_points, batch_size=1, num_classes=4, overlap=args.overlap)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert pred.shape == (args.points,)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: kilobytes
    print(json.dumps({"points": args.points, "max_points": args.max_points, "overlap": args.overlap,
                      "parameters": params, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                      "peak_rss_gb": round(peak_kb / 2**20, 3), "threads": args.threads}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--max-points", type=int, default=100_000, help="chunk size bound (cores plus context)")
    parser.add_argument("--overlap", type=float, default=0.25, help="context points per core point")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    cmd = [sys.executable, __file__, "--child", "--points", str(args.points), "--max-points", str(args.max_points),
           "--overlap", str(args.overlap), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.stderr.write(out.stderr)
        return out.returncode
    r = json.loads(out.stdout.strip().splitlines()[-1])
    verdict = "OK" if r["peak_rss_gb"] < LIMIT_GB else "OVER"
    print(f"chunked prediction of {r['points']:,} points (default point_transformer_seg, {r['parameters']:,} parameters)")
    print(f"  chunks <= {r['max_points']:,} points, overlap {r['overlap']}, {r['threads']} threads")
    print(f"  time {r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU")
    print(f"  peak RSS {r['peak_rss_gb']:.2f} GB  ({verdict}: limit {LIMIT_GB:g} GB)")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    raise SystemExit(main())
