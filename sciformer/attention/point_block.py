"""The Point Transformer (v1/v2) residual block around a neighbourhood attention layer.

The block is PTv1's bottleneck (post-norm, BatchNorm) and is kept as such so trained
v1/v2 models keep their numbers; the pre-norm block generic over its token mixer is
:class:`~sciformer.attention.transformer.PreNormBlock` (dense, serialized, kNN).
"""

from __future__ import annotations

from torch import Tensor, nn

from sciformer.attention.grouped import GroupedVectorAttention
from sciformer.attention.layers import DropPath, norm_layer
from sciformer.attention.neighborhood import NORMS, PointTransformerLayer
from sciformer.errors import ConfigError

__all__ = ["PointTransformerBlock"]


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
        if norm not in NORMS:
            raise ConfigError(f"norm must be one of {NORMS}, got {norm!r}")
        self.linear1 = nn.Linear(channels, channels, bias=False)
        self.bn1 = norm_layer(norm, channels)
        self.transformer2: nn.Module
        if attention == "ptv1":
            self.transformer2 = PointTransformerLayer(channels, channels, norm=norm, **layer_kwargs)  # type: ignore[arg-type]
        elif attention == "ptv2":
            share_planes = int(layer_kwargs.pop("share_planes", 8))  # type: ignore[call-overload]
            if share_planes < 1 or channels % share_planes:
                raise ConfigError(f"share_planes must be a positive divisor of channels={channels}, got {share_planes}")
            self.transformer2 = GroupedVectorAttention(channels, channels // share_planes, norm=norm, **layer_kwargs)  # type: ignore[arg-type]
        else:
            raise ConfigError(f"attention must be 'ptv1' or 'ptv2', got {attention!r}")
        self.bn2 = norm_layer(norm, channels)
        self.linear3 = nn.Linear(channels, channels, bias=False)
        self.bn3 = norm_layer(norm, channels)
        self.relu = nn.ReLU(inplace=True)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, pos: Tensor, idx: Tensor) -> Tensor:
        identity = x  # (N, C)
        h = self.relu(self.bn1(self.linear1(x)))  # (N, C)
        h = self.relu(self.bn2(self.transformer2(h, pos, idx)))  # (N, C)
        h = self.bn3(self.linear3(h))  # (N, C)
        return self.relu(identity + self.drop_path(h))
