"""The fused v1 stages' backward pass when the graph is kept or freed (``_neighborhood_fused``).

VectorStage2's backward pass writes the gradient of u over its saved softmax when the
backward pass frees the graph (no ``retain_graph``), and into a block of its own when the
graph is kept. Checked: repeated backward passes through one retained graph give
bit-identical gradients on both paths (compiled stages and torch operations), equal to the
float64 plain gather implementation; a freeing pass gives the same gradients and takes no
new (N, k, G) block.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from scipy.spatial import cKDTree

from sciformer.attention import _neighborhood_native as native
from sciformer.attention.neighborhood import PointTransformerLayer
from sciformer.utils import block_cache


@pytest.fixture(autouse=True)
def _compiled_enabled_after() -> Iterator[None]:
    yield
    native.enabled = True


def cloud(n: int, k: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 3, generator=gen)
    idx = torch.from_numpy(cKDTree(pos.numpy()).query(pos.numpy(), k=k)[1]).long()  # (N, k)
    return torch.randn(n, c, generator=gen), pos, idx


def grads_of(layer: PointTransformerLayer, x: torch.Tensor, pos: torch.Tensor, idx: torch.Tensor,
             passes: int) -> list[list[torch.Tensor]]:
    """Gradients of one forward pass in x, pos and every parameter, ``passes`` times through the
    same graph (all but the last keep it)."""
    x, pos = x.clone().requires_grad_(), pos.clone().requires_grad_()
    out = layer(x, pos, idx)
    weight = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out)
    loss = (out * weight).sum()
    inputs = [x, pos, *layer.parameters()]
    return [list(torch.autograd.grad(loss, inputs, retain_graph=i + 1 < passes)) for i in range(passes)]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("share", [1, 4])
def test_backward_passes_through_a_kept_graph_repeat_their_gradients(compiled, share):
    native.enabled = compiled
    x, pos, idx = cloud(300, 8, 16, seed=share)
    torch.manual_seed(0)
    layer = PointTransformerLayer(16, 16, share_planes=share, chunk_size=64).train()
    reference = copy.deepcopy(layer).double()
    reference.memory_efficient = False
    first, second, last = grads_of(layer, x, pos, idx, passes=3)  # keep, keep, free
    for a, b, c in zip(first, second, last):
        assert torch.equal(a, b) and torch.equal(a, c)
    (want,) = grads_of(reference, x.double(), pos.double(), idx, passes=1)
    for got, w in zip(first, want):  # (zero in exact arithmetic: the bias before a BatchNorm)
        assert (got.double() - w).abs().max().item() <= 1e-4 * w.abs().max().item() + 1e-6


@pytest.mark.parametrize("retain", [True, False])
def test_a_freeing_backward_pass_takes_no_new_edge_block(retain, monkeypatch):
    """Blocks of 2 MiB or more come from the cache here (its lower bound lowered): a
    backward pass that frees the graph writes the gradient of u over the softmax."""
    monkeypatch.setattr(block_cache.CACHE, "min_bytes", 0)
    x, pos, idx = cloud(2048, 16, 64, seed=5)  # (N, k, G) blocks of 8 MiB
    layer = PointTransformerLayer(64, 64, share_planes=1).train()
    x, pos = x.requires_grad_(), pos.requires_grad_()
    out = layer(x, pos, idx)
    new_blocks: list[int] = []
    make = block_cache._Block.new.__func__

    def counted(cls: type, nbytes: int) -> block_cache._Block:
        new_blocks.append(nbytes)
        return make(cls, nbytes)

    monkeypatch.setattr(block_cache._Block, "new", classmethod(counted))
    block_cache.release_cached_blocks()  # none free: a request for a block makes one
    out.sum().backward(retain_graph=retain)
    big = [b for b in new_blocks if b >= idx.numel() * 64 * 4]
    assert len(big) == (1 if retain else 0)
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
