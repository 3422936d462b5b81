"""Point Transformer layer, forward + backward: sciformer vs torch_geometric, one run.

Time: one subprocess builds every case and interleaves them, one forward+backward per case
per round after a warm-up, so that all cases see the same machine load; the table shows
the median time over rounds and the median over rounds of the per-round speed-up against
PyG (robust to load drifting during the run).
Memory: every case runs again in a fresh subprocess (so that peak RSS is its own): it
loads the shared points and kNN index, builds its layer, records RSS as the baseline and
reports ``ru_maxrss`` above it after a warm-up and one timed forward+backward (median
over ``--mem-rounds`` subprocesses).

Compute floor: the multiply-adds of each case's math, counted by
``torch.utils.flop_counter.FlopCounterMode`` over one forward+backward of its plain
implementation (``plain`` for the share_planes=1 math, ``plain-ptv1`` for share_planes=8;
the fused path recomputes edge work, which the floor does not credit), divided by the peak
matrix-multiply rate measured in the same process at the same threads (a 2048 x 2048 x 2048
float32 matmul, best of 5, after the rounds). ``x floor`` = time / floor. ``paired``: the
median over rounds of each step's time / floor at the rate measured around that step (the
better of one matmul just before and one just after it), so that the machine's speed
drifting between the rounds and the rate measurement cancels. Only GEMM-like ops count as
work, so gathers, softmax and BatchNorm over edges all show as distance above the floor.

Cases (all: training mode, BatchNorm over all edges, x and pos requiring gradients):
  pyg            torch_geometric.nn.PointTransformerConv, PTv1 pos_nn / attn_nn with
                 G = C (PyG's attn_nn must return C channels), edges = the same kNN index
  plain          sciformer PointTransformerLayer(share_planes=1, memory_efficient=False):
                 the straightforward gather implementation, same math as pyg
  sciformer      PointTransformerLayer(share_planes=1): same math as pyg, chunked fused path
  plain-ptv1     as plain, share_planes=8 (PTv1 default; cheaper math, not comparable to pyg)
  sciformer-ptv1 as sciformer, share_planes=8
  sciformer-torch, sciformer-ptv1-torch
                 as sciformer / sciformer-ptv1 with the compiled stages switched off
                 (``_neighborhood_native.enabled = False``: torch operations and BLAS matrix
                 products per chunk), to measure what the compiled stages give in the same run
  sciformer-narrow
                 as sciformer with the compiled tile products on 8-lane blocks only
                 (``_neighborhood_native.wide_products(False)``; the default uses 16-lane
                 AVX-512 blocks where the CPU is x86-64-v4)

Usage: python benchmarks/bench_point_attention.py [--n 16384] [--c 64] [--k 16]
       [--threads T] [--rounds 7] [--mem-rounds 2] [--cases pyg,plain,sciformer,...] [--parts]

``--parts`` also prints, for the fused cases, the mean time per step of each autograd
function of the layer (forward and backward: edge statistics, position MLP hidden layer,
stages 1 and 2) and the rest of the step.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ALL_CASES = ["pyg", "plain", "sciformer", "plain-ptv1", "sciformer-ptv1", "sciformer-torch", "sciformer-ptv1-torch",
             "sciformer-narrow"]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def build_case(case: str, data: str, c: int, chunk: int | None) -> Callable[[], None]:
    """A closure running one training-mode forward+backward of the case's layer."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    blob = torch.load(data)
    pos, idx = blob["pos"], blob["idx"]
    n, k = idx.shape
    x = torch.randn(n, c).requires_grad_()
    pos = pos.clone().requires_grad_()
    grad = torch.randn(n, c)
    if case == "pyg":
        from torch_geometric.nn import PointTransformerConv

        layer: nn.Module = PointTransformerConv(
            c,
            c,
            pos_nn=nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, c)),
            attn_nn=nn.Sequential(
                nn.BatchNorm1d(c), nn.ReLU(), nn.Linear(c, c),
                nn.BatchNorm1d(c), nn.ReLU(), nn.Linear(c, c),
            ),
            add_self_loops=False,  # the kNN index already contains every point itself
        )
        edge_index = torch.stack([idx.reshape(-1), torch.arange(n).repeat_interleave(k)])
        args: tuple = (x, pos, edge_index)
    else:
        from sciformer.attention.neighborhood import PointTransformerLayer

        share = 8 if "ptv1" in case else 1
        eff = case.startswith("sciformer")
        layer = PointTransformerLayer(
            c, c, share_planes=share, memory_efficient=eff, chunk_size=chunk
        )
        args = (x, pos, idx)
    layer.train()
    from sciformer.attention import _neighborhood_native

    compiled = not case.endswith("-torch")
    wide = not case.endswith("-narrow")

    def step() -> None:
        _neighborhood_native.enabled = compiled
        if compiled and _neighborhood_native.library() is not None:
            _neighborhood_native.wide_products(wide)
        x.grad = pos.grad = None
        layer.zero_grad(set_to_none=True)
        layer(*args).backward(grad)

    return step


