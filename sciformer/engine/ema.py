"""Exponential moving average of the model's weights (``train.ema``).

After every optimizer step the average moves toward the trained weights::

    ema <- d_t * ema + (1 - d_t) * w,    d_t = min(decay, (1 + t) / (10 + t))

with t the number of updates so far (the warm-up of TensorFlow's ``ExponentialMovingAverage``
``num_updates`` and timm's ``ModelEmaV2``: early on the average follows the weights closely,
so a short run is not dominated by its random initialisation). Floating-point buffers
(BatchNorm running statistics) are averaged the same way, integer buffers copied.

The average is what validation scores, what ``best.pt`` holds as its ``model`` (so evaluate,
predict and ``--init-from`` use it unchanged), and what the final evaluation tests; training
continues from the raw weights. Every checkpoint stores the average beside them, so a
resumed run continues it exactly. The average adds one copy of the weights to memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from sciformer.errors import CheckpointError


class WeightAverage:
    """An exponential moving average of ``model``'s parameters and buffers.

    Args:
        model: the (unwrapped) model being trained; the average starts as a copy of it.
        decay: the asymptotic decay d, 0 < d < 1 (0.999: about the last 1,000 steps).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie in (0, 1), got {decay}")
        self.decay = float(decay)
        self.updates = 0
        self.shadow: dict[str, torch.Tensor] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def current_decay(self) -> float:
        """d_t of the next update."""
        return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average one step toward ``model``'s current weights."""
        d = self.current_decay()
        for key, value in model.state_dict().items():
            avg = self.shadow[key]
            if avg.is_floating_point():
                avg.lerp_(value.detach().to(avg.dtype), 1.0 - d)  # avg + (1 - d) * (w - avg)
            else:
                avg.copy_(value)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "weights": {k: v.clone() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict[str, Any], where: str) -> None:
        """Restore a saved average; a missing or mismatched one is a one-line CheckpointError."""
        weights = state.get("weights") if isinstance(state, dict) else None
        if not isinstance(weights, dict) or set(weights) != set(self.shadow):
            raise CheckpointError(f"checkpoint '{where}': its weight average (train.ema) does not match this model")
        for key, avg in self.shadow.items():
            value = weights[key]
            if not isinstance(value, torch.Tensor) or value.shape != avg.shape:
                raise CheckpointError(f"checkpoint '{where}': its weight average entry '{key}' does not match this model")
            avg.copy_(value)
        updates = state.get("updates", 0)
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
            raise CheckpointError(f"checkpoint '{where}': its weight average has an invalid update count {str(updates)[:40]!r}")
        self.updates = updates

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """Inside the block ``model`` holds the average; its own weights come back afterwards."""
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.shadow)
        try:
            yield
        finally:
            model.load_state_dict(own)
