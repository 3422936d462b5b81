"""Ctrl-C while the compiled stages run: the interrupt comes after the call, and the layer
still computes the same bits afterwards (an interactive session interrupts a cell, then
runs the next one).

The child process trains a Point Transformer layer on a cloud large enough that most of
each step is spent inside compiled stage calls; the parent sends SIGINT at random moments.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from sciformer.attention import _neighborhood_native as native

pytestmark = pytest.mark.skipif(native.library() is None, reason="compiled vector attention not built")

CHILD = r"""
import sys, time, torch
from sciformer.attention.neighborhood import PointTransformerLayer

torch.set_num_threads(2)

def case(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g).requires_grad_()
    pos = torch.rand(n, 3, generator=g).requires_grad_()
    idx = torch.randint(0, n, (n, 16), generator=g)
    return x, pos, idx

def step(layer, x, pos, idx):
    x.grad = pos.grad = None
    layer.zero_grad(set_to_none=True)
    y = layer(x, pos, idx)
    y.square().sum().backward()
    return [y.detach().clone(), x.grad.clone(), pos.grad.clone()] + [p.grad.clone() for p in layer.parameters()]

torch.manual_seed(0)
layer = PointTransformerLayer(32, 32).train()
small = case(3000, 1)
reference = step(layer, *small)
big = case(40000, 2)
interrupted = 0
print("ready", flush=True)
while interrupted < int(sys.argv[1]):
    try:
        while True:
            step(layer, *big)
    except KeyboardInterrupt:
        interrupted += 1
    again = step(layer, *small)
    same = all(torch.equal(a, b) for a, b in zip(reference, again))
    print(f"after {interrupted}: {'same' if same else 'DIFFERENT'}", flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_during_compiled_stages_leaves_the_layer_working() -> None:
    draws = 5
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(draws)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        rng = np.random.default_rng(3)
        lines = []
        for delay in rng.uniform(0.05, 1.0, size=draws):
            time.sleep(delay)  # inside a step: most of it is compiled stage calls
            proc.send_signal(signal.SIGINT)
            lines.append(proc.stdout.readline().strip())
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    assert lines == [f"after {i}: same" for i in range(1, draws + 1)], (lines, err[-4000:])
