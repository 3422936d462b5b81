"""Serialized attention: dense attention inside patches of a serialized point cloud (PTv3).

Point Transformer V3 (Wu et al., CVPR 2024) sorts the points of each cloud along a
space-filling curve (:mod:`sciformer.geometry.serialization`), cuts the sorted sequence
into patches of ``S`` points and runs plain multi-head dot-product attention inside each
patch: the very :class:`~sciformer.attention.dense.MultiHeadAttention` of the band
sequences, so on CUDA the patches go through SDPA's fused kernels unchanged.

Patches never mix clouds. The last patch of a cloud is padded and the padding is *masked*
(``key_padding_mask``): no point is dropped, none is duplicated into the output, and a
real point's output does not depend on the padding. Patches interact across blocks by
changing the order (shift order, shuffled orders) and, optionally, by shifting the patch
grid by ``S / 2`` (shift patch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sciformer.attention.dense import MultiHeadAttention, build_attention_bias, merge_heads
from sciformer.attention.positional import NeighborBasis
from sciformer.errors import ConfigError, DataError

__all__ = ["PatchLayout", "SerializedAttention", "SerializedContext"]


@dataclass
class PatchLayout:
    """Where every point of a packed batch sits in the (P, S) patches of one order.

    ``gather`` lists, patch by patch, the point in each slot (padding slots hold 0 and are
    masked); ``slot`` is the slot of every point, so ``y.reshape(P * S, C)[slot]`` brings
    the patch outputs back to the input order, each point exactly once.

    Shapes:
        gather: (P * S,) int64; slot: (N,) int64; mask: (P, S) bool, True = padding, or
        None when no slot is padded
    """

    gather: Tensor
    slot: Tensor
    mask: Tensor | None
    patch_size: int
    _bias: dict[torch.dtype, Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, order: Tensor, offset: Tensor, patch_size: int, shift: bool = False) -> PatchLayout:
        """Cut each cloud's serialized points into patches of ``S = min(patch_size, largest cloud)``.

        A cloud of ``n <= S`` points is one patch. With ``shift`` the patch grid of a
        cloud with more points than ``patch_size`` starts ``S // 2`` slots late (its
        first patch is padded at the front). Neither rule depends on the other clouds of
        the batch, so a cloud's patches are the same in any batch.

        Shapes:
            order: (N,) permutation, cloud by cloud (``serialization_order``); offset: (B,)
        """
        if patch_size < 1:
            raise ConfigError(f"patch_size: expected a positive integer, got {patch_size}")
        offset = offset.to(order.device)
        sizes = torch.diff(offset, prepend=offset.new_zeros(1))  # (B,) points per cloud
        n = order.shape[0]
        if int(sizes.sum()) != n:
            raise DataError(f"order: expected {int(sizes.sum())} points (offset), got {n}")
        s = min(patch_size, int(sizes.max()))
        lead = torch.where(sizes > patch_size, s // 2 if shift else 0, 0)  # (B,) padding slots in front
        patches = torch.div(sizes + lead + s - 1, s, rounding_mode="floor")  # (B,)
        base = (torch.cumsum(patches, 0) - patches) * s + lead  # (B,) slot of each cloud's first point
        start = torch.cumsum(sizes, 0) - sizes  # (B,)
        cloud = torch.repeat_interleave(torch.arange(sizes.numel(), device=order.device), sizes)  # (N,)
        rank = torch.arange(n, device=order.device) - start[cloud]  # (N,) rank along the curve
        pos = base[cloud] + rank  # (N,) slot of the r-th serialized point
        total = int(patches.sum()) * s
        gather = torch.zeros(total, dtype=torch.int64, device=order.device)
        gather[pos] = order
        slot = torch.empty_like(pos)
        slot[order] = pos  # (N,) slot of every point
        padded = torch.ones(total, dtype=torch.bool, device=order.device)
        padded[pos] = False
        mask = padded.view(-1, s) if bool(padded.any()) else None
        return cls(gather=gather, slot=slot, mask=mask, patch_size=s)

    def attn_mask(self, dtype: torch.dtype) -> Tensor | None:
        """The additive SDPA mask of the padding (-inf on padded keys), built once per dtype.

        Shapes:
            -> (P, 1, 1, S) or None when no slot is padded
        """
        if self.mask is None:
            return None
        if dtype not in self._bias:
            p, s = self.mask.shape
            self._bias[dtype] = build_attention_bias(None, self.mask, p, s, dtype)
        return self._bias[dtype]

    @property
    def num_patches(self) -> int:
        return self.gather.numel() // self.patch_size


@dataclass
class SerializedContext:
    """The serialization of one stage, shared by its blocks (patch layouts built lazily).

    ``orders[i]`` is the permutation of serialization order ``i``; block ``b`` uses order
    ``b mod len(orders)`` (shift order). ``basis`` is the stage's kNN basis for the
    conditional positional encoding.
    """

    orders: Sequence[Tensor]
    offset: Tensor
    basis: NeighborBasis | None = None
    _cache: dict[tuple[int, int, bool], PatchLayout] = field(default_factory=dict, repr=False)

    def layout(self, index: int, patch_size: int, shift: bool = False) -> PatchLayout:
        key = (index % len(self.orders), patch_size, shift)
        if key not in self._cache:
            self._cache[key] = PatchLayout.build(self.orders[key[0]], self.offset, patch_size, shift)
        return self._cache[key]


class SerializedAttention(nn.Module):
    """Multi-head attention inside the serialized patches of a packed point cloud.

    For the layout of order ``order_index`` (``context.layout``)::

        X_p = x[gather].view(P, S, C)                       # patches, padding masked
        Y_p = MultiHeadAttention(X_p, key_padding_mask)     # dense attention per patch
        y   = Y_p.view(P * S, C)[slot]                      # back to input order

    With one patch covering a cloud this is full dense attention over the cloud. The
    computation is that one, reordered: the attention's Q/K/V and output projections are
    row-wise, so they run on the N points (before the gather into patches and after the
    gather back) instead of on the P * S slots, padding included; only
    ``scaled_dot_product_attention`` runs on the patches.

    Args:
        dim: channels C; num_heads: heads (divide C); patch_size: S.
        order_index: which of the context's orders this block uses.
        shift_patch: shift the patch grid by S / 2 (PTv3's shift patch interaction).
        qkv_bias, attn_drop, proj_drop: as :class:`~sciformer.attention.dense.MultiHeadAttention`.

    Shapes:
        x: (N, C); context: :class:`SerializedContext` over the N points -> (N, C)
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        patch_size: int,
        *,
        order_index: int = 0,
        shift_patch: bool = False,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if patch_size < 1:
            raise ConfigError(f"patch_size: expected a positive integer, got {patch_size}")
        self.patch_size, self.order_index, self.shift_patch = patch_size, order_index, shift_patch
        self.attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)

    def forward(self, x: Tensor, context: SerializedContext) -> Tensor:
        if x.ndim != 2 or x.shape[1] != self.attn.dim:
            raise DataError(f"x: expected shape (N, {self.attn.dim}), got {tuple(x.shape)}")
        layout = context.layout(self.order_index, self.patch_size, self.shift_patch)
        if layout.slot.shape[0] != x.shape[0]:
            raise DataError(f"x: expected {layout.slot.shape[0]} points (the context's), got {x.shape[0]}")
        mha, s, c = self.attn, layout.patch_size, x.shape[1]
        # the projections run on the N points, not on the P * S slots (padding included)
        qkv = mha.qkv.qkv(x).index_select(0, layout.gather)  # (P S, 3C): [q | k | v], heads inside
        q, k, v = qkv.view(-1, s, 3, mha.num_heads, mha.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # each (P, H, S, d)
        mask = layout.attn_mask(q.dtype)  # (P, 1, 1, S) float, -inf on padding keys, or None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=mha.attn_drop if self.training else 0.0)  # (P, H, S, d)
        y = merge_heads(y).reshape(-1, c).index_select(0, layout.slot)  # (N, C) back to input order
        return mha.out(y)  # (N, C)

    def extra_repr(self) -> str:
        return f"patch_size={self.patch_size}, order_index={self.order_index}, shift_patch={self.shift_patch}"
