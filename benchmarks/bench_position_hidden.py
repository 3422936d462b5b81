"""Position MLP hidden layer of the v1 layer, ``ReLU(BN(Linear(pos_j - pos_i)))`` per edge, one run.

Training-mode forward + backward (BatchNorm over all edges, gradients in pos and the
parameters) at N points with k neighbours each (uniform points, kNN by scipy):

- ``sciformer-T``: ``position_hidden`` on the compiled passes with T intra-op threads (the
  offsets recomputed per edge, never stored; queries split over the threads);
- ``torch``: the same modules on the materialised offsets (``pos[idx] - pos[i]``, (N k, 3)),
  what the layer would run without the compiled library, at the largest thread count.

The cases run interleaved, one step each per round after warm-up; the table shows the
median step time and its ratio to torch's.

    python benchmarks/bench_position_hidden.py                 # N 16384, k 16, threads 1,2
    python benchmarks/bench_position_hidden.py --n 100000 --threads 1,2 --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def build(case: str, pos, idx, lin, bn) -> Callable[[], None]:  # noqa: ANN001
    import torch

    from sciformer.attention._neighborhood_position import position_hidden

    n, k = idx.shape
    grad = torch.randn(n, k, lin.out_features)

    def compiled() -> None:
        p = pos.clone().requires_grad_()
        position_hidden(lin, bn, p, idx).backward(grad)

    def plain() -> None:
        p = pos.clone().requires_grad_()
        rel = p.index_select(0, idx.reshape(-1)) - p.repeat_interleave(k, 0)  # (N k, 3)
        torch.relu(bn(lin(rel))).view(n, k, -1).backward(grad)

    return plain if case == "torch" else compiled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--threads", default="1,2", help="thread counts of the compiled cases")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()

    import numpy as np
    import torch
    from scipy.spatial import cKDTree
    from torch import nn

    rng = np.random.default_rng(0)
    pts = rng.random((args.n, 3)).astype(np.float32)
    idx = torch.from_numpy(cKDTree(pts).query(pts, k=args.k)[1]).long()
    pos = torch.from_numpy(pts)
    torch.manual_seed(0)
    lin, bn = nn.Linear(3, 3), nn.BatchNorm1d(3)
    threads = [int(t) for t in args.threads.split(",")]
    cases = {f"sciformer-{t}": t for t in threads} | {"torch": max(threads)}
    steps = {c: build("torch" if c == "torch" else "compiled", pos, idx, lin, bn) for c in cases}
    times: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(args.rounds + 2):
        for c in cases if r % 2 else reversed(list(cases)):
            torch.set_num_threads(cases[c])
            t0 = time.perf_counter()
            steps[c]()
            if r >= 2:  # warm-up
                times[c].append(time.perf_counter() - t0)
    print(f"position MLP hidden layer fwd+bwd (training), N={args.n}, k={args.k}, {args.rounds} interleaved rounds; torch {torch.__version__}")
    base = statistics.median(times["torch"])
    print("| case | threads | median ms | vs torch |\n|---|---:|---:|---:|")
    for c, t in cases.items():
        med = statistics.median(times[c])
        print(f"| {c} | {t} | {med * 1e3:.2f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
