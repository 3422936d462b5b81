"""Grouped vector attention (PTv2) against a per-point reference written from the paper's formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sciformer.attention import GroupedVectorAttention, PointTransformerBlock
from sciformer.errors import ConfigError, DataError


def _mlp(seq: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """Linear-Norm-ReLU-Linear of a module, applied with eval-mode (running) statistics, row by row."""
    lin1, norm, _, lin2 = seq
    h = x @ lin1.weight.T + lin1.bias
    if isinstance(norm, torch.nn.BatchNorm1d):
        h = (h - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias
    else:
        h = F.layer_norm(h, h.shape[-1:], norm.weight, norm.bias, norm.eps)
    return torch.relu(h) @ lin2.weight.T + lin2.bias


def _proj(seq: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    lin, norm, _ = seq
    h = x @ lin.weight.T + lin.bias
    h = (h - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias
    return torch.relu(h)


def reference(layer: GroupedVectorAttention, x: torch.Tensor, pos: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """y_i^(g) = sum_j softmax_j(omega(rho_ij))_g (v_j + beta_ij)^(g), one point at a time, padding skipped."""
    c, g = layer.channels, layer.groups
    q, k = _proj(layer.linear_q, x), _proj(layer.linear_k, x)
    v = x @ layer.linear_v.weight.T + layer.linear_v.bias
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        js = [int(j) for j in idx[i] if j >= 0]
        if not js:
            continue
        r = pos[js] - pos[i]  # (m, 3)
        rho = k[js] - q[i]  # (m, C)
        val = v[js]
        if layer.linear_p_multiplier is not None:
            rho = rho * _mlp(layer.linear_p_multiplier, r)
        if layer.linear_p_bias is not None:
            beta = _mlp(layer.linear_p_bias, r)
            rho, val = rho + beta, val + beta
        w = torch.softmax(_mlp(layer.weight_encoding, rho), dim=0)  # (m, G)
        for group in range(g):
            block = slice(group * c // g, (group + 1) * c // g)
            out[i, block] = (w[:, group : group + 1] * val[:, block]).sum(0)
    return out


def _randomise_norms(layer: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for m in layer.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.3)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.2)


def _inputs(n: int = 40, c: int = 16, k: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=gen)
    pos = torch.rand(n, 3, generator=gen)
    idx = torch.randint(0, n, (n, k), generator=gen)
    idx[:, 0] = torch.arange(n)  # self included
    return x, pos, idx


@pytest.mark.parametrize("pe_multiplier", [False, True])
@pytest.mark.parametrize("pe_bias", [False, True])
def test_matches_per_point_reference(pe_multiplier: bool, pe_bias: bool) -> None:
    torch.manual_seed(0)
    layer = GroupedVectorAttention(16, 4, pe_multiplier=pe_multiplier, pe_bias=pe_bias).eval()
    _randomise_norms(layer)
    x, pos, idx = _inputs()
    idx[3, 2:] = -1  # padding
    idx[5] = -1  # no valid neighbour at all
    with torch.no_grad():
        got = layer(x, pos, idx)
    torch.testing.assert_close(got, reference(layer, x, pos, idx), rtol=1e-5, atol=1e-5)
    assert torch.equal(got[5], torch.zeros(16))


def _batch_norm(norm: torch.nn.BatchNorm1d, h: torch.Tensor) -> torch.Tensor:
    mean, var = h.mean(0), h.var(0, unbiased=False)
    return (h - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _train_mlp(seq: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    lin1, norm, _, lin2 = seq
    return torch.relu(_batch_norm(norm, x @ lin1.weight.T + lin1.bias)) @ lin2.weight.T + lin2.bias


def test_training_normalises_edges_with_batch_statistics() -> None:
    """Train mode: q/k norms use the N points' statistics, edge MLP norms those of all N*k edges."""
    torch.manual_seed(1)
    layer = GroupedVectorAttention(8, 2, pe_multiplier=True).train()
    x, pos, idx = _inputs(n=30, c=8, k=5)
    n, k = idx.shape
    ii, jj = torch.arange(n).repeat_interleave(k), idx.reshape(-1)  # (E,) edge ends
    q = torch.relu(_batch_norm(layer.linear_q[1], x @ layer.linear_q[0].weight.T + layer.linear_q[0].bias))
    kk = torch.relu(_batch_norm(layer.linear_k[1], x @ layer.linear_k[0].weight.T + layer.linear_k[0].bias))
    v = x @ layer.linear_v.weight.T + layer.linear_v.bias
    rel = pos[jj] - pos[ii]  # (E, 3)
    beta = _train_mlp(layer.linear_p_bias, rel)  # (E, C)
    rho = (kk[jj] - q[ii]) * _train_mlp(layer.linear_p_multiplier, rel) + beta
    w = torch.softmax(_train_mlp(layer.weight_encoding, rho).view(n, k, 2), dim=1)  # (N, k, G)
    val = (v[jj] + beta).view(n, k, 2, 4)  # (N, k, G, C/G)
    expected = torch.einsum("nkgi,nkg->ngi", val, w).reshape(n, 8)
    before = layer.weight_encoding[1].running_mean.clone()
    got = layer(x, pos, idx)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert not torch.equal(layer.weight_encoding[1].running_mean, before)  # running stats follow the edges


