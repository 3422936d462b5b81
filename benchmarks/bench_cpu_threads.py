"""Training-step time of the ModelNet10 experiment's model at 1 and 2 intra-op threads.

Why ``experiments/modelnet10.yaml`` sets ``train.threads: 1``: on small clouds a step is
many small operations, and OpenMP's per-operation synchronisation can cost more than a
second thread gains. Each thread count runs in its own child process (the thread count
is fixed at start-up); the rounds alternate between them so drift on a shared machine
hits both alike. The model is the experiment's (v1 attention, or ``--attention ptv2``),
the batch 32 random clouds of 512 points with 10 classes (the cost does not depend on the
values). Prints the median step time per thread count and the ratio to 1 thread.

    python benchmarks/bench_cpu_threads.py                  # 1 and 2 threads, 5 rounds
    python benchmarks/bench_cpu_threads.py --attention ptv2 --threads 1 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(threads: int, attention: str, steps: int) -> None:
    """Time ``steps`` optimiser steps (after 2 warm-up steps); print their times as JSON."""
    import time

    import torch

    from sciformer import config
    from sciformer.contracts import DataInfo
    from sciformer.engine import builders

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    exp = config.load(ROOT / "experiments" / "modelnet10.yaml", [f"model.attention={attention}"])
    info = DataInfo(10, [f"c{i}" for i in range(10)], 0, task="classification")
    model = builders.build_model(exp, info).train()
    optimizer = builders.build_optimizer(exp.cfg.optimizer, model)
    clouds, points = exp.cfg.train.batch_size, 512
    batch = {"coord": torch.rand(clouds * points, 3), "feat": torch.zeros(clouds * points, 0),
             "offset": torch.arange(1, clouds + 1) * points, "target": torch.randint(0, 10, (clouds,))}
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(batch), batch["target"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i >= 2:
            times.append(time.perf_counter() - start)
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--attention", choices=["ptv1", "ptv2"], default="ptv1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.attention, args.steps)
        return
    times: dict[int, list[float]] = {t: [] for t in args.threads}
    for _ in range(args.rounds):
        for t in args.threads:
            cmd = [sys.executable, __file__, "--child", str(t), "--attention", args.attention, "--steps", str(args.steps)]
            env = {**os.environ, "OMP_NUM_THREADS": str(t)}
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            times[t].extend(json.loads(out.strip().splitlines()[-1]))
    base = statistics.median(times[args.threads[0]])
    print(f"ModelNet10 model ({args.attention}), batch 32 x 512 points, training step; {args.rounds} rounds x {args.steps} steps")
    print(f"{'threads':>7}  {'median s/step':>13}  {'vs ' + str(args.threads[0]) + ' thread':>12}")
    for t in args.threads:
        med = statistics.median(times[t])
        print(f"{t:>7}  {med:>13.3f}  {med / base:>11.2f}x")


if __name__ == "__main__":
    main()
