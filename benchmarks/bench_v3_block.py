"""Point Transformer V3 block vs the v1 attention layer vs PyG, forward + backward, one run.

Every (case, N) runs in a fresh subprocess so that its peak RSS is its own: it builds the
points (uniform in the unit cube, seed 0) and the case's neighbourhood structure, records
RSS as the baseline, runs a warm-up and ``--rounds`` timed training-mode forward+backward
steps (median time), and reports ``ru_maxrss`` above the baseline.

Cases (C channels in and out, x requiring gradients, training mode):
  v3     sciformer PreNormBlock: kNN conditional positional encoding (``--cpe-k``
         neighbours), LayerNorm, SerializedAttention (``--heads`` heads, patches of
         ``--patch`` points along a Z-order curve of a 0.01 grid), LayerNorm, MLP (4C).
         The stage context (serialization orders, patch layout, CPE basis) is built once
         per stage and shared by its blocks, like v1's kNN index; its build time is shown
         in its own column and is not in the step time.
  v3-attn  the block's SerializedAttention alone (the layer-level counterpart of v1).
  v1     sciformer PointTransformerLayer (PTv1 vector attention, share_planes 8, k
         neighbours, the default memory-efficient fused path); kNN index precomputed.
  pyg    torch_geometric.nn.PointTransformerConv (PTv1 pos_nn / attn_nn, G = C), same
         kNN index as edges.
The time ratio v1 / v3 is also measured with both in one process, alternating steps
(``--ratio-sizes``), which is robust to the load of a shared machine drifting.
A case whose peak memory, extrapolated linearly from the previous N, exceeds
``--mem-budget`` GB is skipped and listed as such (the machine is shared).

Usage: python benchmarks/bench_v3_block.py [--sizes 16384,65536,262144] [--c 64]
       [--k 16] [--threads 2] [--rounds 3] [--cases v3,v3-attn,v1,pyg] [--patch 1024] [--mem-budget 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ALL_CASES = ["v3", "v3-attn", "v1", "pyg"]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def build(case: str, n: int, args: argparse.Namespace):
    """The case's training step closure and its context build time (NaN without context)."""
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = args.c
    pos = torch.from_numpy(np.random.default_rng(0).random((n, 3)).astype(np.float32))  # (N, 3)
    offset = torch.tensor([n])
    x = torch.randn(n, c).requires_grad_()
    grad = torch.randn(n, c)
    ctx_time = float("nan")
    if case.startswith("v3"):
        from sciformer.attention import (
            ConditionalPositionalEncoding,
            PreNormBlock,
            SerializedAttention,
        )
        from sciformer.geometry import grid_coordinates
        from sciformer.pointcloud.serialized_layers import SerialLevel, stage_context

        layer: nn.Module = SerializedAttention(c, args.heads, args.patch)
        if case == "v3":
            layer = PreNormBlock(c, layer, pos_encoding=ConditionalPositionalEncoding(c))

        def make_ctx():
            level = SerialLevel(pos, x.detach(), offset, grid_coordinates(pos, 0.01, offset))
            ctx = stage_context(level, ["z"], args.cpe_k if case == "v3" else 0, 0.01)
            ctx.layout(0, args.patch)
            return ctx

        t0 = time.perf_counter()
        ctx = make_ctx()
        ctx_time = time.perf_counter() - t0
        call = (x, ctx)
    else:
        from sciformer.geometry import knn

        idx, _ = knn(pos, None, args.k)  # (N, k) self included
        if case == "v1":
            from sciformer.attention import PointTransformerLayer

            layer = PointTransformerLayer(c, c, share_planes=8)
            call = (x, pos, idx)
        else:
            from torch_geometric.nn import PointTransformerConv

            layer = PointTransformerConv(
                c, c,
                pos_nn=nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, c)),
                attn_nn=nn.Sequential(
                    nn.BatchNorm1d(c), nn.ReLU(), nn.Linear(c, c), nn.BatchNorm1d(c), nn.ReLU(), nn.Linear(c, c)
                ),
                add_self_loops=False,  # the kNN index already holds every point itself
            )
            edge_index = torch.stack([idx.reshape(-1), torch.arange(n).repeat_interleave(args.k)])
            call = (x, pos, edge_index)
    layer.train()

    def step() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(*call).backward(grad)

    return step, ctx_time


def child(case: str, n: int, args: argparse.Namespace) -> dict:
    """One case at one size: median step time, context time and peak RSS above baseline.

    The baseline is taken after the imports, so the peak counts the points, the kNN
    index or stage context, the layer and the step's activations.
    """
    import torch  # noqa: F401

    import sciformer.attention
    import sciformer.pointcloud.serialized_layers  # noqa: F401

    if case == "pyg":
        import torch_geometric.nn  # noqa: F401
    base = _rss_mb()
    step, ctx_time = build(case, n, args)
    step()  # warm-up
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"time": statistics.median(times), "ctx": ctx_time, "peak_mb": _peak_mb() - base}


