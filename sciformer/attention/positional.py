"""Positional information from continuous positions.

Everything here is computed from the positions themselves (band index, wavelength in
nm, pixel offsets, 3D offsets), never from a table sized by the sequence length, so a
model works for any number of tokens:

- :func:`sinusoidal_encoding` / :class:`SinusoidalPositionalEncoding`: parameter-free
  absolute encoding (Vaswani et al. 2017) of 1D or k-D continuous positions;
- :class:`PositionMLP`: an MLP on positions or offsets (Point Transformer's position
  encoding ``Linear-BN-ReLU-Linear`` on ``p_j - p_i``);
- :class:`RelativePositionBias`: per-head additive attention bias from position
  differences ``p_i - p_j`` (continuous relative position bias, Swin-v2 style).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from sciformer.errors import ConfigError, DataError

NormKind = Literal["batch", "layer", "none"]


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


class SinusoidalPositionalEncoding(nn.Module):
    """Parameter-free sinusoidal encoding of 1D or k-D continuous positions.

    A position ``p`` (band index, wavelength in nm, ...) is first multiplied by ``scale``.
    For k-D positions each coordinate gets ``dim / k`` channels of
    :func:`sinusoidal_encoding` and the parts are concatenated.

    Shapes:
        positions: (..., L) with ``pos_dim == 1``, or (..., L, k) with ``pos_dim == k``
        output: (..., L, dim)
    """

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


class _FlatBatchNorm(nn.BatchNorm1d):
    """``BatchNorm1d`` over the last dimension of a tensor with any leading dimensions.

    Shapes:
        x: (..., C) -> (..., C); statistics over all leading dimensions.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return super().forward(x.reshape(-1, shape[-1])).view(shape)


def _norm(kind: NormKind, width: int) -> nn.Module:
    if kind == "batch":
        return _FlatBatchNorm(width)
    if kind == "layer":
        return nn.LayerNorm(width)
    if kind == "none":
        return nn.Identity()
    raise ConfigError(f"norm: expected one of 'batch', 'layer', 'none', got {kind!r}")


class PositionMLP(nn.Module):
    """MLP on positions or position offsets: ``Linear -> Norm -> ReLU -> Linear``.

    With the defaults (``hidden_dim = in_dim``, batch norm) this is Point Transformer's
    position encoding ``delta_ij = Linear(BN-ReLU(Linear(p_i - p_j)))`` for ``in_dim = 3``.

    Args:
        in_dim: position dimension (1 for band offsets, 3 for 3D offsets).
        out_dim: output channels.
        hidden_dim: hidden width (default ``in_dim``).
        norm: ``"batch"`` (statistics over all leading dimensions), ``"layer"`` or ``"none"``.

    Shapes:
        x: (..., in_dim) -> (..., out_dim)
    """

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int | None = None, norm: NormKind = "batch") -> None:
        super().__init__()
        if in_dim <= 0 or out_dim <= 0:
            raise ConfigError(f"in_dim/out_dim: expected positive integers, got {in_dim}, {out_dim}")
        hidden = hidden_dim or in_dim
        self.in_dim = in_dim
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), _norm(norm, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_dim:
            raise DataError(f"x: expected last dimension {self.in_dim}, got {tuple(x.shape)}")
        return self.net(x)  # (..., out_dim)


class RelativePositionBias(nn.Module):
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
        bias = self.mlp(offset.to(self.mlp.net[0].weight.dtype))  # (..., L, Lk, H)
        return bias.movedim(-1, -3)  # (..., H, L, Lk)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, pos_dim={self.pos_dim}, scale={self.scale}, log_scale={self.log_scale}"
