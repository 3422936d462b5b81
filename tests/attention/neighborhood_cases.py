"""Shared cases and helpers of the neighbourhood attention tests: layer configurations, random
clouds, randomised norms, one forward+backward, and comparison of two runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree
from torch import nn

CONFIGS = [
    pytest.param(dict(), id="ptv1-default"),
    pytest.param(dict(share_planes=1), id="ptv1-nogroup"),
    pytest.param(dict(share_planes=4, position_encoding="linear"), id="ptv1-linearpos"),
    pytest.param(dict(norm="layer"), id="ptv1-layernorm"),
    pytest.param(dict(attn_mlp=None, share_planes=1), id="identity-attn"),
    pytest.param(
        dict(attn_mlp=nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)), share_planes=4),
        id="custom-attn",
    ),
    pytest.param(dict(mode="scalar", num_heads=4), id="scalar"),
    pytest.param(dict(mode="scalar", num_heads=2, position_encoding="linear"), id="scalar-linear"),
]


def make_cloud(n: int, k: int, seed: int = 0, dtype: torch.dtype = torch.float64):
    rng = np.random.default_rng(seed)
    pts = rng.random((n, 3))
    _, idx = cKDTree(pts).query(pts, k=k)
    return torch.tensor(pts, dtype=dtype), torch.from_numpy(idx).long()


def randomize_norms(module: nn.Module, seed: int = 1) -> None:
    """Non-trivial affine and running statistics so that eval mode is exercised."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.LayerNorm)):
            with torch.no_grad():
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
                if isinstance(m, nn.BatchNorm1d):
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))


def run(layer: nn.Module, x, pos, idx, gout):
    """Forward + backward; returns (y, dx, dpos, {name: dparam})."""
    x = x.detach().clone().requires_grad_()
    pos = pos.detach().clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    y = layer(x, pos, idx)
    y.backward(gout)
    grads = {n: p.grad for n, p in layer.named_parameters()}
    return y.detach(), x.grad, pos.grad, grads


def assert_same_run(a, b, atol: float, rtol: float = 0.0) -> None:
    ya, xa, pa, ga = a
    yb, xb, pb, gb = b
    torch.testing.assert_close(ya, yb, atol=atol, rtol=rtol)
    torch.testing.assert_close(xa, xb, atol=atol, rtol=rtol)
    torch.testing.assert_close(pa, pb, atol=atol, rtol=rtol)
    assert ga.keys() == gb.keys()
    for name in ga:
        if ga[name] is None or gb[name] is None:
            assert ga[name] is None and gb[name] is None, name
            continue
        torch.testing.assert_close(ga[name], gb[name], atol=atol, rtol=rtol, msg=name)
