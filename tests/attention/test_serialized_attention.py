"""Serialized patch attention (PTv3) and the conditional positional encoding against oracles."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from sciformer.attention import (
    ConditionalPositionalEncoding,
    NeighborBasis,
    PatchLayout,
    PreNormBlock,
    SerializedAttention,
    SerializedContext,
)
from sciformer.errors import DataError
from sciformer.geometry import (
    grid_coordinates,
    knn,
    serialization_order,
    sizes_to_offset,
)


def torch_mha(attn: SerializedAttention) -> nn.MultiheadAttention:
    """torch.nn.MultiheadAttention with the same weights (independent oracle)."""
    inner = attn.attn
    ref = nn.MultiheadAttention(inner.dim, inner.num_heads, batch_first=True).to(inner.qkv.qkv.weight.dtype)
    with torch.no_grad():
        ref.in_proj_weight.copy_(inner.qkv.qkv.weight)
        ref.in_proj_bias.copy_(inner.qkv.qkv.bias)
        ref.out_proj.weight.copy_(inner.out.proj.weight)
        ref.out_proj.bias.copy_(inner.out.proj.bias)
    return ref.eval()


def cloud(sizes: list[int], seed: int = 0, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    coord = torch.rand(n, 3, generator=gen, dtype=torch.float64).to(dtype)
    offset = sizes_to_offset(sizes)
    grid = grid_coordinates(coord, 0.05, offset)
    return coord, offset, grid


def context(coord, offset, grid, orders=("z", "hilbert"), k: int = 6) -> SerializedContext:
    perms = [serialization_order(grid, offset, o) for o in orders]
    idx, _ = knn(coord, None, k, offset, fill="nearest")
    return SerializedContext(perms, offset, NeighborBasis.build(coord, idx, 0.05))


def test_one_patch_per_cloud_is_full_dense_attention() -> None:
    torch.manual_seed(0)
    sizes = [37, 64, 9]
    coord, offset, grid = cloud(sizes)
    ctx = context(coord, offset, grid)
    attn = SerializedAttention(16, 4, patch_size=128).eval()
    x = torch.randn(sum(sizes), 16)
    y = attn(x, ctx)
    ref = torch_mha(attn)
    start = 0
    for size in sizes:
        xs = x[start : start + size].unsqueeze(0)  # (1, n_b, C) the whole cloud
        expect = ref(xs, xs, xs, need_weights=False)[0][0]
        torch.testing.assert_close(y[start : start + size], expect, atol=1e-5, rtol=1e-5)
        start += size


@pytest.mark.parametrize("shift", [False, True])
def test_padding_does_not_change_real_points(shift: bool) -> None:
    torch.manual_seed(1)
    sizes = [50, 23, 31]
    s = 16
    coord, offset, grid = cloud(sizes, seed=1)
    ctx = context(coord, offset, grid)
    attn = SerializedAttention(8, 2, patch_size=s, order_index=1, shift_patch=shift).eval()
    x = torch.randn(sum(sizes), 8)
    y = attn(x, ctx)
    # oracle: cut each cloud's serialized points into patches by hand (no padding at all)
    ref = torch_mha(attn)
    perm = ctx.orders[1]
    expect = torch.empty_like(y)
    start = 0
    for size in sizes:
        pts = perm[start : start + size]
        lead = s // 2 if shift and size > s else 0
        bounds = [0] + list(range(s - lead if lead else s, size, s)) + [size]
        for a, b in itertools.pairwise(bounds):
            members = pts[a:b]
            xs = x[members].unsqueeze(0)
            expect[members] = ref(xs, xs, xs, need_weights=False)[0][0]
        start += size
    torch.testing.assert_close(y, expect, atol=1e-5, rtol=1e-5)
    layout = ctx.layout(1, s, shift)
    assert layout.mask is not None and int(layout.mask.sum()) == layout.gather.numel() - sum(sizes)


def test_layout_places_every_point_exactly_once() -> None:
    sizes = [70, 5, 33]
    _, offset, grid = cloud(sizes, seed=2)
    perm = serialization_order(grid, offset, "hilbert")
    for shift in (False, True):
        layout = PatchLayout.build(perm, offset, 16, shift)
        real = ~layout.mask.reshape(-1) if layout.mask is not None else torch.ones_like(layout.gather, dtype=torch.bool)
        assert sorted(layout.gather[real].tolist()) == list(range(sum(sizes)))  # no drop, no duplicate
        assert torch.equal(layout.gather[layout.slot], torch.arange(sum(sizes)))
        # patches never mix clouds
        cloud_of = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
        patches = layout.gather.view(-1, layout.patch_size)
        m = real.view(-1, layout.patch_size)
        for row, keep in zip(patches, m):
            assert len(set(cloud_of[row[keep]].tolist())) == 1


def test_cloud_output_does_not_depend_on_the_batch() -> None:
    torch.manual_seed(3)
    sizes = [90, 40]
    coord, offset, grid = cloud(sizes, seed=3)
    attn = SerializedAttention(8, 2, patch_size=32, shift_patch=True).eval()
    x = torch.randn(130, 8)
    both = attn(x, context(coord, offset, grid))
    o1 = sizes_to_offset([90])
    alone = attn(x[:90], context(coord[:90], o1, grid[:90]))
    torch.testing.assert_close(both[:90], alone, atol=1e-5, rtol=1e-5)


def test_cpe_matches_explicit_sum_with_padding() -> None:
    torch.manual_seed(4)
    n, k, c = 60, 6, 8
    coord = torch.rand(n, 3, dtype=torch.float64)
    idx, _ = knn(coord, None, k)
    idx[3, 2:] = -1
    idx[7, 1] = -1
    cpe = ConditionalPositionalEncoding(c).double()
    x = torch.randn(n, c, dtype=torch.float64)
    y = cpe(x, NeighborBasis.build(coord, idx, 0.1))
    h = torch.zeros(n, c, dtype=torch.float64)
    for i in range(n):
        js = [j for j in idx[i].tolist() if j >= 0]
        for j in js:
            r = (coord[j] - coord[i]) / 0.1
            phi = torch.cat([torch.ones(1, dtype=torch.float64), r, r.square().sum().view(1)])
            h[i] += (cpe.weight * phi[:, None]).sum(0) * x[j] / len(js)
    torch.testing.assert_close(y, cpe.norm(cpe.linear(h)))
    with pytest.raises(DataError, match="NeighborBasis"):
        cpe(x, None)


def test_gradcheck_serialized_block() -> None:
    torch.manual_seed(5)
    sizes = [7, 4]
    coord, offset, grid = cloud(sizes, seed=5, dtype=torch.float64)
    ctx = context(coord, offset, grid, k=3)
    block = PreNormBlock(
        4, SerializedAttention(4, 2, patch_size=3, shift_patch=True), mlp_ratio=1.0,
        pos_encoding=ConditionalPositionalEncoding(4),
    ).double()
    x = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: block(t, ctx), (x,))
    names = ["attn.attn.out.proj.weight", "pos_encoding.weight"]
    params = dict(block.named_parameters())
    assert torch.autograd.gradcheck(
        lambda w1, w2: torch.func.functional_call(block, dict(zip(names, (w1, w2))), (x.detach(), ctx)),
        tuple(params[n].detach().clone().requires_grad_(True) for n in names),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_patches_run_fused_sdpa_kernels() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(6)
    sizes = [512, 384]
    coord, offset, grid = cloud(sizes, seed=6)
    attn = SerializedAttention(64, 4, patch_size=128).eval()
    x = torch.randn(896, 64)
    ref = attn(x, context(coord, offset, grid))
    attn_c = attn.cuda().half()
    ctx = context(coord.cuda(), offset.cuda(), grid.cuda())
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # no padding here: flash must run
        y = attn_c(x.cuda().half(), ctx)
    torch.testing.assert_close(y.float().cpu(), ref, atol=2e-2, rtol=2e-2)
    sizes = [500, 300]  # padded last patches: the memory-efficient kernel takes the mask
    coord, offset, grid = cloud(sizes, seed=7)
    ctx = context(coord.cuda(), offset.cuda(), grid.cuda())
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        y = attn_c(torch.randn(800, 64, device="cuda", dtype=torch.half), ctx)
    assert y.shape == (800, 64) and bool(torch.isfinite(y).all())