def child_memory(case: str, data: str, c: int, threads: int, chunk: int | None) -> dict:
    import torch

    torch.set_num_threads(threads)
    step = build_case(case, data, c, chunk)
    base = _rss_mb()
    step()  # warm-up
    step()
    return {"peak_mb": _peak_mb() - base}


def math_of(case: str) -> str:
    """The plain case that computes the same math without recomputation (the floor's work)."""
    return "plain-ptv1" if "ptv1" in case else "plain"


def count_gflop(case: str, data: str, c: int, chunk: int | None) -> float:
    """GEMM-like work of one forward+backward of ``case``, in GFLOP (2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    step = build_case(case, data, c, chunk)
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops() / 1e9


@functools.cache
def _gemm_operands(size: int) -> tuple:
    """Two random (size, size) float32 matrices, made once and multiplied once (warm-up)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    return a, b


def gemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    """Peak float32 matmul rate at the current threads, GFLOP/s (best of ``repeats``)."""
    a, b = _gemm_operands(size)
    best = min((lambda t0: (a @ b, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def paired_step(step: Callable[[], None]) -> tuple[float, float]:
    """Seconds of one ``step`` and the peak matmul rate at that moment: the better of one
    2048^3 matmul just before and one just after it (the machine's speed drifts between
    rounds; the rate measured once after the rounds read 90-180 GFLOP/s within an hour here)."""
    before = gemm_gflops(repeats=1)
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    return seconds, max(before, gemm_gflops(repeats=1))


PARTS = {  # module, autograd Function: the parts of the fused v1 layer timed by --parts
    "edge statistics": ("sciformer.attention._neighborhood_moments", "EdgeMoments"),
    "position MLP hidden": ("sciformer.attention._neighborhood_position", "RelativePositionHidden"),
    "stage 1": ("sciformer.attention._neighborhood_fused", "VectorStage1"),
    "stage 2": ("sciformer.attention._neighborhood_fused", "VectorStage2"),
}


def time_parts(seconds: dict[str, float]) -> None:
    """Wrap the forward and backward of each of :data:`PARTS` to add its time to ``seconds``
    (keys "<part> forward" / "<part> backward")."""
    import importlib

    for part, (module, name) in PARTS.items():
        fn = getattr(importlib.import_module(module), name)
        for method in ("forward", "backward"):
            inner = getattr(fn, method)

            def timed(*a: object, _inner: Callable = inner, _key: str = f"{part} {method}") -> object:
                t0 = time.perf_counter()
                out = _inner(*a)
                seconds[_key] = seconds.get(_key, 0.0) + time.perf_counter() - t0
                return out

            setattr(fn, method, staticmethod(timed))


def child_timing(
    cases: list[str], data: str, c: int, threads: int, rounds: int, chunk: int | None,
    parts: bool = False,
) -> dict:
    import torch

    torch.set_num_threads(threads)
    steps = {case: build_case(case, data, c, chunk) for case in cases}
    for step in steps.values():  # warm-up
        step()
    seconds: dict[str, float] = {}
    if parts:
        time_parts(seconds)
    times: dict[str, list[float]] = {case: [] for case in cases}
    rates: dict[str, list[float]] = {case: [] for case in cases}
    by_case: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for case, step in steps.items():
            seconds.clear()
            sec, rate = paired_step(step)
            times[case].append(sec)
            rates[case].append(rate)
            for key, sec in seconds.items():
                by_case.setdefault(case, {}).setdefault(key, 0.0)
                by_case[case][key] += sec / rounds
    gflop = {case: count_gflop(math_of(case), data, c, chunk) for case in cases if case != "pyg"}
    if "pyg" in cases:
        gflop["pyg"] = count_gflop("plain", data, c, chunk)  # the same math as plain
    return {"times": times, "rates": rates, "gflop": gflop, "gemm_gflops": gemm_gflops(), "parts": by_case}


def _child(args: argparse.Namespace, extra: list[str]) -> dict:
    cmd = [
        sys.executable, __file__, "--data", args.data, "--c", str(args.c),
        "--threads", str(args.threads), "--rounds", str(args.rounds), *extra,
    ]
    if args.chunk:
        cmd += ["--chunk", str(args.chunk)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: what train.threads: null picks on this machine, as training runs)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    ap.add_argument("--mem-rounds", type=int, default=2, help="fresh subprocesses per case for RSS")
    ap.add_argument("--chunk", type=int, default=None, help="sciformer chunk_size (default auto)")
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("--parts", action="store_true",
                    help="also time the fused layer's parts (autograd functions), mean per step")
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=["memory", "timing"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads is None:
        from sciformer.engine.runtime import default_threads

        args.threads = default_threads()
    cases = [s for s in args.cases.split(",") if s]
    unknown = sorted(set(cases) - set(ALL_CASES))
    if unknown:
        sys.exit(f"--cases: unknown {unknown}; expected names from {ALL_CASES}")

    if args.child == "memory":
        print(json.dumps(child_memory(cases[0], args.data, args.c, args.threads, args.chunk)))
        return
    if args.child == "timing":
        res = child_timing(cases, args.data, args.c, args.threads, args.rounds, args.chunk, args.parts)
        print(json.dumps(res))
        return

    import numpy as np
    import torch
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(0)
    pts = rng.random((args.n, 3)).astype(np.float32)
    _, nbr = cKDTree(pts).query(pts, k=args.k)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        args.data = os.path.join(tmp, "points.pt")
        torch.save({"pos": torch.from_numpy(pts), "idx": torch.from_numpy(nbr).long()}, args.data)
        extra = ["--parts"] if args.parts else []
        timing = _child(args, ["--child", "timing", "--cases", ",".join(cases), *extra])
        times, gflop, rate = timing["times"], timing["gflop"], timing["gemm_gflops"]
        peaks: dict[str, list[float]] = {case: [] for case in cases}
        for _ in range(args.mem_rounds):
            for case in cases:
                peaks[case].append(_child(args, ["--child", "memory", "--cases", case])["peak_mb"])
    load1 = os.getloadavg()[0]

    print(
        f"Point Transformer layer fwd+bwd (training), N={args.n}, C={args.c}, k={args.k}, "
        f"threads={args.threads}; time: median of {args.rounds} interleaved rounds; "
        f"peak: ru_maxrss above baseline, fresh process per case; "
        f"load average {load0:.1f} -> {load1:.1f} (2 cores shared); "
        f"floor = GFLOP of the case's math / peak matmul rate {rate:.1f} GFLOP/s (same process, same threads, "
        f"after the rounds); paired = median over rounds of time / floor at the rate measured around that step "
        f"({min(min(r) for r in timing['rates'].values()):.1f}-{max(max(r) for r in timing['rates'].values()):.1f} GFLOP/s)"
    )
    head = f"{'impl':16s} {'time s':>8s} {'peak MB':>8s} {'speed-up vs pyg':>16s}"
    print(f"{head} {'mem vs pyg':>11s} {'math GFLOP':>11s} {'floor s':>8s} {'x floor':>8s} {'paired':>8s}")
    for case in cases:
        t = statistics.median(times[case])
        m = statistics.median(peaks[case])
        if "pyg" in times:
            sp = f"{statistics.median(p / s for p, s in zip(times['pyg'], times[case])):.2f}x"
            mr = f"{m / statistics.median(peaks['pyg']):.2f}"
        else:
            sp = mr = "-"
        floor = gflop[case] / rate
        paired = statistics.median(sec * r / gflop[case] for sec, r in zip(times[case], timing["rates"][case]))
        print(f"{case:16s} {t:8.3f} {m:8.0f} {sp:>16s} {mr:>11s} {gflop[case]:11.2f} {floor:8.3f} {t / floor:7.1f}x"
              f" {paired:7.2f}x")
    for case, part in timing["parts"].items():  # --parts
        total = statistics.mean(times[case])
        print(f"\n{case}: mean s per step by part (the rest: projections and per-point operations)")
        for key, sec in sorted(part.items()):
            print(f"  {key:30s} {sec:7.4f}")
        print(f"  {'rest':30s} {total - sum(part.values()):7.4f}   (mean step {total:.4f})")


if __name__ == "__main__":
    main()
