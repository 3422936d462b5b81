"""Positional encodings, all behind one interface (:class:`PositionalEncoding`).

Everything here is computed from the positions themselves (band index, wavelength in
nm, pixel offsets, 3D offsets), never from a table sized by the sequence length, so a
model works for any number of tokens. Each encoding declares what it produces
(``PositionalEncoding.kind``):

- ``"absolute"``: :func:`sinusoidal_encoding` / :class:`SinusoidalPositionalEncoding`,
  parameter-free encoding (Vaswani et al. 2017) of 1D or k-D continuous positions (band
  index or wavelength), added to the tokens;
- ``"relative"``: :class:`PositionMLP`, an MLP on position offsets (Point Transformer's
  ``Linear-BN-ReLU-Linear`` on relative xyz ``p_j - p_i``), used inside the
  neighbourhood attention of PTv1 and PTv2;
- ``"bias"``: :class:`RelativePositionBias`, per-head additive attention bias from
  position differences ``p_i - p_j`` (continuous relative position bias, Swin-v2 style);
- ``"conditional"``: :class:`ConditionalPositionalEncoding`, a residual computed from the
  features and their spatial neighbourhood (PTv3's conditional encoding without spconv).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from sciformer.attention._neighborhood_ops import AdjacencyMatmul
from sciformer.attention.layers import EdgeMLP, NormKind
from sciformer.errors import ConfigError, DataError


class PositionalEncoding(nn.Module):
    """Base class of every positional encoding of the attention core.

    ``kind`` says what ``forward`` returns: ``"absolute"`` (features to add to the tokens
    from positions), ``"relative"`` (features from position offsets), ``"bias"`` (an
    additive attention bias from positions) or ``"conditional"`` (a residual from the
    features and their neighbourhood).

    Shapes:
        see each subclass; every output ends with the channel (or head) dimension.
    """

    kind: ClassVar[str] = ""


def sinusoidal_encoding(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Sinusoidal encoding of continuous scalar positions.

    ``PE(p)[2i] = sin(p * w_i)``, ``PE(p)[2i + 1] = cos(p * w_i)``, ``w_i = base^(-2i / dim)``.

    Shapes:
        positions: (...) -> (..., dim); ``dim`` even.
    """
    if dim <= 0 or dim % 2 != 0:
        raise ConfigError(f"dim: expected a positive even integer, got {dim}")
    dtype = positions.dtype if positions.is_floating_point() else torch.float32
    i = torch.arange(dim // 2, device=positions.device, dtype=dtype)  # (dim/2,)
    freq = torch.exp(-math.log(base) * 2.0 * i / dim)  # (dim/2,)
    angle = positions.to(dtype)[..., None] * freq  # (..., dim/2)
    pe = torch.stack((angle.sin(), angle.cos()), dim=-1)  # (..., dim/2, 2)
    return pe.flatten(-2)  # (..., dim) interleaved sin, cos


class SinusoidalPositionalEncoding(PositionalEncoding):
    """Parameter-free sinusoidal encoding of 1D or k-D continuous positions.

    A position ``p`` (band index, wavelength in nm, ...) is first multiplied by ``scale``.
    For k-D positions each coordinate gets ``dim / k`` channels of
    :func:`sinusoidal_encoding` and the parts are concatenated.

    Shapes:
        positions: (..., L) with ``pos_dim == 1``, or (..., L, k) with ``pos_dim == k``
        output: (..., L, dim)
    """

    kind = "absolute"

    def __init__(self, dim: int, pos_dim: int = 1, base: float = 10000.0, scale: float = 1.0) -> None:
        super().__init__()
        if pos_dim <= 0 or dim <= 0 or dim % (2 * pos_dim) != 0:
            raise ConfigError(f"dim: expected a positive multiple of 2 * pos_dim = {2 * pos_dim}, got {dim}")
        self.dim = dim
        self.pos_dim = pos_dim
        self.base = float(base)
        self.scale = float(scale)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        p = positions * self.scale
        if self.pos_dim == 1:
            return sinusoidal_encoding(p, self.dim, self.base)  # (..., L, dim)
        if p.shape[-1] != self.pos_dim:
            raise DataError(f"positions: expected last dimension {self.pos_dim}, got {tuple(p.shape)}")
        parts = [sinusoidal_encoding(p[..., c], self.dim // self.pos_dim, self.base) for c in range(self.pos_dim)]
        return torch.cat(parts, dim=-1)  # (..., L, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, pos_dim={self.pos_dim}, base={self.base}, scale={self.scale}"


class PositionMLP(EdgeMLP, PositionalEncoding):
    """MLP on positions or position offsets: ``Linear -> Norm -> ReLU -> Linear``.

    With the defaults (``hidden_dim = in_dim``, batch norm) this is Point Transformer's
    position encoding ``delta_ij = Linear(BN-ReLU(Linear(p_j - p_i)))`` for ``in_dim = 3``
    (relative xyz). ``hidden_dim=0`` is the single ``Linear(in_dim, out_dim)``. Module
    indices are PTv1's (``linear_p.0``, ``linear_p.1``, ``linear_p.3``).

    Args:
        in_dim: position dimension (1 for band offsets, 3 for 3D offsets).
        out_dim: output channels.
        hidden_dim: hidden width (default ``in_dim``; 0: no hidden layer).
        norm: ``"batch"`` (statistics over all leading dimensions), ``"layer"`` or ``"none"``.

    Shapes:
        x: (..., in_dim) -> (..., out_dim)
    """

    kind = "relative"

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int | None = None, norm: NormKind = "batch") -> None:
        if in_dim <= 0 or out_dim <= 0:
            raise ConfigError(f"in_dim/out_dim: expected positive integers, got {in_dim}, {out_dim}")
        super().__init__(in_dim, in_dim if hidden_dim is None else hidden_dim, out_dim, norm)
        self.in_dim = in_dim

    @property
    def net(self) -> PositionMLP:
        """The layers themselves (``Linear, Norm, ReLU, Linear``), for unpacking."""
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix + "net.")]:  # layout before 0.2: mlp.net.<i>
            state_dict[prefix + key[len(prefix) + 4 :]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_dim:
            raise DataError(f"x: expected last dimension {self.in_dim}, got {tuple(x.shape)}")
        return super().forward(x)  # (..., out_dim)


class RelativePositionBias(PositionalEncoding):
    """Per-head additive attention bias from continuous position differences.

    ``bias[h, i, j] = MLP(f(s * (p_i - p_j)))[h]`` with ``f(t) = sign(t) log(1 + |t|)`` when
    ``log_scale`` (Swin-v2's log-spaced offsets: band-index offsets of 1..200 and
    wavelength offsets of 10..2000 nm land in a similar range) and ``f(t) = t`` otherwise.
    Works for any offset dimension (1 for bands or wavelengths, 3 for points) and any
    sequence length.

    Args:
        num_heads: heads ``H`` (one bias map per head).
        pos_dim: dimension ``k`` of the positions.
        hidden_dim: width of the MLP.
        scale: ``s``, multiplies the offsets before ``f``.
        log_scale: apply ``f(t) = sign(t) log(1 + |t|)``.

    Shapes:
        positions: (..., L) with ``pos_dim == 1``, or (..., L, k)
        key_positions: same layout with Lk tokens (default: ``positions``)
        output: (..., H, L, Lk)
    """

    kind = "bias"

    def __init__(
        self, num_heads: int, pos_dim: int = 1, hidden_dim: int = 32, scale: float = 1.0, log_scale: bool = True
    ) -> None:
        super().__init__()
        if num_heads <= 0 or pos_dim <= 0:
            raise ConfigError(f"num_heads/pos_dim: expected positive integers, got {num_heads}, {pos_dim}")
        self.num_heads = num_heads
        self.pos_dim = pos_dim
        self.scale = float(scale)
        self.log_scale = log_scale
        self.mlp = PositionMLP(pos_dim, num_heads, hidden_dim=hidden_dim, norm="none")

    def _as_points(self, p: torch.Tensor) -> torch.Tensor:
        if self.pos_dim == 1:
            p = p[..., None]  # (..., L) -> (..., L, 1)
        if p.ndim < 2 or p.shape[-1] != self.pos_dim:
            raise DataError(f"positions: expected shape (..., L, {self.pos_dim}), got {tuple(p.shape)}")
        return p

    def forward(self, positions: torch.Tensor, key_positions: torch.Tensor | None = None) -> torch.Tensor:
        pq = self._as_points(positions)  # (..., L, k)
        pk = pq if key_positions is None else self._as_points(key_positions)  # (..., Lk, k)
        offset = (pq[..., :, None, :] - pk[..., None, :, :]) * self.scale  # (..., L, Lk, k)
        if self.log_scale:
            offset = torch.sign(offset) * torch.log1p(offset.abs())
        bias = self.mlp(offset.to(self.mlp[0].weight.dtype))  # (..., L, Lk, H)
        return bias.movedim(-1, -3)  # (..., H, L, Lk)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, pos_dim={self.pos_dim}, scale={self.scale}, log_scale={self.log_scale}"


@dataclass
class NeighborBasis:
    """A neighbour index as sparse matrices weighted by polynomial functions of the offsets.

    For the k neighbours j of point i (index -1 = padding, skipped) with offsets
    ``r_ij = (p_j - p_i) / scale`` and ``n_i`` valid neighbours, basis function
    ``b`` of :data:`CPE_BASIS` gives the (N, N) matrix ``A_b[i, j] = phi_b(r_ij) / n_i``.
    They are stacked side by side, ``A = [A_0 ... A_{nb-1}]`` (N, nb N) CSR, with its
    transpose for the backward pass, built once per stage and shared by its blocks.

    Shapes:
        adj: (N, nb * N) CSR; adj_t: (nb * N, N) CSR
    """

    adj: Tensor
    adj_t: Tensor
    num_points: int

    @classmethod
    def build(cls, pos: Tensor, idx: Tensor, scale: float, dtype: torch.dtype | None = None) -> NeighborBasis:
        n, k = idx.shape
        dtype = dtype or pos.dtype
        valid = idx >= 0  # (N, k)
        safe = idx.clamp(min=0)  # (N, k)
        rel = (pos.index_select(0, safe.reshape(-1)).view(n, k, 3) - pos.unsqueeze(1)).to(dtype) / scale  # (N, k, 3)
        phi = torch.cat([torch.ones_like(rel[..., :1]), rel, rel.square().sum(-1, keepdim=True)], dim=-1)  # (N, k, nb)
        nb = phi.shape[-1]
        count = valid.sum(1, keepdim=True).clamp_min(1).to(dtype)  # (N, 1)
        phi = phi * (valid.unsqueeze(-1) / count.unsqueeze(-1))  # (N, k, nb); padding -> 0
        dev = idx.device
        e = n * k
        cols = (torch.arange(nb, device=dev) * n).view(1, 1, nb) + safe.unsqueeze(-1)  # (N, k, nb)
        crow = torch.arange(0, e * nb + 1, k * nb, device=dev)  # (N + 1,) k nb entries per row
        # the transpose: every A_b^T has the pattern of the kNN graph's transpose
        flat = safe.reshape(-1)  # (E,)
        order = torch.argsort(flat, stable=True)  # edges grouped by source point
        crow1 = torch.zeros(n + 1, dtype=torch.long, device=dev)
        torch.cumsum(torch.bincount(flat, minlength=n), 0, out=crow1[1:])
        shifts = torch.arange(nb, device=dev).unsqueeze(1) * e  # (nb, 1)
        crow_t = torch.cat([(crow1[:-1].unsqueeze(0) + shifts).reshape(-1), crow1.new_tensor([nb * e])])  # (nb N + 1,)
        rows_t = torch.div(order, k, rounding_mode="floor").repeat(nb)  # (nb E,) query of each entry
        vals_t = phi.reshape(e, nb).index_select(0, order).t().reshape(-1)  # (nb E,) block b = A_b^T
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
            adj = torch.sparse_csr_tensor(crow, cols.reshape(-1), phi.reshape(-1), (n, nb * n), check_invariants=False)
            adj_t = torch.sparse_csr_tensor(crow_t, rows_t, vals_t, (nb * n, n), check_invariants=False)
        return cls(adj=adj, adj_t=adj_t, num_points=n)


CPE_BASIS = ("1", "r_x", "r_y", "r_z", "|r|^2")


class ConditionalPositionalEncoding(PositionalEncoding):
    r"""Conditional positional encoding of points without sparse convolution.

    PTv3 (Wu et al. 2024) adds ``LN(Linear(SubMConv3x3x3(x)))`` before every attention
    block, a submanifold sparse convolution (spconv) over voxel neighbours. Here the
    convolution runs over the k nearest neighbours (``sciformer.geometry.knn``, the
    stage's index) as a *depthwise* convolution whose kernel is a quadratic polynomial
    of the neighbour offset :math:`r_{ij} = (p_j - p_i) / s`, followed by the pointwise
    ``Linear`` and LayerNorm (together a depthwise-separable convolution):

    .. math::
        h_i = \frac{1}{n_i} \sum_{j \in \mathrm{kNN}(i)} \sum_b W_b \odot \phi_b(r_{ij})\, x_j,
        \qquad \phi = (1, r_x, r_y, r_z, \lVert r \rVert^2),\qquad
        y_i = \mathrm{LN}(W h_i + c)

    Why kNN and this kernel: kNN neighbours exist for every point of any cloud (several
    points in one voxel, uneven density), need no hash table, and the KD-tree backend
    makes them cheap on CPU; a kernel polynomial in the offset is defined for continuous
    offsets and, since ``W_b`` is per channel, the sum factorises into one sparse-dense
    product with the stacked matrices of :class:`NeighborBasis` (built once per stage).
    No (N, k, C) tensor exists in the forward or backward pass; cost O(N k C nb). ``s``
    is the stage's voxel size, so the kernel sees offsets in voxel units as spconv does.

    Shapes:
        x: (N, C); basis: :class:`NeighborBasis` of N points, or a context with a ``basis``
        attribute (:class:`~sciformer.attention.serialized.SerializedContext`) -> (N, C)
    """

    kind = "conditional"

    def __init__(self, channels: int) -> None:
        super().__init__()
        if channels <= 0:
            raise ConfigError(f"channels: expected a positive integer, got {channels}")
        nb = len(CPE_BASIS)
        self.channels = channels
        self.weight = nn.Parameter(torch.empty(nb, channels))  # depthwise kernel, one row per basis function
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(nb))
        self.linear = nn.Linear(channels, channels)
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: Tensor, basis: Any) -> Tensor:
        basis = getattr(basis, "basis", basis)  # a NeighborBasis or a context holding one
        if not isinstance(basis, NeighborBasis):
            raise DataError(f"basis: expected a NeighborBasis (or a context with one), got {type(basis).__name__}")
        if x.ndim != 2 or x.shape[1] != self.channels or x.shape[0] != basis.num_points:
            raise DataError(f"x: expected shape ({basis.num_points}, {self.channels}), got {tuple(x.shape)}")
        stacked = (x.unsqueeze(0) * self.weight.unsqueeze(1)).reshape(-1, self.channels)  # (nb N, C)
        adj, adj_t = basis.adj, basis.adj_t
        if adj.dtype != x.dtype:
            adj, adj_t = adj.to(x.dtype), adj_t.to(x.dtype)
        h = AdjacencyMatmul.apply(adj, adj_t, stacked)  # (N, C)
        return self.norm(self.linear(h))  # (N, C)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, basis={CPE_BASIS}"
