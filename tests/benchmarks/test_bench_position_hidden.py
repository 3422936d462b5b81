"""benchmarks/bench_position_hidden.py: both paths it times compute the same layer, and it runs."""

from __future__ import annotations

import subprocess
import sys

import torch
from bench_scripts import BENCHMARKS, load_benchmark
from torch import nn

SCRIPT = BENCHMARKS / "bench_position_hidden.py"


def _script():
    return load_benchmark("bench_position_hidden")


def test_the_compared_cases_give_the_same_gradients():
    """Both timed closures run the same math: the gradients they leave in the modules agree."""
    torch.manual_seed(0)
    pos, idx = torch.rand(200, 3), torch.randint(0, 200, (200, 8))
    grads = []
    for case in ("compiled", "torch"):
        torch.manual_seed(1)
        lin, bn = nn.Linear(3, 3), nn.BatchNorm1d(3)
        _script().build(case, pos, idx, lin, bn)()
        grads.append([p.grad for p in (*lin.parameters(), *bn.parameters())])
    scale = max(g.abs().max().item() for g in grads[1])  # the linear bias's is zero up to rounding (BatchNorm)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


def test_it_prints_one_row_per_case():
    out = subprocess.run([sys.executable, str(SCRIPT), "--n", "400", "--k", "4", "--rounds", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "median" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["sciformer-1", "sciformer-2", "torch"]
    assert rows[-1].rstrip().endswith("| 1.00x |")