def test_chunked_evaluation_is_exact() -> None:
    torch.manual_seed(2)
    layer = GroupedVectorAttention(16, 8, pe_multiplier=True).eval()
    _randomise_norms(layer, seed=3)
    x, pos, idx = _inputs(n=57, k=9)
    with torch.no_grad():
        whole = layer(x, pos, idx)
        layer.chunk_size = 5
        torch.testing.assert_close(layer(x, pos, idx), whole, rtol=0, atol=1e-6)


def test_gradcheck() -> None:
    torch.manual_seed(3)
    layer = GroupedVectorAttention(4, 2, pe_multiplier=True, norm="layer").double()
    x, pos, idx = _inputs(n=7, c=4, k=3)
    x, pos = x.double().requires_grad_(), pos.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: layer(a, b, idx), (x, pos), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("train", [False, True])
def test_permutation_equivariance(train: bool) -> None:
    torch.manual_seed(4)
    layer = GroupedVectorAttention(16, 4, pe_multiplier=True).train(train)
    _randomise_norms(layer)
    x, pos, idx = _inputs(n=33)
    perm = torch.randperm(33)
    inverse = torch.argsort(perm)
    with torch.no_grad():
        y = layer(x, pos, idx)
        y_perm = layer(x[perm], pos[perm], inverse[idx[perm]])
    torch.testing.assert_close(y_perm, y[perm], rtol=1e-4, atol=1e-5)


def test_bad_arguments_give_one_line() -> None:
    with pytest.raises(ConfigError, match="groups must be a positive divisor of channels=16"):
        GroupedVectorAttention(16, 5)
    with pytest.raises(ConfigError, match="attention must be 'ptv1' or 'ptv2'"):
        PointTransformerBlock(16, attention="ptv3")
    layer = GroupedVectorAttention(16, 4)
    x, pos, idx = _inputs()
    idx[0, 0] = -2
    with pytest.raises(DataError) as e:
        layer(x, pos, idx)
    assert "[-1, 40)" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="pos must have shape"):
        layer(x, pos[:-1], idx.clamp(min=0))


def test_ptv2_block_is_residual_and_trains() -> None:
    torch.manual_seed(5)
    block = PointTransformerBlock(16, attention="ptv2", share_planes=4, pe_multiplier=True, attn_drop=0.1)
    assert isinstance(block.transformer2, GroupedVectorAttention) and block.transformer2.groups == 4
    x, pos, idx = _inputs()
    y = block(x, pos, idx)
    assert y.shape == x.shape
    y.sum().backward()
    assert all(p.grad is not None for p in block.parameters())
    with torch.no_grad():  # residual: with the branch's last norm zeroed the block is relu(x)
        block.bn3.weight.zero_()
        block.bn3.bias.zero_()
        torch.testing.assert_close(block(x, pos, idx), torch.relu(x))
