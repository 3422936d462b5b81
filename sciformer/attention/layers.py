"""Layers shared by every attention form: norm factory, MLPs and stochastic depth.

- :func:`norm_layer`: the one norm factory (``"batch"``, ``"layer"``, ``"none"``) of the
  dense, serialized and neighbourhood forms;
- :class:`Mlp`: the feed-forward network of the pre-norm residual block;
- :class:`EdgeMLP`: ``Linear-Norm-ReLU-Linear`` on the last dimension of any tensor
  (position MLPs, per-edge weight encodings);
- :func:`drop_path` / :class:`DropPath`: stochastic depth on a residual branch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

import torch
from torch import nn

from sciformer.errors import ConfigError

NormKind = Literal["batch", "layer", "none"]
NORM_KINDS: tuple[str, ...] = ("batch", "layer", "none")


class BatchNormLastDim(nn.BatchNorm1d):
    """``BatchNorm1d`` over the last dimension of a tensor with any leading dimensions.

    On (n, C) rows it is exactly ``nn.BatchNorm1d`` (same state dict, same numbers).

    Shapes:
        x: (..., C) -> (..., C); statistics over all leading dimensions.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 2:
            return super().forward(x)  # (n, C)
        shape = x.shape
        return super().forward(x.reshape(-1, shape[-1])).view(shape)  # (..., C)


def norm_layer(kind: str, channels: int) -> nn.Module:
    """The norm of every attention form: ``"batch"`` (statistics over all leading
    dimensions), ``"layer"`` or ``"none"``; (..., C) -> (..., C)."""
    if kind == "batch":
        return BatchNormLastDim(channels)
    if kind == "layer":
        return nn.LayerNorm(channels)
    if kind == "none":
        return nn.Identity()
    raise ConfigError(f"norm: expected one of 'batch', 'layer', 'none', got {kind!r}")


class EdgeMLP(nn.Sequential):
    """``Linear(C_in, H) -> Norm(H) -> ReLU -> Linear(H, C_out)`` on the last dimension.

    With ``hidden == 0`` it is the single ``Linear(C_in, C_out)``. Module indices (``0``:
    first linear, ``1``: norm, ``3``: last linear) are the state-dict names of the Point
    Transformer reference code. Slicing returns a plain ``nn.Sequential``.

    Shapes:
        x: (..., C_in) -> (..., C_out); BatchNorm statistics over all leading dimensions.
    """

    def __init__(self, in_channels: int, hidden: int, out_channels: int, norm: str = "batch") -> None:
        if in_channels <= 0 or out_channels <= 0 or hidden < 0:
            raise ConfigError(
                f"EdgeMLP: expected positive in/out widths and hidden >= 0, got {in_channels}, {hidden}, {out_channels}"
            )
        if hidden == 0:
            super().__init__(nn.Linear(in_channels, out_channels))
        else:
            super().__init__(
                nn.Linear(in_channels, hidden), norm_layer(norm, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_channels)
            )
        self.in_channels, self.out_channels = in_channels, out_channels

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return nn.Sequential(OrderedDict(list(self._modules.items())[idx]))
        return super().__getitem__(idx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        y = super().forward(x.reshape(-1, x.shape[-1]))  # (E, C_out)
        return y.view(*shape, -1)  # (..., C_out)


def drop_path(x: torch.Tensor, drop_prob: float, training: bool) -> torch.Tensor:
    """Stochastic depth: zero whole samples of a residual branch.

    Shapes:
        x: (n, ...) -> (n, ...); one keep/drop decision per leading index.
    """
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = x.new_empty(shape).bernoulli_(keep)  # (n, 1, ..., 1)
    return x * mask / keep


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016) on a residual branch.

    Shapes:
        x: (n, ...) -> (n, ...)
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob = float(drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class Mlp(nn.Module):
    """Two-layer feed-forward network ``Linear -> GELU -> Dropout -> Linear -> Dropout``.

    Shapes:
        x: (..., in_features) -> (..., out_features)
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        dropout: float = 0.0,
        activation: type[nn.Module] = nn.GELU,
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = activation()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x)))  # (..., hidden)
        return self.drop(self.fc2(x))  # (..., out)