def child_ratio(n: int, args: argparse.Namespace) -> dict:
    """v3 and v1 in one process, alternating steps: median over rounds of v1 time / v3 time."""
    steps = {case: build(case, n, args)[0] for case in ("v3", "v1")}
    for step in steps.values():
        step()  # warm-up
    ratios = []
    for _ in range(args.rounds):
        t = {}
        for case, step in steps.items():
            t0 = time.perf_counter()
            step()
            t[case] = time.perf_counter() - t0
        ratios.append(t["v1"] / t["v3"])
    return {"ratio": statistics.median(ratios), "ratios": ratios}


def run_child(case: str, n: int, args: argparse.Namespace) -> dict:
    """``case`` in a fresh subprocess (``"ratio"``: the interleaved v3 / v1 timing)."""
    cmd = [sys.executable, __file__, "--child", case, "--sizes", str(n), "--c", str(args.c), "--k", str(args.k),
           "--threads", str(args.threads), "--rounds", str(args.rounds), "--heads", str(args.heads),
           "--patch", str(args.patch), "--cpe-k", str(args.cpe_k)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16384,65536,262144")
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--k", type=int, default=16, help="v1 / PyG neighbours")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--patch", type=int, default=1024, help="v3 patch size")
    ap.add_argument("--cpe-k", type=int, default=8, help="v3 CPE neighbours")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("--mem-budget", type=float, default=8.0, help="GB; skip a case extrapolated above it")
    ap.add_argument("--ratio-sizes", default="16384,65536", help="sizes of the interleaved v3 / v1 timing")
    ap.add_argument("--child", choices=[*ALL_CASES, "ratio"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.child == "ratio":
        print(json.dumps(child_ratio(sizes[0], args)))
        return
    if args.child:
        print(json.dumps(child(args.child, sizes[0], args)))
        return
    cases = [s for s in args.cases.split(",") if s]
    unknown = sorted(set(cases) - set(ALL_CASES))
    if unknown:
        sys.exit(f"--cases: unknown {unknown}; expected names from {ALL_CASES}")
    load0 = os.getloadavg()[0]
    results: dict[tuple[str, int], dict | str] = {}
    for case in cases:
        last: tuple[int, float] | None = None
        for n in sizes:
            if last is not None and last[1] * n / last[0] > args.mem_budget * 1024:
                results[case, n] = f"skipped (est. {last[1] * n / last[0] / 1024:.1f} GB > {args.mem_budget:g} GB)"
                continue
            res = run_child(case, n, args)
            results[case, n] = res
            last = (n, res["peak_mb"])
            print(f"  {case} N={n}: {res}", file=sys.stderr, flush=True)
    ratios = {}
    if "v3" in cases and "v1" in cases:
        for n in [int(v) for v in args.ratio_sizes.split(",") if v]:
            ratios[n] = run_child("ratio", n, args)
            print(f"  ratio N={n}: {ratios[n]}", file=sys.stderr, flush=True)
    load1 = os.getloadavg()[0]
    print(f"fwd+bwd (training), C={args.c}; v1/pyg k={args.k}; v3 patch={args.patch}, heads={args.heads}, "
          f"cpe_k={args.cpe_k}; threads={args.threads}; median of {args.rounds} steps; peak = ru_maxrss above "
          f"baseline (after imports), fresh process per case; load average {load0:.1f} -> {load1:.1f}")
    print("| N | case | step s | context s | peak MB | v1 time / case time | case peak / v1 peak |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in sizes:
        ref = results.get(("v1", n))
        for case in cases:
            r = results[case, n]
            if isinstance(r, str):
                print(f"| {n} | {case} | {r} | | | | |")
                continue
            ctx = "-" if r["ctx"] != r["ctx"] else f"{r['ctx']:.3f}"
            if isinstance(ref, dict):
                sp, mem = f"{ref['time'] / r['time']:.2f}x", f"{r['peak_mb'] / ref['peak_mb']:.2f}"
            else:
                sp = mem = "-"
            print(f"| {n} | {case} | {r['time']:.3f} | {ctx} | {r['peak_mb']:.0f} | {sp} | {mem} |")
    for n, r in ratios.items():
        print(f"interleaved in one process, N={n}: v1 time / v3 time = {r['ratio']:.2f}x "
              f"(median of {len(r['ratios'])} rounds: {', '.join(f'{v:.2f}' for v in r['ratios'])})")


if __name__ == "__main__":
    main()
