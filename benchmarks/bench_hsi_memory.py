"""Peak memory of the hyperspectral data path on a Pavia-University-sized scene.

Builds a random 610 x 340 x 103 cube with 9 classes (written to a temporary .npy pair),
runs the ``hsi_scene`` dataset (block split, standardisation, lazy 7 x 7 patches) through
a DataLoader and a stand-in model (one linear layer on the flattened patch) for one
training epoch, then predicts every pixel of the scene with tiled inference. Prints the
peak resident memory after each stage next to what a materialised patch array would take.

    python benchmarks/bench_hsi_memory.py [--batch-size 256] [--patch-size 7] [--workers 0]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from sciformer.contracts import BuildContext
from sciformer.data.hsi.task import HSISceneConfig, build_hsi_scene

H, W, B, K = 610, 340, 103, 9  # Pavia University


def peak_rss_mb() -> float:
    """Peak resident set size of this process (MB), from /proc or getrusage."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def write_scene(folder: Path, seed: int = 0) -> None:
    """Random uint16 cube (like the sensor's DNs) and a blocky 9-class map, ~20% labelled."""
    rng = np.random.default_rng(seed)
    gt = np.zeros((H, W), dtype=np.uint8)
    for _ in range(400):
        y, x = rng.integers(0, H - 30), rng.integers(0, W - 30)
        gt[y : y + rng.integers(5, 30), x : x + rng.integers(5, 30)] = rng.integers(1, K + 1)
    cube = rng.integers(0, 8000, size=(H, W, B), dtype=np.uint16)  # (H, W, B)
    np.save(folder / "cube.npy", cube)
    np.save(folder / "gt.npy", gt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--predict-batch-size", type=int, default=2048)
    ap.add_argument("--patch-size", type=int, default=7)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    p = args.patch_size
    rows = []

    def stage(name: str, t0: float, extra: str = "") -> None:
        rows.append((name, time.perf_counter() - t0, peak_rss_mb(), extra))

    t = time.perf_counter()
    stage("start (python + torch)", t)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        write_scene(folder)
        stage("write random scene files", t)

        t = time.perf_counter()
        cfg = HSISceneConfig(source="cube.npy", label_path="gt.npy", patch_size=p, split={"block_size": 24})
        task = build_hsi_scene(cfg, BuildContext(base_dir=folder, seed=0))
        counts = task.split.counts()
        stage("build task (read, split, normalise, pad)", t, f"train {counts['train']}, test {counts['test']}")

        model = nn.Sequential(nn.Flatten(), nn.Linear(B * p * p, K))  # stand-in for a real model
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        loader = DataLoader(
            task.dataset("train"), batch_size=args.batch_size, shuffle=True, collate_fn=task.collate,
            num_workers=args.workers,
        )
        t = time.perf_counter()
        model.train()
        for batch in loader:
            loss = nn.functional.cross_entropy(model(batch["patch"]), batch["target"])
            opt.zero_grad()
            loss.backward()
            opt.step()
        stage("train epoch (DataLoader + linear model)", t, f"{len(loader)} batches of {args.batch_size}")

        t = time.perf_counter()
        model.eval()
        facts = task.export_predictions(
            lambda b: model(b["patch"]), folder / "pred", args.predict_batch_size,
            SimpleNamespace(npy=True, png=False, envi=False),
        )
        stage("predict whole scene (tiled)", t, f"{H * W} pixels, map {facts['map_shape']}")

    n_train, n_all = counts["train"], H * W
    gb = lambda n: n * B * p * p * 4 / 1e9  # noqa: E731
    print(f"\nhsi_scene memory, {H} x {W} x {B} cube, {K} classes, patch {p}, torch {torch.__version__}")
    print(f"{'stage':44s} {'seconds':>8s} {'peak RSS MB':>12s}  notes")
    for name, sec, mb, extra in rows:
        print(f"{name:44s} {sec:8.2f} {mb:12.0f}  {extra}")
    print(
        f"\nmaterialised (n, B, p, p) float32 arrays would take {gb(n_train):.2f} GB for the training pixels "
        f"and {gb(n_all):.2f} GB for the whole scene"
    )
    peak = peak_rss_mb()
    verdict = "OK" if peak < 2048 else "OVER"
    print(f"peak RSS {peak:.0f} MB: {verdict} (limit 2048 MB)")
    if peak >= 2048:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
