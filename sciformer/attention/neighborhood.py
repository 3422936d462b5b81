"""Neighbourhood attention over a kNN index: the Point Transformer (v1) form.

Points come packed (no padding): features ``x`` (N, C), coordinates ``pos`` (N, 3) and a
neighbour index ``idx`` (N, k) into the same N points, computed outside the layer (e.g.
by ``sciformer.geometry.knn``; the point itself is included by convention) so that all
layers of a stage share one index.

The (N, k, C) edge tensors are what runs whole scenes out of memory. With
``memory_efficient=True`` (default) they exist one chunk of points at a time, forward and
backward: the backward pass recomputes them from per-point tensors (custom autograd
functions in ``_neighborhood_fused`` and ``_neighborhood_ops``), and BatchNorm over all
N*k edges is folded into per-point tensors analytically (``_neighborhood_norm``). On CPU
the chunks are spread over worker threads (``_neighborhood_parallel``).
``memory_efficient=False`` is the plain gather implementation, kept as a reference.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call

from sciformer.attention._neighborhood_fused import VectorStage1, VectorStage2
from sciformer.attention._neighborhood_norm import (
    NeighborGraph,
    batchnorm_fold,
    edge_moments,
    linear_batchnorm,
    stats_dtype,
    uses_batch_stats,
)
from sciformer.attention._neighborhood_ops import auto_chunk_size, chunked_edge_map
from sciformer.attention.blocks import DropPath
from sciformer.errors import ConfigError, DataError

__all__ = ["PointTransformerLayer", "PointTransformerBlock", "check_neighbor_index"]

_MODES = ("vector", "scalar")
_POSITION_ENCODINGS = ("mlp", "linear")
_NORMS = ("batch", "layer")


def _norm(kind: str, channels: int) -> nn.Module:
    return nn.BatchNorm1d(channels) if kind == "batch" else nn.LayerNorm(channels)


def check_neighbor_index(
    idx: Tensor, num_queries: int, num_sources: int, name: str = "idx", *, allow_padding: bool = False
) -> Tensor:
    """Validate a neighbour index and return it as a contiguous int64 tensor.

    Raises :class:`~sciformer.errors.DataError` (one line) unless ``idx`` is an integer
    tensor of shape (num_queries, k), k >= 1, with values in [0, num_sources) (or -1,
    padding, with ``allow_padding``).

    Shapes:
        idx: (N, k) -> (N, k) int64
    """
    if not isinstance(idx, Tensor):
        raise DataError(f"{name} must be a torch.Tensor of shape (N, k), got {type(idx).__name__}")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise DataError(f"{name} must be an integer tensor (int64), got dtype {idx.dtype}")
    if idx.ndim != 2 or idx.shape[0] != num_queries or idx.shape[1] < 1:
        raise DataError(
            f"{name} must have shape (N={num_queries}, k>=1), got {tuple(idx.shape)}"
        )
    if idx.numel() > 0:
        lo_t, hi_t = torch.aminmax(idx)
        lo, hi = int(lo_t), int(hi_t)
        low = -1 if allow_padding else 0
        if lo < low or hi >= num_sources:
            padding = " (-1 = padding)" if allow_padding else ""
            raise DataError(
                f"{name} values must lie in [{low}, {num_sources}){padding}, got min {lo} and max {hi}"
            )
    return idx.to(torch.long).contiguous()


def _check_points(x: Tensor, pos: Tensor, in_channels: int) -> None:
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != in_channels:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise DataError(f"x must have shape (N, in_channels={in_channels}), got {shape}")
    if x.shape[0] == 0:
        raise DataError("x must contain at least one point, got 0 rows")
    if not x.dtype.is_floating_point:
        raise DataError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if not isinstance(pos, Tensor) or pos.ndim != 2 or pos.shape != (x.shape[0], 3):
        shape = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
        raise DataError(f"pos must have shape (N={x.shape[0]}, 3), got {shape}")
    if pos.device != x.device:
        raise DataError(f"pos is on {pos.device} but x is on {x.device}; expected one device")


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
        x: (N, in_channels); pos: (N, 3); idx: (N, k) int64 into [0, N)
        -> (N, out_channels)
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
        if norm not in _NORMS:
            raise ConfigError(f"norm must be one of {_NORMS}, got {norm!r}")
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
        if position_encoding == "mlp":
            self.linear_p = nn.Sequential(
                nn.Linear(3, 3), _norm(norm, 3), nn.ReLU(inplace=True), nn.Linear(3, pos_out)
            )
        else:
            self.linear_p = nn.Sequential(nn.Linear(3, pos_out))

        self._builtin_attn = False
        if mode == "scalar":
            self.linear_w: nn.Module = nn.Identity()
        elif isinstance(attn_mlp, str):
            if attn_mlp != "ptv1":
                raise ConfigError(
                    f"attn_mlp must be 'ptv1', None or an nn.Module, got {attn_mlp!r}"
                )
            self.linear_w = nn.Sequential(
                _norm(norm, c),
                nn.ReLU(inplace=True),
                nn.Linear(c, groups),
                _norm(norm, groups),
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
        _check_points(x, pos, self.in_channels)
        idx = check_neighbor_index(idx, x.shape[0], x.shape[0])
        if idx.device != x.device:
            raise DataError(f"idx is on {idx.device} but x is on {x.device}; expected one device")
        n, k = idx.shape
        pos = pos.to(x.dtype)
        q, kk, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)  # (N, C) each
        rel = pos.index_select(0, idx.reshape(-1)) - pos.repeat_interleave(k, 0)  # (N*k, 3)
        proj: nn.Linear = self.linear_p[-1]
        if not self.memory_efficient:
            hidden = self.linear_p[:-1](rel).view(n, k, -1)  # (N, k, d)
            return self._forward_plain(q, kk, v, hidden, proj, idx)
        if self.position_encoding == "mlp" and self.norm == "batch":
            lin_p, bn_p = self.linear_p[0], self.linear_p[1]
            hidden = linear_batchnorm(lin_p, bn_p, rel).relu_().view(n, k, -1)  # (N, k, d)
        else:
            hidden = self.linear_p[:-1](rel).view(n, k, -1)  # (N, k, d)
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
            graph = NeighborGraph.build(idx, n, q.dtype)
            mean1, var1 = edge_moments(kk, q, hidden, wp, bp, idx, graph)  # (C,) each
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


class PointTransformerBlock(nn.Module):
    r"""Point Transformer v1 residual block around a :class:`PointTransformerLayer`.

    .. math::
        h = \mathrm{ReLU}(\mathrm{N}_1(W_1 x)),\quad
        h = \mathrm{ReLU}(\mathrm{N}_2(\mathrm{PTL}(h, p, \mathrm{idx}))),\quad
        y = \mathrm{ReLU}(x + \mathrm{DropPath}(\mathrm{N}_3(W_3 h)))

    with bias-free linears and BatchNorm (or LayerNorm) N_1..N_3. Names follow PTv1
    (``linear1, bn1, transformer2, bn2, linear3, bn3``). ``attention="ptv1"`` makes PTL a
    :class:`PointTransformerLayer` (``layer_kwargs``: ``share_planes``, ``mode``,
    ``memory_efficient``, ...); ``"ptv2"`` a
    :class:`~sciformer.attention.grouped.GroupedVectorAttention` with
    ``channels / share_planes`` groups (``layer_kwargs``: ``share_planes``,
    ``pe_multiplier``, ``pe_bias``, ``attn_drop``, ``chunk_size``), the PTv2 block. The
    neighbour index is computed outside, once per stage, and shared by the stage's blocks.

    Shapes:
        x: (N, channels); pos: (N, 3); idx: (N, k) -> (N, channels)
    """

    def __init__(
        self, channels: int, *, norm: str = "batch", drop_path: float = 0.0, attention: str = "ptv1", **layer_kwargs: object
    ) -> None:
        super().__init__()
        if norm not in _NORMS:
            raise ConfigError(f"norm must be one of {_NORMS}, got {norm!r}")
        self.linear1 = nn.Linear(channels, channels, bias=False)
        self.bn1 = _norm(norm, channels)
        self.transformer2: nn.Module
        if attention == "ptv1":
            self.transformer2 = PointTransformerLayer(channels, channels, norm=norm, **layer_kwargs)  # type: ignore[arg-type]
        elif attention == "ptv2":
            from sciformer.attention.grouped import GroupedVectorAttention

            share_planes = int(layer_kwargs.pop("share_planes", 8))  # type: ignore[call-overload]
            if share_planes < 1 or channels % share_planes:
                raise ConfigError(f"share_planes must be a positive divisor of channels={channels}, got {share_planes}")
            self.transformer2 = GroupedVectorAttention(channels, channels // share_planes, norm=norm, **layer_kwargs)  # type: ignore[arg-type]
        else:
            raise ConfigError(f"attention must be 'ptv1' or 'ptv2', got {attention!r}")
        self.bn2 = _norm(norm, channels)
        self.linear3 = nn.Linear(channels, channels, bias=False)
        self.bn3 = _norm(norm, channels)
        self.relu = nn.ReLU(inplace=True)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, pos: Tensor, idx: Tensor) -> Tensor:
        identity = x  # (N, C)
        h = self.relu(self.bn1(self.linear1(x)))  # (N, C)
        h = self.relu(self.bn2(self.transformer2(h, pos, idx)))  # (N, C)
        h = self.bn3(self.linear3(h))  # (N, C)
        return self.relu(identity + self.drop_path(h))
