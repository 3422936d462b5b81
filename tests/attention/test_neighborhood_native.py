"""Compiled passes of the fused v1 vector attention (``_vector_attention.cpp``).

Each pass against a float64 torch formula of its own; the whole layer (float32, compiled
passes) against the float64 plain gather implementation, as accurate as the float32 torch
operations it replaces; every combination of wanted gradients; threads; NaN propagation.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from sciformer.attention import _neighborhood_native as native
from sciformer.attention.neighborhood import PointTransformerLayer

pytestmark = pytest.mark.skipif(native.library() is None, reason="compiled vector attention not built")


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    native.enabled = True


def f64(*ts):
    return [t.double() for t in ts]


def close(got, want, tol=2e-5):
    scale = want.abs().max().clamp_min(1e-6)
    assert ((got.double() - want).abs().max() / scale).item() < tol


# ------------------------------------------------------------------ one pass at a time


SHAPES = [(1, 1, 1, 1, 1, 1), (5, 3, 8, 8, 3, 11), (7, 16, 64, 8, 3, 40), (4, 5, 12, 4, 1, 9), (3, 2, 6, 6, 5, 4)]


@pytest.mark.parametrize("m,k,c,g,d,msrc", SHAPES)
def test_pre_and_backward_match_formula(m, k, c, g, d, msrc):
    gen = torch.Generator().manual_seed(m * 100 + k)
    idx = torch.randint(0, msrc, (m, k), generator=gen)
    A, B = torch.randn(msrc, c, generator=gen), torch.randn(m, c, generator=gen)
    P, WaT = torch.randn(m, k, d, generator=gen), torch.randn(d, c, generator=gen)
    z = native.pre(idx, A, B, P, WaT, torch.empty(m * k, c))
    A64, B64, P64, W64 = f64(A, B, P, WaT)
    pre64 = A64[idx] - B64[:, None] + P64 @ W64  # (m, k, c)
    close(z.view(m, k, c), pre64.relu())
    gz = torch.randn(m * k, c, generator=gen)
    gA, gW = torch.ones(msrc, c), torch.ones(d, c)  # accumulate onto ones
    gB, gP = torch.empty(m, c), torch.empty(m, k, d)
    native.pre_backward(idx, gz, z, P, WaT, gA, gB, gW, gP)
    g64 = gz.double().view(m, k, c) * (pre64 > 0)
    close(gA, 1 + torch.zeros(msrc, c, dtype=torch.float64).index_add(0, idx.reshape(-1), g64.reshape(-1, c)))
    close(gB, -g64.sum(1))
    close(gW, 1 + torch.einsum("mkd,mkc->dc", P64, g64))
    close(gP, g64 @ W64.t())
    native.pre_backward(idx, gz, z, P, WaT, None, None, None, None)  # nothing wanted: no crash


@pytest.mark.parametrize("m,k,c,g,d,msrc", SHAPES)
def test_softmax_aggregate_and_backward_match_formula(m, k, c, g, d, msrc):
    gen = torch.Generator().manual_seed(m * 7 + c)
    idx = torch.randint(0, msrc, (m, k), generator=gen)
    w = torch.randn(m, k, g, generator=gen) * 30  # logits spread far (exp under- and overflow)
    V, P, WpT = torch.randn(msrc, c, generator=gen), torch.randn(m, k, d, generator=gen), torch.randn(d, c, generator=gen)
    p, y = torch.empty(m, k, g), torch.empty(m, c)
    native.softmax_aggregate(idx, w, V, P, WpT, p, y)
    w64, V64, P64, W64 = f64(w, V, P, WpT)
    p64 = torch.softmax(w64, dim=1)
    vals = V64[idx] + P64 @ W64  # (m, k, c)
    y64 = (vals.view(m, k, c // g, g) * p64[:, :, None]).sum(1).reshape(m, c)
    close(p, p64, 1e-6)
    close(y, y64)
    gy = torch.randn(m, c, generator=gen)
    gV, gW = torch.zeros(msrc, c), torch.zeros(d, c)
    gP, gw = torch.empty(m, k, d), torch.empty(m, k, g)
    native.aggregate_backward(idx, gy, p, V, P, WpT, gV, gW, gP, gw)
    w_ = w64.clone().requires_grad_()
    V_, P_, W_ = (t.clone().requires_grad_() for t in (V64, P64, W64))
    p_ = torch.softmax(w_, dim=1)
    y_ = ((V_[idx] + P_ @ W_).view(m, k, c // g, g) * p_[:, :, None]).sum(1).reshape(m, c)
    y_.backward(gy.double())
    close(gV, V_.grad)
    close(gW, W_.grad)
    close(gP, P_.grad)
    close(gw, w_.grad, 5e-5)


def test_moments_affine_relu_and_grad_u_match_formula():
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(300, 24, generator=gen) * 5 + 100  # offset: deviations must be centred
    mean, m2 = native.moments(u)
    u64 = u.double()
    close(mean, u64.mean(0), 1e-9)
    close(m2, (u64 - u64.mean(0)).square().sum(0), 1e-6)
    s, t = torch.randn(24, generator=gen), torch.randn(24, generator=gen)
    z = native.affine_relu(u - 100, s, t, torch.empty_like(u))
    close(z, (s.double() * (u64 - 100) + t.double()).relu())
    gz = torch.randn_like(u)
    gu, gs, gt = torch.empty_like(u), torch.ones(24), torch.ones(24)
    native.affine_relu_backward(gz, z, u - 100, s, gu, gs, gt)
    g64 = gz.double() * (z > 0)
    close(gu, g64 * s.double())
    close(gs, 1 + (g64 * (u64 - 100)).sum(0))
    close(gt, 1 + g64.sum(0))
    grad, cv, cst = torch.randn_like(u), torch.randn(24, generator=gen), torch.randn(24, generator=gen)
    close(native.grad_u(grad, u, cv, cst, torch.empty_like(u)), grad.double() + cv.double() * u64 + cst.double())
    close(native.grad_u(None, u, None, cst, torch.empty_like(u)), cst.double().expand(300, 24))


# ------------------------------------------------------------------ the whole layer


def cloud(n: int, k: int, seed: int):
    pts = np.random.default_rng(seed).random((n, 3))
    _, idx = cKDTree(pts).query(pts, k=k)
    return torch.tensor(pts), torch.from_numpy(idx).long()


def run(layer, x, pos, idx, gout, wants=("x", "pos")):
    x = x.detach().clone().requires_grad_("x" in wants)
    pos = pos.detach().clone().requires_grad_("pos" in wants)
    layer.zero_grad(set_to_none=True)
    y = layer(x, pos, idx)
    if y.requires_grad:
        y.backward(gout)
    grads = [x.grad, pos.grad] + [p.grad for _, p in layer.named_parameters()]
    return [y.detach()] + grads


def errors(got, exact):
    out = []
    for g, e in zip(got, exact):
        if e is None or e.abs().max() < 1e-9:  # e.g. key/query biases: zero up to rounding
            continue
        out.append(((g.double() - e).abs().max() / e.abs().max()).item())
    return out


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kwargs", [dict(share_planes=1), dict(share_planes=8), dict(share_planes=4, position_encoding="linear")])
def test_layer_float32_compiled_as_accurate_as_torch_ops(kwargs, train):
    n, k, c = 700, 16, 32
    pos, idx = cloud(n, k, seed=4)
    torch.manual_seed(0)
    ref = PointTransformerLayer(c, memory_efficient=False, **kwargs).double().train(train)
    for mod in ref.modules():
        if isinstance(mod, torch.nn.BatchNorm1d):
            with torch.no_grad():
                mod.weight.uniform_(-1.5, 1.5)  # negative scales too
                mod.running_var.uniform_(0.5, 2.0)
    x, gout = torch.randn(n, c, dtype=torch.float64), torch.randn(n, c, dtype=torch.float64)
    exact = run(copy.deepcopy(ref), x, pos, idx, gout)
    errs = {}
    for compiled in (True, False):
        native.enabled = compiled
        layer = copy.deepcopy(ref).float()
        layer.memory_efficient, layer.chunk_size = True, 97
        got = run(layer, x.float(), pos.float(), idx, gout.float())
        assert [g is None for g in got] == [e is None for e in exact]
        errs[compiled] = errors(got, exact)
    assert errs[True][0] < 1e-4, errs  # the output; gradients of a float32 run can lose more
    for a, b in zip(errs[True], errs[False]):
        assert a <= 3 * b + 2e-6, errs


@pytest.mark.parametrize("wants", [(), ("x",), ("pos",), ("x", "pos")])
def test_every_subset_of_gradients(wants):
    n, k, c = 200, 8, 16
    pos, idx = cloud(n, k, seed=5)
    torch.manual_seed(1)
    ref = PointTransformerLayer(c, share_planes=2, memory_efficient=False).double()
    x, gout = torch.randn(n, c, dtype=torch.float64), torch.randn(n, c, dtype=torch.float64)
    for p in ref.linear_w.parameters():
        p.requires_grad_(False)  # weights without gradient: their outputs are skipped
    exact = run(copy.deepcopy(ref), x, pos, idx, gout, wants)
    layer = copy.deepcopy(ref).float()
    layer.memory_efficient, layer.chunk_size = True, 33
    got = run(layer, x.float(), pos.float(), idx, gout.float(), wants)
    assert [g is None for g in got] == [e is None for e in exact]
    assert max(errors(got, exact)) < 1e-4


def test_two_threads_match_one_and_nan_propagates():
    n, k, c = 900, 16, 32
    pos, idx = cloud(n, k, seed=6)
    torch.manual_seed(2)
    layer = PointTransformerLayer(c, share_planes=4, chunk_size=50)
    x, gout = torch.randn(n, c), torch.randn(n, c)
    one = run(layer, x, pos.float(), idx, gout)
    torch.set_num_threads(2)
    two = run(layer, x, pos.float(), idx, gout)
    for a, b in zip(one, two):
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.set_num_threads(1)
    bad = x.clone()
    bad[10, 3] = float("nan")
    y = layer.eval()(bad, pos.float(), idx)
    assert torch.isnan(y).any()  # not hidden by the softmax's clamped exponent


@pytest.mark.parametrize("train", [True, False])
def test_nan_reaches_the_same_gradients_as_torch_ops(train):
    """A NaN input poisons the same outputs and gradients on both paths (ReLU backward lets NaN through)."""
    n, k, c = 60, 6, 8
    pos, idx = cloud(n, k, seed=8)
    torch.manual_seed(3)
    layer = PointTransformerLayer(c, share_planes=2, chunk_size=16).train(train)
    x, gout = torch.randn(n, c), torch.randn(n, c)
    x[10, 3] = float("nan")
    nans = {}
    for compiled in (True, False):
        native.enabled = compiled
        got = run(copy.deepcopy(layer), x, pos.float(), idx, gout)
        nans[compiled] = [None if g is None else int(torch.isnan(g).sum()) for g in got]
    assert nans[True] == nans[False]


def test_softmax_weights_far_below_the_maximum_are_zero():
    idx = torch.zeros(1, 3, dtype=torch.int64)
    w = torch.tensor([[[0.0], [-200.0], [float("-inf")]]])  # (1, 3, 1)
    V, P, WpT = torch.full((1, 1), 1e30), torch.zeros(1, 3, 1), torch.zeros(1, 1)
    p, y = torch.empty(1, 3, 1), torch.empty(1, 1)
    native.softmax_aggregate(idx, w, V, P, WpT, p, y)
    assert p.flatten().tolist() == [1.0, 0.0, 0.0]
