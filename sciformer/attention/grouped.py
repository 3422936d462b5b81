"""Grouped vector attention over a neighbour index: the Point Transformer v2 form.

Wu et al., "Point Transformer V2: Grouped Vector Attention and Partition-based Pooling"
(NeurIPS 2022). Compared with the v1 layer (:mod:`sciformer.attention.neighborhood`):
queries and keys pass through Linear-Norm-ReLU, the relative position may also multiply
the query-key relation (``pe_multiplier``), the weight encoding has no leading
Norm-ReLU, and each of the G attention weights drives one contiguous block of C/G
channels. Neighbour entries of -1 (padding) are masked.

Memory: training materialises the (N, k, C) edge tensors once per tensor, as the
reference implementation does (BatchNorm over all N*k edges needs them together). In
evaluation (no gradient) edges exist one chunk of query points at a time, which is exact
because BatchNorm then applies its running statistics, so whole scenes can be predicted
in bounded memory. For training on large scenes the v1 layer's recomputing path is the
memory-bounded choice.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sciformer.attention.layers import EdgeMLP, norm_layer
from sciformer.attention.neighbor_index import check_neighbor_index, narrow_positions
from sciformer.attention.positional import PositionMLP
from sciformer.errors import ConfigError, DataError

__all__ = ["GroupedVectorAttention"]

_NORMS = ("batch", "layer")


class GroupedVectorAttention(nn.Module):
    r"""Grouped vector self-attention over a neighbour index (Point Transformer v2).

    In evaluation mode the edges are built one chunk of query points at a time (see the
    module docstring); training builds them at once.

    With :math:`r_{ij} = p_j - p_i` for the k neighbours j of point i,

    .. math::
        q_i = \mathrm{ReLU}(\mathrm{N}(W_q x_i)),\quad k_j = \mathrm{ReLU}(\mathrm{N}(W_k x_j)),\quad v_j = W_v x_j

        \rho_{ij} = (k_j - q_i) \odot \mu(r_{ij}) + \beta(r_{ij}),\qquad
        w_{ij} = \omega(\rho_{ij}) \in \mathbb{R}^G

        y_i^{(g)} = \sum_j \mathrm{softmax}_j(w_{ij})_g \, \big(v_j + \beta(r_{ij})\big)^{(g)}

    where :math:`\mu` (``pe_multiplier``) and :math:`\beta` (``pe_bias``) are
    ``Linear(3,C)-Norm-ReLU-Linear(C,C)`` (each term dropped when disabled), :math:`\omega`
    is ``Linear(C,G)-Norm-ReLU-Linear(G,G)`` and :math:`(\cdot)^{(g)}` is the g-th block
    of C/G contiguous channels. Padding neighbours (index -1) get zero weight and enter no
    BatchNorm statistic; a point with no valid neighbour outputs zeros. Norm is BatchNorm1d over points or over all
    N*k edges (``norm="batch"``, as PTv2) or LayerNorm. ``attn_drop`` is dropout on the
    attention weights in training.

    Args:
        channels: feature width C (input and output).
        groups: attention weights per edge G (divides C).
        pe_multiplier, pe_bias: the two relative-position terms (PTv2 defaults: False, True).
        attn_drop: dropout rate on the attention weights.
        qkv_bias: biases of the Q/K/V projections.
        norm: ``"batch"`` or ``"layer"``.
        chunk_size: query points per chunk in evaluation; default about 2**20 edge values.

    Shapes:
        x: (N, C); pos: (N, 3); idx: (N, k) int64 into [0, N) or -1 -> (N, C)
    """

    def __init__(
        self,
        channels: int,
        groups: int,
        *,
        pe_multiplier: bool = False,
        pe_bias: bool = True,
        attn_drop: float = 0.0,
        qkv_bias: bool = True,
        norm: str = "batch",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ConfigError(f"channels must be a positive integer, got {channels!r}")
        if not isinstance(groups, int) or groups < 1 or channels % groups:
            raise ConfigError(f"groups must be a positive divisor of channels={channels}, got {groups!r}")
        if norm not in _NORMS:
            raise ConfigError(f"norm must be one of {_NORMS}, got {norm!r}")
        if not 0.0 <= attn_drop < 1.0:
            raise ConfigError(f"attn_drop must be in [0, 1), got {attn_drop!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ConfigError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        self.channels, self.groups, self.chunk_size = channels, groups, chunk_size
        self.linear_q = nn.Sequential(nn.Linear(channels, channels, bias=qkv_bias), norm_layer(norm, channels), nn.ReLU(inplace=True))
        self.linear_k = nn.Sequential(nn.Linear(channels, channels, bias=qkv_bias), norm_layer(norm, channels), nn.ReLU(inplace=True))
        self.linear_v = nn.Linear(channels, channels, bias=qkv_bias)
        self.linear_p_multiplier = PositionMLP(3, channels, channels, norm) if pe_multiplier else None  # relative xyz
        self.linear_p_bias = PositionMLP(3, channels, channels, norm) if pe_bias else None
        self.weight_encoding = EdgeMLP(channels, groups, groups, norm)
        self.attn_drop = nn.Dropout(attn_drop)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, rows: Tensor, idx: Tensor) -> Tensor:
        """Outputs of query points ``rows`` with neighbours ``idx`` (n, k)."""
        n, kk = idx.shape
        valid = idx >= 0  # (n, k)
        if not bool(valid.all()):
            return self._attend_padded(q, k, v, pos, rows, idx, valid)
        safe = idx.clamp(min=0)  # (n, k)
        rel = pos[safe] - pos[rows].unsqueeze(1)  # (n, k, 3)
        relation = k[safe] - q[rows].unsqueeze(1)  # (n, k, C)
        value = v[safe]  # (n, k, C)
        if self.linear_p_multiplier is not None:
            relation = relation * self.linear_p_multiplier(rel)  # (n, k, C)
        if self.linear_p_bias is not None:
            bias = self.linear_p_bias(rel)  # (n, k, C)
            relation = relation + bias
            value = value + bias
        logits = self.weight_encoding(relation)  # (n, k, G)
        logits = logits.masked_fill(~valid.unsqueeze(-1), float("-inf"))
        weight = logits.softmax(dim=1).nan_to_num(0.0)  # (n, k, G); rows without a valid neighbour -> 0
        weight = self.attn_drop(weight)
        value = value.view(n, kk, self.groups, self.channels // self.groups)  # (n, k, G, C/G)
        return (value * weight.unsqueeze(-1)).sum(dim=1).reshape(n, self.channels)  # (n, C)

    def _attend_padded(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, rows: Tensor, idx: Tensor, valid: Tensor) -> Tensor:
        """:meth:`_attend` on the valid edges only: padding enters no BatchNorm statistic."""
        n, kk = idx.shape
        dst = rows.unsqueeze(1).expand(n, kk)[valid]  # (E,) query of each valid edge
        src = idx[valid]  # (E,) its source
        rel = pos[src] - pos[dst]  # (E, 3)
        relation = k[src] - q[dst]  # (E, C)
        value = v[src]  # (E, C)
        if self.linear_p_multiplier is not None:
            relation = relation * self.linear_p_multiplier(rel)
        if self.linear_p_bias is not None:
            bias = self.linear_p_bias(rel)  # (E, C)
            relation = relation + bias
            value = value + bias
        w = self.weight_encoding(relation)  # (E, G)
        logits = w.new_full((n, kk, self.groups), float("-inf"))
        logits[valid] = w
        weight = self.attn_drop(logits.softmax(dim=1).nan_to_num(0.0))  # (n, k, G)
        full = value.new_zeros((n, kk, self.channels))
        full[valid] = value
        full = full.view(n, kk, self.groups, self.channels // self.groups)  # (n, k, G, C/G)
        return (full * weight.unsqueeze(-1)).sum(dim=1).reshape(n, self.channels)  # (n, C)

    def forward(self, x: Tensor, pos: Tensor, idx: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != self.channels or x.shape[0] == 0:
            raise DataError(f"x must have shape (N>0, channels={self.channels}), got {tuple(getattr(x, 'shape', ()))}")
        if not isinstance(pos, Tensor) or pos.shape != (x.shape[0], 3):
            raise DataError(f"pos must have shape (N={x.shape[0]}, 3), got {tuple(getattr(pos, 'shape', ()))}")
        idx = check_neighbor_index(idx, x.shape[0], x.shape[0], allow_padding=True)
        pos = narrow_positions(pos, x.dtype)  # (N, 3)
        q, k, v = self.linear_q(x), self.linear_k(x), self.linear_v(x)  # (N, C) each
        rows = torch.arange(x.shape[0], device=x.device)  # (N,)
        if self.training:  # BatchNorm statistics over all edges at once
            return self._attend(q, k, v, pos, rows, idx)  # (N, C)
        step = self.chunk_size or max(1, (1 << 20) // (idx.shape[1] * self.channels))
        parts = [self._attend(q, k, v, pos, rows[s : s + step], idx[s : s + step]) for s in range(0, len(rows), step)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)  # (N, C)
