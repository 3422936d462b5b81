"""Neighbourhood (Point Transformer) attention: loop oracles, permutation equivariance, the block,
bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from neighborhood_cases import CONFIGS, assert_same_run, make_cloud, randomize_norms, run
from torch import nn

from sciformer.attention.neighborhood import (
    PointTransformerLayer,
    check_neighbor_index,
)
from sciformer.attention.point_block import PointTransformerBlock
from sciformer.errors import ConfigError, DataError

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


# --------------------------------------------------------------------------- wide positions


@pytest.mark.parametrize("memory_efficient", [True, False])
@pytest.mark.parametrize("kind", ["ptv1", "grouped"])
def test_float64_map_coordinates_beside_float32_features(kind: str, memory_efficient: bool) -> None:
    """The layers use only offsets p_j - p_i: the same cloud at UTM-sized coordinates (5e6 m,
    float64) gives the output it gives near the origin, not one rounded at float32's 0.5 m."""
    from scipy.spatial import cKDTree

    from sciformer.attention.grouped import GroupedVectorAttention

    gen = torch.Generator().manual_seed(4)
    local = torch.rand(300, 3, generator=gen, dtype=torch.float64) * 20.0  # a 20 m patch, cm detail
    x = torch.randn(300, 16, generator=gen)
    idx = torch.from_numpy(cKDTree(local.numpy()).query(local.numpy(), k=8)[1])
    torch.manual_seed(0)
    if kind == "ptv1":
        layer: nn.Module = PointTransformerLayer(16, 16, memory_efficient=memory_efficient)
    else:
        layer = GroupedVectorAttention(16, 4)
    layer.train()  # batch statistics: a mean over all edges, as sensitive as any
    near = layer(x, local, idx)
    far = layer(x, local + torch.tensor([512_345.678, 5_432_109.876, 123.0], dtype=torch.float64), idx)
    torch.testing.assert_close(far, near, atol=1e-4, rtol=1e-4)


def test_integer_positions_are_taken() -> None:
    x, pos = torch.randn(32, 8), torch.randint(0, 50, (32, 3))
    idx = torch.cdist(pos.double(), pos.double()).topk(4, largest=False).indices
    out = PointTransformerLayer(8, 8)(x, pos, idx)
    assert out.shape == (32, 8) and torch.isfinite(out).all()
