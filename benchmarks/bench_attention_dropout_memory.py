"""Peak memory of dense attention on CPU, with and without attention dropout, in (n, H, L, L) blocks.

Backs ``sciformer.attention.dense.DROPOUT_WEIGHT_BLOCKS``: with dropout, SDPA on CPU builds the
attention weights (its math path), so the peak grows as n * H * L^2; without dropout it works
in O(L) memory. Each case runs in a fresh subprocess (so that ``ru_maxrss`` is its own): the
peak resident memory above the baseline after the forward pass, and after forward + backward,
divided by one (n, H, L, L) float32 block.

Usage: python benchmarks/bench_attention_dropout_memory.py [--lengths 1024,2048,4096] [--n 2] [--heads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def child(n: int, heads: int, length: int, dropout: float) -> dict[str, float]:
    """Peak RSS growth (MiB) of one forward and of forward + backward of the library's attention."""
    import torch

    from sciformer.attention.dense import MultiHeadAttention

    torch.set_num_threads(1)
    dim = 8 * heads
    attn = MultiHeadAttention(dim, heads, attn_drop=dropout).train()
    x = torch.randn(n, length, dim, requires_grad=True)  # (n, L, D)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    y = attn(x)  # (n, L, D)
    forward = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    y.square().sum().backward()
    both = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"forward_mib": (forward - base) / 1024, "backward_mib": (both - base) / 1024}  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # LENGTH DROPOUT
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.n, args.heads, int(args.child[0]), float(args.child[1]))))
        return
    print(f"dense attention on CPU, n={args.n}, heads={args.heads}, training; peak RSS above the baseline "
          "(fresh process per case), in MiB and in (n, H, L, L) float32 blocks")
    print(f"{'L':>6s} {'dropout':>8s} {'block MiB':>10s} {'forward MiB':>12s} {'blocks':>7s} {'+backward MiB':>14s} {'blocks':>7s}")
    for length in (int(v) for v in args.lengths.split(",")):
        block = args.n * args.heads * length * length * 4 / 2**20
        for dropout in (0.0, 0.1):
            out = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--heads", str(args.heads),
                                  "--child", str(length), str(dropout)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{length:6d} {dropout:8.1f} {block:10.1f} {r['forward_mib']:12.1f} {r['forward_mib'] / block:7.2f} "
                  f"{r['backward_mib']:14.1f} {r['backward_mib'] / block:7.2f}")


if __name__ == "__main__":
    main()
