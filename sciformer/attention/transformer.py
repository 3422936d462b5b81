"""The pre-norm residual block (generic over its token mixer) and token-sequence encoders."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from sciformer.attention.dense import MultiHeadAttention
from sciformer.attention.layers import DropPath, Mlp, norm_layer
from sciformer.attention.positional import PositionalEncoding
from sciformer.errors import ConfigError

FusionKind = Literal["none", "linear", "gate"]


class PreNormBlock(nn.Module):
    """Pre-norm residual block, generic over its token mixer (ViT / PTv3 style)::

        x = x + PE(x, *ctx)                         # optional conditional positional encoding
        x = x + DropPath(Mixer(Norm(x), *ctx))
        x = x + DropPath(Mlp(Norm(x)))

    The mixer is any module taking the normalised tokens and the block's context:
    :class:`~sciformer.attention.dense.MultiHeadAttention` over a token sequence
    (``ctx = (attn_bias, key_padding_mask)``),
    :class:`~sciformer.attention.serialized.SerializedAttention` over serialized point
    patches (``ctx = (context,)``), or a neighbourhood layer
    (:class:`~sciformer.attention.grouped.GroupedVectorAttention`, ``ctx = (pos, idx)``).
    ``Mlp`` is ``Linear(D, r D) -> GELU -> Linear(r D, D)`` with dropout ``drop``.

    Shapes:
        x: (..., D) tokens (``(n, L, D)`` sequences or ``(N, D)`` packed points)
        ctx: whatever the mixer (and ``pos_encoding``) take after the tokens
        output: same shape as x
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        *,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        drop_path: float = 0.0,
        norm: str = "layer",
        pos_encoding: PositionalEncoding | None = None,
    ) -> None:
        super().__init__()
        if mlp_ratio <= 0:
            raise ConfigError(f"mlp_ratio: expected a positive number, got {mlp_ratio}")
        self.pos_encoding = pos_encoding
        self.norm1 = norm_layer(norm, dim)
        self.attn = mixer
        self.drop_path = DropPath(drop_path)
        self.norm2 = norm_layer(norm, dim)
        self.mlp = Mlp(dim, hidden_features=max(1, round(dim * mlp_ratio)), dropout=drop)

    def forward(self, x: torch.Tensor, *ctx: Any) -> torch.Tensor:
        if self.pos_encoding is not None:
            x = x + self.pos_encoding(x, *ctx)  # (..., D)
        x = x + self.drop_path(self.attn(self.norm1(x), *ctx))  # (..., D)
        return x + self.drop_path(self.mlp(self.norm2(x)))  # (..., D)


class TransformerBlock(PreNormBlock):
    """:class:`PreNormBlock` with dense multi-head attention over a token sequence::

        x = x + DropPath(Attn(LN(x), bias, mask))
        x = x + DropPath(Mlp(LN(x)))

    Shapes:
        x: (n, L, D)
        attn_bias: broadcastable to (n, H, L, L) (optional)
        key_padding_mask: (n, L) bool, ``True`` = ignore (optional)
        output: (n, L, D)
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        qkv_bias: bool = True,
    ) -> None:
        if mlp_ratio <= 0:
            raise ConfigError(f"mlp_ratio: expected a positive number, got {mlp_ratio}")
        attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        super().__init__(dim, attn, mlp_ratio=mlp_ratio, drop=drop, drop_path=drop_path)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        attn_bias: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return super().forward(x, attn_bias, key_padding_mask)  # (n, L, D)


class CrossLayerFusion(nn.Module):
    """Fuse a shallow layer's tokens into a deeper layer's input, token by token.

    The idea of SpectralFormer's cross-layer adaptive fusion, but with no parameter
    sized by the number of tokens (or bands):

    - ``"linear"``: ``y = W [x ; s] + b`` with ``W`` (D, 2D), initialised to ``[I, 0]``
      and ``b = 0``, so the encoder starts as a plain one;
    - ``"gate"``: ``y = x + g * s`` with a per-channel gate ``g`` (D,) initialised to 0.

    Shapes:
        x: (n, L, D) deep tokens, skip: (n, L, D) shallow tokens -> (n, L, D)
    """

    def __init__(self, dim: int, mode: Literal["linear", "gate"] = "linear") -> None:
        super().__init__()
        self.mode = mode
        if mode == "linear":
            self.linear = nn.Linear(2 * dim, dim)
            with torch.no_grad():
                self.linear.weight.zero_()
                self.linear.weight[:, :dim].copy_(torch.eye(dim))
                self.linear.bias.zero_()
        elif mode == "gate":
            self.gate = nn.Parameter(torch.zeros(dim))
        else:
            raise ConfigError(f"fusion: expected one of 'none', 'linear', 'gate', got {mode!r}")

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        if self.mode == "linear":
            return self.linear(torch.cat((x, skip), dim=-1))  # (n, L, D)
        return x + self.gate * skip  # (n, L, D)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"


class TransformerEncoder(nn.Module):
    """A stack of :class:`TransformerBlock` with a final LayerNorm.

    Stochastic depth grows linearly from 0 at the first block to ``drop_path`` at the
    last. With ``fusion != "none"`` the input of block ``l >= 3`` (1-based) is
    ``Fuse(h_{l-1}, h_{l-3})`` where ``h_0`` is the encoder input and ``h_i`` the output
    of block ``i`` (SpectralFormer's skip across two blocks, see :class:`CrossLayerFusion`).

    Shapes:
        x: (n, L, D)
        attn_bias: broadcastable to (n, H, L, L), the same for every block (optional)
        key_padding_mask: (n, L) bool, ``True`` = ignore (optional)
        output: (n, L, D); with ``return_all`` a list of ``depth`` tensors (n, L, D), the
            output of every block, each passed through the final norm.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        qkv_bias: bool = True,
        fusion: FusionKind = "none",
        final_norm: bool = True,
    ) -> None:
        super().__init__()
        if depth <= 0:
            raise ConfigError(f"depth: expected a positive integer, got {depth}")
        if not 0.0 <= drop_path < 1.0:
            raise ConfigError(f"drop_path: expected a rate in [0, 1), got {drop_path}")
        rates = torch.linspace(0.0, drop_path, depth).tolist() if depth > 1 else [drop_path]
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, mlp_ratio, drop, attn_drop, rate, qkv_bias) for rate in rates
        )
        if fusion == "none":
            self.fusions = nn.ModuleList()
        else:
            self.fusions = nn.ModuleList(CrossLayerFusion(dim, fusion) for _ in range(max(depth - 2, 0)))
        self.norm = nn.LayerNorm(dim) if final_norm else nn.Identity()
        self.depth = depth

    def forward(
        self,
        x: torch.Tensor,
        attn_bias: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        return_all: bool = False,
    ) -> torch.Tensor | list[torch.Tensor]:
        hidden = [x]  # h_0, h_1, ...  each (n, L, D)
        for i, block in enumerate(self.blocks):
            if len(self.fusions) and i >= 2:
                x = self.fusions[i - 2](x, hidden[i - 2])  # (n, L, D)
            x = block(x, attn_bias, key_padding_mask)  # (n, L, D)
            hidden.append(x)
        if return_all:
            return [self.norm(h) for h in hidden[1:]]
        return self.norm(x)  # (n, L, D)
