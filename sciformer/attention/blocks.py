"""Building blocks shared by every attention form: MLP and stochastic depth."""

from __future__ import annotations

import torch
from torch import nn


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
