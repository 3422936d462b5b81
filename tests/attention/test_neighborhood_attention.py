"""Neighbourhood (Point Transformer) attention: oracles, gradients, memory-saving path."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree
from torch import nn

from sciformer.attention._neighborhood_ops import chunked_edge_map
from sciformer.attention.neighborhood import (
    PointTransformerLayer,
    check_neighbor_index,
)
from sciformer.attention.point_block import PointTransformerBlock
from sciformer.errors import ConfigError, DataError

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


# -------------------------------------------------------------- independent loop oracles


def test_vector_attention_loop_reference_grouping():
    """Per-point loop in eval mode: weight channel g is shared by channels g + m*G."""
    n, k, c, share = 30, 5, 16, 4
    g = c // share
    pos, idx = make_cloud(n, k, seed=6)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, share_planes=share).double().eval()
    randomize_norms(layer)
    x = torch.randn(n, c, dtype=torch.float64)
    y = layer(x, pos, idx)

    def bn(m, t):
        return (t - m.running_mean) / torch.sqrt(m.running_var + m.eps) * m.weight + m.bias

    lp, lw = layer.linear_p, layer.linear_w
    q, kk, v = layer.linear_q(x), layer.linear_k(x), layer.linear_v(x)
    expect = torch.zeros(n, c, dtype=torch.float64)
    for i in range(n):
        ws, vals = [], []
        for j in idx[i].tolist():
            r = pos[j] - pos[i]
            delta = lp[3](torch.relu(bn(lp[1], lp[0](r))))
            a = kk[j] - q[i] + delta
            w = lw[5](torch.relu(bn(lw[3], lw[2](torch.relu(bn(lw[0], a))))))
            ws.append(w)
            vals.append(v[j] + delta)
        ws_t = torch.softmax(torch.stack(ws), 0)  # (k, G)
        for ch in range(c):
            expect[i, ch] = sum(ws_t[jj, ch % g] * vals[jj][ch] for jj in range(k))
    torch.testing.assert_close(y, expect, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("memory_efficient", [True, False])
def test_scalar_attention_loop_reference(memory_efficient):
    n, k, c, heads = 25, 6, 12, 3
    dh = c // heads
    pos, idx = make_cloud(n, k, seed=7)
    torch.manual_seed(0)
    layer = PointTransformerLayer(
        c, mode="scalar", num_heads=heads, memory_efficient=memory_efficient, chunk_size=4
    ).double()
    layer.eval()
    randomize_norms(layer)
    x = torch.randn(n, c, dtype=torch.float64)
    y = layer(x, pos, idx)
    lp = layer.linear_p
    bn = lp[1]
    q, kk, v = layer.linear_q(x), layer.linear_k(x), layer.linear_v(x)
    expect = torch.zeros(n, c, dtype=torch.float64)
    for i in range(n):
        for h in range(heads):
            sl = slice(h * dh, (h + 1) * dh)
            logits = []
            for j in idx[i].tolist():
                hid = lp[0](pos[j] - pos[i])
                hid = (hid - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps)
                hid = torch.relu(hid * bn.weight + bn.bias)
                logits.append(q[i, sl] @ kk[j, sl] / math.sqrt(dh) + lp[3](hid)[h])
            a = torch.softmax(torch.stack(logits), 0)
            expect[i, sl] = sum(a[t] * v[j, sl] for t, j in enumerate(idx[i].tolist()))
    torch.testing.assert_close(y, expect, atol=1e-10, rtol=1e-10)


# --------------------------------------------------------------------------- equivariance


@pytest.mark.parametrize("kwargs", [CONFIGS[0], CONFIGS[6]])
@pytest.mark.parametrize("train", [True, False])
def test_permutation_equivariance(kwargs, train):
    n, k, c = 80, 8, 16
    pos, idx = make_cloud(n, k, seed=8)
    torch.manual_seed(0)
    layer = PointTransformerLayer(c, **copy.deepcopy(kwargs), chunk_size=9).double().train(train)
    randomize_norms(layer)
    x = torch.randn(n, c, dtype=torch.float64)
    perm = torch.randperm(n)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    idx_p = inv[idx[perm]]  # neighbours of new point i = old perm[i], renumbered
    y = layer(x, pos, idx)
    y_p = layer(x[perm], pos[perm], idx_p)
    torch.testing.assert_close(y_p, y[perm], atol=1e-10, rtol=1e-10)


# ------------------------------------------------------------------------------- block


@pytest.mark.parametrize("norm", ["batch", "layer"])
@pytest.mark.parametrize("memory_efficient", [True, False])
def test_block_matches_manual_composition(memory_efficient, norm):
    n, k, c = 60, 8, 16
    pos, idx = make_cloud(n, k, seed=9)
    torch.manual_seed(0)
    block = PointTransformerBlock(c, norm=norm, memory_efficient=memory_efficient).double()
    x = torch.randn(n, c, dtype=torch.float64)
    y = block(x, pos, idx)
    ref = copy.deepcopy(block)
    h = torch.relu(ref.bn1(ref.linear1(x)))
    h = torch.relu(ref.bn2(ref.transformer2(h, pos, idx)))
    expect = torch.relu(x + ref.bn3(ref.linear3(h)))
    torch.testing.assert_close(y, expect, atol=1e-12, rtol=1e-12)
    assert y.shape == (n, c) and (y >= 0).all()
    names = {"linear1.weight", "bn1.weight", "transformer2.linear_w.2.weight", "bn3.bias"}
    assert names <= set(block.state_dict())


def test_block_gradients_memory_efficient_equal_plain():
    n, k, c = 50, 8, 16
    pos, idx = make_cloud(n, k, seed=10)
    torch.manual_seed(0)
    block = PointTransformerBlock(c, share_planes=4, chunk_size=11).double()
    plain = copy.deepcopy(block)
    plain.transformer2.memory_efficient = False
    x = torch.randn(n, c, dtype=torch.float64)
    gout = torch.randn(n, c, dtype=torch.float64)
    a, b = run(block, x, pos, idx, gout), run(plain, x, pos, idx, gout)
    assert_same_run(a, b, atol=1e-10, rtol=1e-9)


def test_in_out_channels_differ():
    n, k = 40, 8
    pos, idx = make_cloud(n, k, seed=11)
    layer = PointTransformerLayer(6, 16).double()
    plain = copy.deepcopy(layer)
    plain.memory_efficient = False
    x = torch.randn(n, 6, dtype=torch.float64)
    gout = torch.randn(n, 16, dtype=torch.float64)
    a, b = run(layer, x, pos, idx, gout), run(plain, x, pos, idx, gout)
    assert_same_run(a, b, atol=1e-10, rtol=1e-9)


def test_inference_without_grad_and_int32_index():
    n, k, c = 40, 8, 16
    pos, idx = make_cloud(n, k, seed=12, dtype=torch.float32)
    layer = PointTransformerLayer(c).eval()
    x = torch.randn(n, c)
    with torch.no_grad():
        y = layer(x, pos, idx.int())
    plain = copy.deepcopy(layer)
    plain.memory_efficient = False
    torch.testing.assert_close(y, plain(x, pos, idx), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- bad input


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x, p, i: (x, p, i + 1), r"idx values must lie in \[-1, 20\) \(-1 = padding\)"),
        (lambda x, p, i: (x, p, i - 2), r"idx values must lie in \[-1, 20\) \(-1 = padding\)"),
        (lambda x, p, i: (x, p, i[:-1]), r"idx must have shape \(N=20, k>=1\)"),
        (lambda x, p, i: (x, p, i[:, 0]), r"idx must have shape"),
        (lambda x, p, i: (x, p, i.double()), r"idx must be an integer tensor"),
        (lambda x, p, i: (x, p, i.numpy()), r"idx must be a torch.Tensor"),
        (lambda x, p, i: (x[:, :5], p, i), r"x must have shape \(N, in_channels=8\)"),
        (lambda x, p, i: (x.long(), p, i), r"x must be a floating-point tensor"),
        (lambda x, p, i: (x, p[:, :2], i), r"pos must have shape \(N=20, 3\)"),
        (lambda x, p, i: (x, p[:-1], i), r"pos must have shape"),
        (lambda x, p, i: (x[:0], p[:0], i[:0]), r"x must contain at least one point"),
    ],
)
def test_bad_input_raises_one_line_data_error(bad, match):
    pos, idx = make_cloud(20, 4, seed=13, dtype=torch.float32)
    x = torch.randn(20, 8)
    layer = PointTransformerLayer(8)
    with pytest.raises(DataError, match=match) as exc:
        layer(*bad(x, pos, idx))
    _one_line(exc)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(share_planes=3), "share_planes must be a positive divisor of out_channels=8"),
        (dict(mode="dense"), "mode must be one of"),
        (dict(position_encoding="sine"), "position_encoding must be one of"),
        (dict(norm="group"), "norm must be one of"),
        (dict(attn_mlp=None), "attn_mlp=None .* needs share_planes=1"),
        (dict(attn_mlp="mlp"), "attn_mlp must be 'ptv1', None or an nn.Module"),
        (dict(mode="scalar", num_heads=3), "num_heads must be a positive divisor"),
        (dict(chunk_size=0), "chunk_size must be a positive integer"),
    ],
)
def test_bad_config_raises_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match) as exc:
        PointTransformerLayer(8, **kwargs)
    _one_line(exc)


def test_custom_attn_mlp_with_batchnorm_needs_plain_path():
    pos, idx = make_cloud(20, 4, seed=14, dtype=torch.float32)
    attn = nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 8))
    layer = PointTransformerLayer(8, share_planes=1, attn_mlp=attn)
    with pytest.raises(ConfigError, match="memory_efficient=False") as exc:
        layer(torch.randn(20, 8), pos, idx)
    _one_line(exc)
    layer.memory_efficient = False
    assert layer(torch.randn(20, 8), pos, idx).shape == (20, 8)


def test_check_neighbor_index_returns_int64():
    idx = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    out = check_neighbor_index(idx, 2, 2)
    assert out.dtype == torch.long and out.tolist() == [[0, 1], [1, 0]]
