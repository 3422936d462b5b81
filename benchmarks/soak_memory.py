"""Memory soak: does resident memory keep growing over many training epochs?

Writes a synthetic hyperspectral scene (a blocky labelled cube, .npy pair) to a temporary
folder, trains a small ``spectral_spatial`` model on it with ``hsi_scene`` (block split,
validation every epoch, ``last.pt``/``best.pt`` written every epoch) through
:class:`sciformer.engine.trainer.Trainer`, and reads the process's resident memory
(``VmRSS`` in /proc/self/status) after every epoch through the trainer's ``log`` callback
(the engine is not modified). Prints one row per epoch and the growth over the second half
(least-squares slope in MB/epoch, and last minus first). The first half is warm-up:
allocator pools, lazily built caches and the optimiser state settle there.

Exits with status 1 when the second half grows by more than ``--max-growth-mb``.

    python benchmarks/soak_memory.py                 # 40 epochs, ~1-2 min on 2 cores
    python benchmarks/soak_memory.py --epochs 200 --max-growth-mb 20
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def rss_mb() -> float:
    """Current resident set size of this process (MB) from /proc/self/status (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmRSS not found in /proc/self/status (Linux only)")


def write_scene(folder: Path, h: int, w: int, bands: int, classes: int, seed: int = 0) -> None:
    """A blocky label map (8 x 8 tiles, a few unlabelled) and class-dependent spectra plus noise."""
    rng = np.random.default_rng(seed)
    gt = np.zeros((h, w), dtype=np.int64)
    for i in range(0, h, 8):
        for j in range(0, w, 8):
            gt[i : i + 8, j : j + 8] = rng.integers(0, classes + 1)
    for k in range(1, classes + 1):  # every class present
        gt[(3 * k) % h, (5 * k) % w] = k
    means = rng.normal(1000.0, 300.0, size=(classes + 1, bands))  # (K+1, B)
    cube = (means[gt] + rng.normal(0.0, 50.0, size=(h, w, bands))).astype(np.float32)  # (H, W, B)
    np.save(folder / "cube.npy", cube)
    np.save(folder / "gt.npy", gt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--max-growth-mb", type=float, default=20.0, help="fail when the second half grows more than this")
    ap.add_argument("--size", type=int, default=32, help="scene height and width")
    ap.add_argument("--bands", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--collect", action="store_true", help="run gc.collect() before each reading")
    args = ap.parse_args()
    if args.epochs < 4:
        ap.error("--epochs must be at least 4 (the second half is measured)")

    from sciformer import config
    from sciformer.engine.trainer import Trainer

    torch.set_num_threads(args.threads)
    rows: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    last = [start]

    def log(line: str = "", *_: object, **__: object) -> None:
        if isinstance(line, str) and line.startswith("epoch ") and "/" in line.split()[1]:
            if args.collect:
                gc.collect()
            now = time.perf_counter()
            rows.append((len(rows) + 1, rss_mb(), now - last[0]))
            last[0] = now

    with tempfile.TemporaryDirectory(prefix="sciformer-soak-") as tmp:
        folder = Path(tmp)
        write_scene(folder, args.size, args.size, args.bands, classes=5)
        raw = {
            "name": "soak",
            "data": {"name": "hsi_scene", "source": "cube.npy", "label_path": "gt.npy", "patch_size": 5,
                     "split": {"kind": "blocks", "block_size": 8, "train_fraction": 0.5, "val_fraction": 0.1}},
            "model": {"name": "spectral_spatial", "dim": 16, "depth": 1, "num_heads": 2, "spectral_hidden": 16, "band_group_size": 8},
            "optimizer": {"lr": 2e-3},
            "train": {"epochs": args.epochs, "batch_size": args.batch_size, "threads": args.threads, "progress": "never"},
            "evaluation": {"batch_size": 256},
        }
        exp = config.validate(raw, base_dir=folder, source="soak")
        before = rss_mb()
        trainer = Trainer(exp, folder / "run", log=log)
        print(f"sciformer memory soak: {args.epochs} epochs of hsi_scene {args.size}x{args.size}x{args.bands}, "
              f"{len(trainer.task.dataset('train'))} training patches, batch {args.batch_size}, {args.threads} threads")
        print(f"RSS before building the task: {before:.1f} MB; after: {rss_mb():.1f} MB")
        trainer.fit()
    total = time.perf_counter() - start

    print(f"\n{'epoch':>5}  {'RSS MB':>8}  {'delta MB':>8}  {'time s':>6}")
    for i, (epoch, rss, seconds) in enumerate(rows):
        delta = rss - rows[i - 1][1] if i else 0.0
        print(f"{epoch:>5}  {rss:>8.1f}  {delta:>+8.1f}  {seconds:>6.2f}")
    half = rows[len(rows) // 2 :]
    epochs = np.array([r[0] for r in half], dtype=np.float64)
    rss = np.array([r[1] for r in half], dtype=np.float64)
    slope = float(np.polyfit(epochs, rss, 1)[0]) if len(half) >= 2 else 0.0
    growth = float(rss[-1] - rss[0])
    fitted = slope * float(epochs[-1] - epochs[0])
    print(f"\nsecond half (epochs {int(epochs[0])}-{int(epochs[-1])}): slope {slope:+.3f} MB/epoch, "
          f"growth {growth:+.1f} MB (fitted {fitted:+.1f} MB); first-half growth {rows[len(rows) // 2][1] - rows[0][1]:+.1f} MB; "
          f"peak {max(r[1] for r in rows):.1f} MB; total {total:.0f} s")
    worst = max(growth, fitted)
    if worst > args.max_growth_mb:
        print(f"FAIL: resident memory grew {worst:.1f} MB over the second half (limit {args.max_growth_mb:g} MB)")
        return 1
    print(f"OK: growth over the second half within {args.max_growth_mb:g} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
