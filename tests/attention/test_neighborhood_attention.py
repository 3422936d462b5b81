"""Neighbourhood (Point Transformer) attention: the PyG oracle, the memory-saving path, gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from neighborhood_cases import CONFIGS, assert_same_run, make_cloud, randomize_norms, run
from torch import nn

from sciformer.attention._neighborhood_ops import chunked_edge_map
from sciformer.attention.neighborhood import (
    PointTransformerLayer,
)

# --------------------------------------------------------------------------- PyG oracle


def _pyg_pair(c: int, mlp: bool, ptv1_attn: bool):
    """A sciformer layer and a PyG PointTransformerConv computing the same function.

    Conventions differ by signs: PyG uses lin_dst(x_i) - lin_src(x_j) + h(p_i - p_j), we
    use k_j - q_i + phi(p_j - p_i). Map W_k = -W_src, W_q = -W_dst (biases 0), W_v = W_lin
    and negate the first position linear.
    """
    tg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(3)
    layer = PointTransformerLayer(
        c,
        share_planes=1,
        position_encoding="mlp" if mlp else "linear",
        attn_mlp="ptv1" if ptv1_attn else None,
        chunk_size=13,
    ).double()
    randomize_norms(layer)
    pos_nn = copy.deepcopy(layer.linear_p)
    attn_nn = copy.deepcopy(layer.linear_w) if ptv1_attn else None
    conv = tg.PointTransformerConv(c, c, pos_nn=pos_nn, attn_nn=attn_nn).double()
    # PyG re-initialises pos_nn / attn_nn in its constructor: copy the weights afterwards
    conv.pos_nn.load_state_dict(layer.linear_p.state_dict())
    if attn_nn is not None:
        conv.attn_nn.load_state_dict(layer.linear_w.state_dict())
    with torch.no_grad():
        conv.pos_nn[0].weight.neg_()
        for lin in (layer.linear_q, layer.linear_k, layer.linear_v):
            lin.bias.zero_()
        conv.lin_src.weight.copy_(-layer.linear_k.weight)
        conv.lin_dst.weight.copy_(-layer.linear_q.weight)
        conv.lin.weight.copy_(layer.linear_v.weight)
    return layer, conv


def _edge_index(idx: torch.Tensor) -> torch.Tensor:
    n, k = idx.shape
    return torch.stack([idx.reshape(-1), torch.arange(n).repeat_interleave(k)])  # (src j, dst i)


@pytest.mark.parametrize("memory_efficient", [True, False])
@pytest.mark.parametrize("mlp,ptv1_attn", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("train", [True, False])
def test_matches_pyg_point_transformer_conv(memory_efficient, mlp, ptv1_attn, train):
    n, k, c = 120, 8, 16
    pos, idx = make_cloud(n, k)
    layer, conv = _pyg_pair(c, mlp, ptv1_attn)
    layer.memory_efficient = memory_efficient
    layer.train(train)
    conv.train(train)
    x = torch.randn(n, c, dtype=torch.float64)
    gout = torch.randn(n, c, dtype=torch.float64)

    xa = x.clone().requires_grad_()
    pa = pos.clone().requires_grad_()
    ya = layer(xa, pa, idx)
    ya.backward(gout)
    xb = x.clone().requires_grad_()
    pb = pos.clone().requires_grad_()
    yb = conv(xb, pb, _edge_index(idx))
    yb.backward(gout)

    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=0)
    torch.testing.assert_close(ya, yb, atol=1e-10, rtol=1e-10)  # double: equal up to rounding
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(pa.grad, pb.grad, atol=1e-10, rtol=1e-10)
    tight = dict(atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer.linear_v.weight.grad, conv.lin.weight.grad, **tight)
    torch.testing.assert_close(layer.linear_k.weight.grad, -conv.lin_src.weight.grad, **tight)
    ours = dict(layer.linear_w.named_buffers())
    theirs = dict((conv.attn_nn or nn.Identity()).named_buffers())
    assert ours.keys() == theirs.keys()
    for name in ours:  # running statistics
        torch.testing.assert_close(ours[name], theirs[name], **tight, msg=name)


def test_matches_pyg_float32():
    n, k, c = 200, 16, 16
    pos, idx = make_cloud(n, k, dtype=torch.float32)
    layer, conv = _pyg_pair(c, True, True)
    layer, conv = layer.float(), conv.float()
    x = torch.randn(n, c)
    ya = layer(x, pos, idx)
    yb = conv(x, pos, _edge_index(idx))
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------- memory-saving path


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_memory_efficient_equals_plain(kwargs, train):
    n, k, c = 150, 8, 16
    pos, idx = make_cloud(n, k, seed=1)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, **copy.deepcopy(kwargs), chunk_size=17).double()
    randomize_norms(layer)
    plain = copy.deepcopy(layer)
    plain.memory_efficient = False
    layer.train(train)
    plain.train(train)
    x = torch.randn(n, c, dtype=torch.float64)
    gout = torch.randn(n, c, dtype=torch.float64)
    a = run(layer, x, pos, idx, gout)
    b = run(plain, x, pos, idx, gout)
    assert_same_run(a, b, atol=1e-10, rtol=1e-9)
    for (na, ta), (_, tb) in zip(layer.named_buffers(), plain.named_buffers()):
        torch.testing.assert_close(ta, tb, atol=1e-12, rtol=1e-12, msg=na)


def test_memory_efficient_float32_as_accurate_as_plain():
    """Analytic BatchNorm statistics in float32 are as accurate as the plain path's.

    Keys close to queries and offset, smooth features make a_ij = k_j - q_i small against
    k and q (cancellation); errors are measured against a float64 run.
    """
    n, k, c = 1500, 16, 32
    pos, idx = make_cloud(n, k, seed=2)
    torch.manual_seed(0)
    ref = PointTransformerLayer(c, memory_efficient=False).double()
    with torch.no_grad():
        wq = ref.linear_q.weight
        ref.linear_k.weight.copy_(wq + 0.01 * torch.randn_like(wq))
        ref.linear_k.bias.copy_(ref.linear_q.bias)
    feats = torch.sin(3 * pos @ torch.randn(3, c, dtype=torch.float64)) * 5 + 10
    gout = torch.randn(n, c, dtype=torch.float64)
    exact = run(ref, feats, pos, idx, gout)
    errors = {}
    for eff in (True, False):
        layer = copy.deepcopy(ref).float()
        layer.memory_efficient = eff
        got = run(layer, feats.float(), pos.float(), idx, gout.float())
        errors[eff] = [
            ((g.double() - e).abs().max() / e.abs().max()).item()
            for g, e in zip(got[:3], exact[:3])
        ]
    for fused, plain in zip(errors[True], errors[False]):
        assert fused <= 1.5 * plain + 1e-6, errors
    assert errors[True][0] < 1e-4, errors


@pytest.mark.parametrize("kwargs", [CONFIGS[0], CONFIGS[3], CONFIGS[6]])
def test_chunk_size_does_not_change_results(kwargs):
    n, k, c = 64, 6, 16
    pos, idx = make_cloud(n, k, seed=3)
    torch.manual_seed(0)
    base = PointTransformerLayer(c, **copy.deepcopy(kwargs)).double()
    x = torch.randn(n, c, dtype=torch.float64)
    gout = torch.randn(n, c, dtype=torch.float64)
    runs = []
    for chunk in (1, 5, 64, 1000):
        layer = copy.deepcopy(base)
        layer.chunk_size = chunk
        runs.append(run(layer, x, pos, idx, gout))
    for other in runs[1:]:
        assert_same_run(runs[0], other, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kwargs", [CONFIGS[0], CONFIGS[3], CONFIGS[6]])
def test_memory_efficient_saves_no_edge_by_channel_tensor(kwargs):
    """Autograd keeps nothing of size N*k*C on the memory-saving path (the plain one does);
    tensors saved while the backward pass recomputes a chunk are chunk-sized."""
    n, k, c, chunk = 64, 16, 32, 8
    pos, idx = make_cloud(n, k, seed=15, dtype=torch.float32)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, **copy.deepcopy(kwargs), chunk_size=chunk)
    x = torch.randn(n, c, requires_grad=True)

    def largest_saved(module: nn.Module) -> tuple[int, int]:
        sizes: list[int] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = module(x, pos, idx)
            forward = max(sizes)
            sizes.clear()
            y.sum().backward()
        return forward, max(sizes, default=0)

    forward, backward = largest_saved(layer)
    assert forward <= n * k * c // 8  # at most (N, k, G), G = C / 8, or (N, k, heads)
    assert backward <= chunk * k * c
    layer.memory_efficient = False
    assert largest_saved(layer)[0] >= n * k * c


@pytest.mark.parametrize("kwargs", [CONFIGS[0], CONFIGS[1]])
def test_worker_threads_match_single_thread(kwargs):
    """Chunks spread over CPU worker threads: same results, reproducible, settings kept."""
    n, k, c = 90, 8, 16
    pos, idx = make_cloud(n, k, seed=16)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, **copy.deepcopy(kwargs), chunk_size=7).double()
    x = torch.randn(n, c, dtype=torch.float64)
    gout = torch.randn(n, c, dtype=torch.float64)
    single = run(layer, x, pos, idx, gout)
    torch.set_num_threads(2)
    try:
        threaded = run(layer, x, pos, idx, gout)
        again = run(layer, x, pos, idx, gout)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert_same_run(single, threaded, atol=1e-12, rtol=1e-10)
    assert_same_run(threaded, again, atol=0, rtol=0)


def test_duplicate_neighbours_match_plain():
    """Indices may repeat (e.g. clouds with fewer than k points padded with the point itself)."""
    n, k, c = 40, 8, 16
    pos, idx = make_cloud(n, k, seed=4)
    idx[:, 5:] = idx[:, :1]
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, chunk_size=7).double()
    plain = copy.deepcopy(layer)
    plain.memory_efficient = False
    x = torch.randn(n, c, dtype=torch.float64)
    gout = torch.randn(n, c, dtype=torch.float64)
    a, b = run(layer, x, pos, idx, gout), run(plain, x, pos, idx, gout)
    assert_same_run(a, b, atol=1e-10, rtol=1e-9)


# ----------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(share_planes=2),
        dict(share_planes=1, position_encoding="linear"),
        dict(norm="layer", share_planes=2),
        dict(mode="scalar", num_heads=2),
    ],
    ids=["ptv1-bn", "ptv1-bn-linear", "ptv1-ln", "scalar"],
)
def test_gradcheck_layer(kwargs):
    """Finite differences through the custom autograd functions (inputs and all weights)."""
    n, k, c = 8, 3, 4
    pos, idx = make_cloud(n, k, seed=5)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, **kwargs, chunk_size=3).double()
    named = list(layer.named_parameters())
    names = [nm for nm, _ in named]
    params = [p.detach().clone().requires_grad_() for _, p in named]
    x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    p0 = pos.clone().requires_grad_()

    def f(x, pos, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x, pos, idx))

    assert torch.autograd.gradcheck(f, (x, p0, *params), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_chunked_edge_map():
    m, n, k, c = 7, 9, 3, 2
    torch.manual_seed(0)
    idx = torch.randint(0, m, (n, k))
    rows = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    src = torch.randn(m, c, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c, c, dtype=torch.float64, requires_grad=True)

    def fn(r, g, p):
        return (torch.tanh(g[0] @ p[0]) * r[0].unsqueeze(1)).sum(1)  # (n, C)

    def f(rows, src, w):
        return chunked_edge_map(fn, idx, [rows], [src], [w], chunk=4)

    assert torch.autograd.gradcheck(f, (rows, src, w))
    ref = fn([rows], [src[idx]], [w])
    torch.testing.assert_close(f(rows, src, w), ref)
