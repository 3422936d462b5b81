"""Positional encodings: sinusoidal formula, position MLP, relative position bias."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sciformer.attention.positional import (
    PositionMLP,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from sciformer.errors import ConfigError, DataError


def test_sinusoidal_matches_formula() -> None:
    pos = torch.tensor([0.0, 1.0, 2.5, 417.3, 2500.0])  # band indices or wavelengths in nm
    dim = 8
    pe = sinusoidal_encoding(pos, dim)
    for a, p in enumerate(pos.tolist()):
        for i in range(dim // 2):
            w = 10000.0 ** (-2 * i / dim)
            assert pe[a, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-4)
            assert pe[a, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-4)


@pytest.mark.parametrize("length", [1, 7, 200, 3000])
def test_sinusoidal_any_length_no_table(length: int) -> None:
    enc = SinusoidalPositionalEncoding(16)
    assert not list(enc.parameters())
    pos = torch.arange(length, dtype=torch.float32)
    pe = enc(pos)
    assert pe.shape == (length, 16)
    # the encoding of a position does not depend on the sequence it sits in
    torch.testing.assert_close(pe[:1], enc(pos[:1]))
    assert torch.isfinite(pe).all() and pe.abs().max() <= 1.0


def test_sinusoidal_batched_scale_and_2d() -> None:
    enc = SinusoidalPositionalEncoding(8, scale=0.5)
    pos = torch.rand(3, 5) * 100
    torch.testing.assert_close(enc(pos), sinusoidal_encoding(pos * 0.5, 8))
    enc2 = SinusoidalPositionalEncoding(8, pos_dim=2, base=100.0)
    xy = torch.randn(6, 2)
    expected = torch.cat([sinusoidal_encoding(xy[:, 0], 4, 100.0), sinusoidal_encoding(xy[:, 1], 4, 100.0)], dim=-1)
    torch.testing.assert_close(enc2(xy), expected)
    with pytest.raises(DataError, match="positions"):
        enc2(torch.randn(6, 3))


def test_sinusoidal_bad_dim() -> None:
    with pytest.raises(ConfigError, match="dim"):
        sinusoidal_encoding(torch.arange(3.0), 5)
    with pytest.raises(ConfigError, match="dim"):
        SinusoidalPositionalEncoding(6, pos_dim=2)


def test_position_mlp_point_transformer_layout() -> None:
    torch.manual_seed(0)
    mlp = PositionMLP(3, 16)  # Linear(3,3)-BN-ReLU-Linear(3,16)
    lin1, bn, _, lin2 = mlp.net
    assert (lin1.in_features, lin1.out_features, lin2.out_features) == (3, 3, 16)
    offsets = torch.randn(10, 4, 3)  # (N, k, 3) neighbour offsets
    out = mlp(offsets)
    assert out.shape == (10, 4, 16)
    ref_bn = nn.BatchNorm1d(3)
    ref_bn.load_state_dict({k: v for k, v in bn.state_dict().items()})
    h = ref_bn(lin1(offsets.reshape(-1, 3)))  # batch statistics over every (N, k) offset
    expected = lin2(torch.relu(h)).view(10, 4, 16)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("norm", ["layer", "none"])
def test_position_mlp_other_norms(norm: str) -> None:
    mlp = PositionMLP(1, 4, hidden_dim=8, norm=norm)
    x = torch.randn(5, 5, 1)
    out = mlp(x)
    assert out.shape == (5, 5, 4)
    lin1, norm_mod, _, lin2 = list(mlp.net)
    h = lin1(x)  # (5, 5, 8)
    if norm == "layer":  # the reference formula: LayerNorm over the hidden channels
        h = torch.nn.functional.layer_norm(h, (8,), norm_mod.weight, norm_mod.bias, norm_mod.eps)
    torch.testing.assert_close(out, lin2(torch.relu(h)))


def test_position_mlp_bad_input() -> None:
    with pytest.raises(DataError, match="last dimension 3"):
        PositionMLP(3, 8)(torch.randn(4, 2))
    with pytest.raises(ConfigError, match="norm"):
        PositionMLP(3, 8, norm="group")  # type: ignore[arg-type]


def test_relative_bias_matches_offsets_formula() -> None:
    torch.manual_seed(0)
    rpb = RelativePositionBias(num_heads=3, hidden_dim=8, scale=0.1)
    pos = torch.tensor([400.0, 410.0, 425.0, 900.0])  # wavelengths in nm
    bias = rpb(pos)
    assert bias.shape == (3, 4, 4)
    for i in range(4):
        for j in range(4):
            t = 0.1 * (pos[i] - pos[j])
            f = torch.sign(t) * torch.log1p(t.abs())
            torch.testing.assert_close(bias[:, i, j], rpb.mlp(f.view(1)))


def test_relative_bias_translation_invariant_any_length() -> None:
    torch.manual_seed(0)
    rpb = RelativePositionBias(num_heads=2)
    for length in (1, 5, 50):
        pos = torch.rand(length) * 200
        torch.testing.assert_close(rpb(pos), rpb(pos + 37.0), rtol=1e-4, atol=1e-5)
    batched = rpb(torch.rand(3, 6))
    assert batched.shape == (3, 2, 6, 6)


def test_relative_bias_3d_offsets_and_keys() -> None:
    torch.manual_seed(0)
    rpb = RelativePositionBias(num_heads=4, pos_dim=3, log_scale=False)
    q, k = torch.randn(5, 3), torch.randn(7, 3)
    bias = rpb(q, k)
    assert bias.shape == (4, 5, 7)
    torch.testing.assert_close(bias[:, 2, 6], rpb.mlp(q[2] - k[6]))
    with pytest.raises(DataError, match="positions"):
        rpb(torch.randn(5, 2))


def test_relative_bias_gradients() -> None:
    rpb = RelativePositionBias(num_heads=2)
    rpb(torch.arange(6.0)).sum().backward()
    assert all(p.grad is not None for p in rpb.parameters())
