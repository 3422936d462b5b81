"""Neighbourhood attention over a kNN index: the Point Transformer (v1) form.

Points come packed (no padding): features ``x`` (N, C), coordinates ``pos`` (N, 3) and a
neighbour index ``idx`` (N, k) into the same N points, computed outside the layer (e.g.
by ``sciformer.geometry.knn``; the point itself is included by convention) so that all
layers of a stage share one index.

The (N, k, C) edge tensors are what runs whole scenes out of memory. With
``memory_efficient=True`` (default) they exist one chunk of points at a time, forward and
backward: the backward pass recomputes them from per-point tensors (custom autograd
functions in ``_neighborhood_fused`` and ``_neighborhood_ops``), and BatchNorm over all
N*k edges is folded into per-point tensors analytically (``_neighborhood_moments``,
``_neighborhood_position``, ``_neighborhood_norm``). On CPU
the chunks are spread over worker threads (``_neighborhood_parallel``), and a cloud stored
in a spatially scattered order whose per-point arrays outgrow the cache runs in Morton
order, its output put back in input order (``_neighborhood_order``).
``memory_efficient=False`` is the plain gather implementation, kept as a reference.
An index with -1 padding (the contract of :mod:`sciformer.attention.neighbor_index`)
takes a plain path over the valid edges only. The residual block around the layer is
:class:`~sciformer.attention.point_block.PointTransformerBlock`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call

from sciformer.attention._neighborhood_fused import VectorStage1, VectorStage2
from sciformer.attention._neighborhood_moments import edge_moments
from sciformer.attention._neighborhood_norm import batchnorm_fold, stats_dtype, uses_batch_stats
from sciformer.attention._neighborhood_ops import auto_chunk_size, chunked_edge_map
from sciformer.attention._neighborhood_order import gather_order, inverse_permutation, permute_rows
from sciformer.attention._neighborhood_position import position_hidden
from sciformer.attention.layers import norm_layer
from sciformer.attention.neighbor_index import (
    check_neighbor_index,
    check_points,
    has_padding,
    narrow_positions,
)
from sciformer.attention.positional import PositionMLP
from sciformer.errors import ConfigError, DataError

__all__ = ["PointTransformerLayer", "check_neighbor_index"]

_MODES = ("vector", "scalar")
_POSITION_ENCODINGS = ("mlp", "linear")
NORMS = ("batch", "layer")


class _VectorChunk:
    """Per-chunk vector attention with any per-edge weight MLP (generic recompute path)."""

    def __init__(self, attn: nn.Module, names: list[str], channels: int, groups: int) -> None:
        self.attn, self.names, self.c, self.g = attn, names, channels, groups

    def __call__(self, rows: list[Tensor], gathered: list[Tensor], params: list[Tensor]) -> Tensor:
        q, hid = rows  # (n, C), (n, k, d)
        (kv,) = gathered  # (n, k, 2C)
        wp, bp, *wparams = params
        n, k = hid.shape[:2]
        kg, vg = kv.split(self.c, dim=-1)  # (n, k, C) each
        delta = torch.matmul(hid, wp.t()) + bp  # (n, k, C)
        a = kg - q.unsqueeze(1) + delta  # (n, k, C)
        w = functional_call(self.attn, dict(zip(self.names, wparams)), (a.reshape(n * k, self.c),))
        p = torch.softmax(w.view(n, k, self.g), dim=1)  # (n, k, G)
        y = (vg + delta).view(n, k, self.c // self.g, self.g) * p.unsqueeze(2)  # (n, k, S, G)
        return y.sum(1).reshape(n, self.c)  # (n, C)


class _ScalarChunk:
    """Per-chunk multi-head scalar attention with a positional bias per head."""

    def __init__(self, channels: int, heads: int) -> None:
        self.c, self.h, self.dh = channels, heads, channels // heads
        self.scale = 1.0 / math.sqrt(self.dh)

    def __call__(self, rows: list[Tensor], gathered: list[Tensor], params: list[Tensor]) -> Tensor:
        q, hid = rows  # (n, C), (n, k, d)
        (kv,) = gathered  # (n, k, 2C)
        wb, bb = params  # (H, d), (H,)
        n, k = hid.shape[:2]
        kg, vg = kv.split(self.c, dim=-1)  # (n, k, C) each
        kh = kg.reshape(n, k, self.h, self.dh)  # (n, k, H, dh)
        qk = (q.view(n, 1, self.h, self.dh) * kh).sum(-1)  # (n, k, H)
        logits = qk * self.scale + torch.matmul(hid, wb.t()) + bb  # (n, k, H)
        p = torch.softmax(logits, dim=1)  # (n, k, H)
        y = p.unsqueeze(-1) * vg.reshape(n, k, self.h, self.dh)  # (n, k, H, dh)
        return y.sum(1).reshape(n, self.c)  # (n, C)


class PointTransformerLayer(nn.Module):
    r"""Self-attention over a neighbour index, vector (PTv1) or scalar multi-head form.

    With :math:`r_{ij} = p_j - p_i` for the k neighbours j of point i and
    :math:`q = W_q x`, :math:`k = W_k x`, :math:`v = W_v x` (with biases),

    .. math::
        \delta_{ij} = \phi(r_{ij}),\qquad
        w_{ij} = \gamma(k_j - q_i + \delta_{ij}),\qquad
        y_i = \sum_j \mathrm{softmax}_j(w_{ij}) \odot (v_j + \delta_{ij})

    ``mode="vector"`` (Point Transformer v1). :math:`\phi` is
    ``Linear(3,3)-Norm-ReLU-Linear(3,C)`` (``position_encoding="mlp"``) or ``Linear(3,C)``
    (``"linear"``). :math:`\gamma` (``attn_mlp="ptv1"``) is
    ``Norm(C)-ReLU-Linear(C,G)-Norm(G)-ReLU-Linear(G,G)`` with ``G = C / share_planes``
    weight channels; weight channel g applies to output channels ``{g + m G}``, i.e. each
    weight is shared by ``share_planes`` channels (``share_planes=1``: no grouping, G = C).
    ``attn_mlp=None`` is the identity (needs ``share_planes=1``); an ``nn.Module`` mapping
    (E, C) -> (E, G) is applied per edge. The softmax runs over the k neighbours per channel.
    Norm is BatchNorm1d over all N*k edges (``norm="batch"``, as PTv1) or LayerNorm.

    ``mode="scalar"``: H heads of width d = C/H, one weight per head,

    .. math::
        y_i^h = \sum_j \mathrm{softmax}_j\big(q_i^h \cdot k_j^h / \sqrt{d}
                + \beta^h(r_{ij})\big)\, v_j^h

    where :math:`\beta` is :math:`\phi` with H outputs (a positional bias per head).

    Parameter names follow PTv1 (``linear_q/k/v``, ``linear_p``, ``linear_w``), so the two
    paths (``memory_efficient`` True/False) share one state dict. With
    ``memory_efficient=True`` the (N, k, C) edge tensors exist one chunk of ``chunk_size``
    points at a time, forward and backward (recomputation); the forward never stores
    more than (N, k, G) per tensor. Custom ``attn_mlp`` modules then run twice per step
    (forward and recomputation) and see one chunk at a time, so they must not contain
    BatchNorm in training or dropout.

    Args:
        in_channels, out_channels: feature widths C_in, C (default C = C_in).
        mode: ``"vector"`` (PTv1) or ``"scalar"`` (multi-head dot product).
        share_planes: channels sharing one attention weight (vector mode), G = C / it.
        num_heads: heads of the scalar mode.
        position_encoding: ``"mlp"`` (PTv1) or ``"linear"``.
        norm: ``"batch"`` (PTv1) or ``"layer"``, in the position and weight MLPs.
        attn_mlp: ``"ptv1"``, None (identity) or a per-edge module (E, C) -> (E, G).
        memory_efficient: chunked, recomputing path (default) or plain gather reference.
        chunk_size: points per chunk; default about 2**20 edge values (k * C per point).

    Shapes:
        x: (N, in_channels); pos: (N, 3); idx: (N, k) int64 into [0, N), -1 = padding
        (masked; see :mod:`sciformer.attention.neighbor_index`) -> (N, out_channels)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        *,
        mode: str = "vector",
        share_planes: int = 8,
        num_heads: int = 4,
        position_encoding: str = "mlp",
        norm: str = "batch",
        attn_mlp: str | nn.Module | None = "ptv1",
        memory_efficient: bool = True,
        chunk_size: int | None = None,
    ) -> None:
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        for name, val in (("in_channels", in_channels), ("out_channels", out_channels)):
            if not isinstance(val, int) or val < 1:
                raise ConfigError(f"{name} must be a positive integer, got {val!r}")
        if mode not in _MODES:
            raise ConfigError(f"mode must be one of {_MODES}, got {mode!r}")
        if position_encoding not in _POSITION_ENCODINGS:
            raise ConfigError(
                f"position_encoding must be one of {_POSITION_ENCODINGS}, got {position_encoding!r}"
            )
        if norm not in NORMS:
            raise ConfigError(f"norm must be one of {NORMS}, got {norm!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ConfigError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        c = out_channels
        self.in_channels, self.out_channels = in_channels, c
        self.mode, self.position_encoding, self.norm = mode, position_encoding, norm
        self.memory_efficient, self.chunk_size = bool(memory_efficient), chunk_size
        if mode == "vector":
            if not isinstance(share_planes, int) or share_planes < 1 or c % share_planes:
                raise ConfigError(
                    f"share_planes must be a positive divisor of out_channels={c}, "
                    f"got {share_planes!r}"
                )
            groups, pos_out = c // share_planes, c
            self.num_heads = 0
        else:
            if not isinstance(num_heads, int) or num_heads < 1 or c % num_heads:
                raise ConfigError(
                    f"num_heads must be a positive divisor of out_channels={c}, got {num_heads!r}"
                )
            groups, pos_out, share_planes = num_heads, num_heads, 1
            self.num_heads = num_heads
        self.share_planes, self.groups = share_planes, groups

        self.linear_q = nn.Linear(in_channels, c)
        self.linear_k = nn.Linear(in_channels, c)
        self.linear_v = nn.Linear(in_channels, c)
        hidden_p = 3 if position_encoding == "mlp" else 0  # "linear": Linear(3, C) alone
        self.linear_p = PositionMLP(3, pos_out, hidden_dim=hidden_p, norm=norm)  # relative xyz

        self._builtin_attn = False
        if mode == "scalar":
            self.linear_w: nn.Module = nn.Identity()
        elif isinstance(attn_mlp, str):
            if attn_mlp != "ptv1":
                raise ConfigError(
                    f"attn_mlp must be 'ptv1', None or an nn.Module, got {attn_mlp!r}"
                )
            self.linear_w = nn.Sequential(
                norm_layer(norm, c),
                nn.ReLU(inplace=True),
                nn.Linear(c, groups),
                norm_layer(norm, groups),
                nn.ReLU(inplace=True),
                nn.Linear(groups, groups),
            )
            self._builtin_attn = True
        elif attn_mlp is None:
            if share_planes != 1:
                raise ConfigError(
                    "attn_mlp=None (identity) needs share_planes=1, "
                    f"got share_planes={share_planes}"
                )
            self.linear_w = nn.Identity()
        elif isinstance(attn_mlp, nn.Module):
            self.linear_w = attn_mlp
        else:
            raise ConfigError(
                f"attn_mlp must be 'ptv1', None or an nn.Module, got {type(attn_mlp).__name__}"
            )

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, mode={self.mode!r}, "
        if self.mode == "vector":
            s += f"share_planes={self.share_planes}, "
        else:
            s += f"num_heads={self.num_heads}, "
        return s + (
            f"position_encoding={self.position_encoding!r}, norm={self.norm!r}, "
            f"memory_efficient={self.memory_efficient}"
        )

    def _chunk(self, n: int, k: int) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        return auto_chunk_size(n, k, self.out_channels)

    def forward(self, x: Tensor, pos: Tensor, idx: Tensor) -> Tensor:
        check_points(x, pos, self.in_channels)
        idx = check_neighbor_index(idx, x.shape[0], x.shape[0], allow_padding=True)
        if idx.device != x.device:
            raise DataError(f"idx is on {idx.device} but x is on {x.device}; expected one device")
        padded = has_padding(idx)
        order = None
        if self.memory_efficient and not padded:
            order = gather_order(pos, idx, self.out_channels * x.element_size())
        if order is None:
            return self._attend(x, pos, idx, padded)
        inverse = inverse_permutation(order)  # (N,)
        idx_sorted = inverse[idx.index_select(0, order)]  # (N, k): the same graph, rows renumbered
        y = self._attend(permute_rows(x, order, inverse), permute_rows(pos, order, inverse), idx_sorted, False)
        return permute_rows(y, inverse, order)  # (N, C) in input order

    def _attend(self, x: Tensor, pos: Tensor, idx: Tensor, padded: bool) -> Tensor:
        """The layer on a checked input (``padded``: idx holds -1 entries)."""
        n, k = idx.shape
        pos = narrow_positions(pos, x.dtype)  # (N, 3)
        q, kk, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)  # (N, C) each
        if padded:
            return self._forward_padded(q, kk, v, pos, idx)
        proj: nn.Linear = self.linear_p[-1]
        if self.memory_efficient and self.position_encoding == "mlp" and self.norm == "batch":
            hidden = position_hidden(self.linear_p[0], self.linear_p[1], pos, idx)  # (N, k, d)
        else:
            rel = pos.index_select(0, idx.reshape(-1)) - pos.repeat_interleave(k, 0)  # (N*k, 3)
            hidden = self.linear_p[:-1](rel).view(n, k, -1)  # (N, k, d)
        if not self.memory_efficient:
            return self._forward_plain(q, kk, v, hidden, proj, idx)
        chunk = self._chunk(n, k)
        if self._builtin_attn and self.norm == "batch" and self.mode == "vector":
            return self._forward_fused_batchnorm(q, kk, v, hidden, proj, idx, chunk)
        kv = torch.cat([kk, v], dim=1)  # (N, 2C)
        if self.mode == "scalar":
            fn: Callable = _ScalarChunk(self.out_channels, self.num_heads)
            return chunked_edge_map(fn, idx, [q, hidden], [kv], [proj.weight, proj.bias], chunk)
        if self.training and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.linear_w.modules()
        ):
            raise ConfigError(
                "a custom attn_mlp with BatchNorm needs memory_efficient=False in training "
                "(its statistics must cover all edges); or use attn_mlp='ptv1'"
            )
        named = list(self.linear_w.named_parameters())
        names, params = [nm for nm, _ in named], [t for _, t in named]
        fn = _VectorChunk(self.linear_w, names, self.out_channels, self.groups)
        return chunked_edge_map(
            fn, idx, [q, hidden], [kv], [proj.weight, proj.bias, *params], chunk
        )

    def _forward_plain(
        self, q: Tensor, kk: Tensor, v: Tensor, hidden: Tensor, proj: nn.Linear, idx: Tensor
    ) -> Tensor:
        """Reference: gather every (N, k, C) tensor and apply the modules to them."""
        n, k = idx.shape
        c, g = self.out_channels, self.groups
        kg = kk[idx]  # (N, k, C)
        vg = v[idx]  # (N, k, C)
        if self.mode == "scalar":
            h, dh = self.num_heads, c // self.num_heads
            qk = (q.view(n, 1, h, dh) * kg.view(n, k, h, dh)).sum(-1) / math.sqrt(dh)  # (N, k, H)
            p = torch.softmax(qk + proj(hidden), dim=1)  # (N, k, H)
            return (p.unsqueeze(-1) * vg.view(n, k, h, dh)).sum(1).reshape(n, c)
        delta = proj(hidden)  # (N, k, C)
        a = kg - q.unsqueeze(1) + delta  # (N, k, C)
        w = self.linear_w(a.reshape(n * k, c)).view(n, k, g)  # (N, k, G)
        p = torch.softmax(w, dim=1)  # (N, k, G)
        y = (vg + delta).view(n, k, c // g, g) * p.unsqueeze(2)  # (N, k, S, G)
        return y.sum(1).reshape(n, c)  # (N, C)

    def _forward_fused_batchnorm(
        self,
        q: Tensor,
        kk: Tensor,
        v: Tensor,
        hidden: Tensor,
        proj: nn.Linear,
        idx: Tensor,
        chunk: int,
    ) -> Tensor:
        """PTv1 weight MLP with both BatchNorms handled globally, two fused stages."""
        n, k = idx.shape
        w = self.linear_w
        bn1, lin1, bn2, lin2 = w[0], w[2], w[3], w[5]
        wp, bp = proj.weight, proj.bias  # (C, d), (C,)
        sdt = stats_dtype(q.device)
        mean1 = var1 = None
        if uses_batch_stats(bn1):
            mean1, var1 = edge_moments(kk, q, hidden, wp, bp, idx)  # (C,) each
        s1, t1 = batchnorm_fold(bn1, mean1, var1, n * k, q.dtype)  # (C,) each
        a_src = kk * s1  # (N, C)
        b_dst = q * s1 - (s1 * bp + t1)  # (N, C)
        wa = wp * s1.unsqueeze(1)  # (C, d)
        need2 = uses_batch_stats(bn2)
        u, mean2, var2 = VectorStage1.apply(
            idx, chunk, sdt if need2 else None, a_src, b_dst, hidden, wa, lin1.weight
        )  # (N, k, G) without lin1's bias, (G,), (G,)
        b1 = lin1.bias  # (G,)
        s2, t2 = batchnorm_fold(bn2, mean2 + b1, var2, n * k, q.dtype)  # (G,) each
        t2 = t2 + s2 * b1  # BatchNorm of (u + b1) as an affine map of u
        keep = torch.is_grad_enabled() and any(
            t.requires_grad for t in (u, s2, t2, lin2.weight, v, hidden, wp, bp)
        )
        return VectorStage2.apply(
            idx, chunk, keep, u, s2, t2, lin2.weight, lin2.bias, v, hidden, wp, bp
        )  # (N, C)

    def _forward_padded(self, q: Tensor, kk: Tensor, v: Tensor, pos: Tensor, idx: Tensor) -> Tensor:
        """Neighbour index with -1 padding: gather the valid edges only (plain path).

        Padded edges get no attention weight and enter no BatchNorm statistic (the MLPs
        run on the (E, .) rows of the E valid edges); a point without a valid neighbour
        outputs zeros, as in :class:`~sciformer.attention.grouped.GroupedVectorAttention`.
        """
        n, k = idx.shape
        c, g = self.out_channels, self.groups
        valid = idx >= 0  # (N, k)
        rows = torch.arange(n, device=idx.device).unsqueeze(1).expand(n, k)[valid]  # (E,) query of each edge
        cols = idx[valid]  # (E,) source of each edge
        delta = self.linear_p(pos[cols] - pos[rows])  # (E, C or H)
        if self.mode == "scalar":
            h, dh = self.num_heads, c // self.num_heads
            qk = (q[rows].view(-1, h, dh) * kk[cols].view(-1, h, dh)).sum(-1) / math.sqrt(dh)  # (E, H)
            w, value = qk + delta, v[cols]  # (E, H), (E, C)
        else:
            w = self.linear_w(kk[cols] - q[rows] + delta)  # (E, G)
            value = v[cols] + delta  # (E, C)
        logits = w.new_full((n, k, w.shape[1]), float("-inf"))
        logits[valid] = w
        p = torch.softmax(logits, dim=1).nan_to_num(0.0)  # (N, k, G|H); no valid neighbour -> 0
        full = value.new_zeros((n, k, c))
        full[valid] = value
        if self.mode == "scalar":
            return (p.unsqueeze(-1) * full.view(n, k, self.num_heads, -1)).sum(1).reshape(n, c)  # (N, C)
        return (full.view(n, k, c // g, g) * p.unsqueeze(2)).sum(1).reshape(n, c)  # (N, C)
