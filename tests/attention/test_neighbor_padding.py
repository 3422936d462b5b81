"""One neighbour-index contract for PTv1 and PTv2: -1 entries are padding, masked."""

from __future__ import annotations

import pytest
import torch

from sciformer.attention import GroupedVectorAttention, PointTransformerLayer
from sciformer.geometry import knn


def make_layer(kind: str, c: int, **kw) -> torch.nn.Module:
    if kind == "ptv1":
        return PointTransformerLayer(c, share_planes=4, **kw)
    if kind == "ptv1-scalar":
        return PointTransformerLayer(c, mode="scalar", num_heads=2, **kw)
    return GroupedVectorAttention(c, c // 4)


def randomise(layer: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(7)
    for m in layer.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen, dtype=m.running_mean.dtype) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen, dtype=m.running_var.dtype) + 0.5)


KINDS = ["ptv1", "ptv1-scalar", "ptv2"]


@pytest.mark.parametrize("kind", KINDS)
def test_padding_equals_dropping_the_padded_columns(kind: str) -> None:
    torch.manual_seed(0)
    n, k, c = 40, 8, 16
    pos = torch.rand(n, 3, dtype=torch.float64)
    idx, _ = knn(pos, None, k)
    layer = make_layer(kind, c).double()
    randomise(layer)
    x = torch.randn(n, c, dtype=torch.float64)
    padded = idx.clone()
    padded[:, 5:] = -1  # every row: 5 real neighbours, 3 padding slots
    # training: statistics over the real edges only, as with the index without padding
    layer.train()
    torch.testing.assert_close(layer(x, pos, padded), layer(x, pos, idx[:, :5]))
    # evaluation: rows with different padding each equal their unpadded computation
    layer.eval()
    mixed = idx.clone()
    mixed[20:, 6:] = -1
    y = layer(x, pos, mixed)
    torch.testing.assert_close(y[:20], layer(x, pos, idx)[:20])
    torch.testing.assert_close(y[20:], layer(x, pos, idx[:, :6])[20:])


@pytest.mark.parametrize("kind", KINDS)
def test_point_without_neighbours_outputs_zeros_and_gradients_flow(kind: str) -> None:
    torch.manual_seed(1)
    n, k, c = 20, 4, 8
    pos = torch.rand(n, 3)
    idx, _ = knn(pos, None, k)
    idx[3] = -1
    layer = make_layer(kind, c)
    x = torch.randn(n, c, requires_grad=True)
    y = layer(x, pos, idx)
    assert torch.equal(y[3], torch.zeros(c))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_ptv1_padded_path_gradcheck() -> None:
    torch.manual_seed(2)
    n, k, c = 9, 4, 4
    pos = torch.rand(n, 3, dtype=torch.float64)
    idx, _ = knn(pos, None, k)
    idx[0, 2:] = -1
    idx[5, 1] = -1
    layer = PointTransformerLayer(c, share_planes=2).double()
    x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t, pos, idx), (x,))
