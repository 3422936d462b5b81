"""kNN right after a torch reduction: the cost of torch's spinning OpenMP threads, one run.

A torch operation large enough to run in parallel (here ``torch.aminmax`` over 113k values)
wakes torch's OpenMP pool; by default (``OMP_WAIT_POLICY`` unset) its worker threads then
spin on their cores for milliseconds, waiting for the next parallel region. The compiled
grid kNN starts its own threads, and one of them shares a core with the spinner. This
script times the kNN kernel on 38k uniform points alone, after ``torch.aminmax`` and after
NumPy's ``min`` / ``max`` of the same values (what ``knn`` now runs for its input checks),
interleaved in one process at 2 threads.

    python benchmarks/bench_thread_spin.py
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_thread_spin.py   # no spinning
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from sciformer.geometry.grid_knn import grid_knn, kernel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=37805)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    if kernel() is None:
        print("the compiled grid kNN kernel is not installed")
        return 1
    torch.set_num_threads(args.threads)
    x = torch.rand(args.n, 3, generator=torch.Generator().manual_seed(0))  # (N, 3)
    pts = x.numpy()

    def search() -> None:
        grid_knn(pts, pts, [args.n], [args.n], 16, args.threads)

    cases = {
        "kNN alone": search,
        "kNN after torch.aminmax": lambda: (torch.aminmax(x), search()),
        "kNN after numpy min/max": lambda: (pts.min(), pts.max(), search()),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["kNN alone"])
    print(f"# {args.n} uniform points, k=16, threads {args.threads}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, median of {args.rounds} interleaved rounds")
    print("| case | ms | vs alone |")
    print("|---|---:|---:|")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"| {name} | {1e3 * med:.2f} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
