"""Colour transforms on ``colour`` (n, 3) in [0, 1]."""

from __future__ import annotations

import numpy as np

from sciformer.data.transforms.base import (
    Sample,
    Transform,
)


class ChromaticAutoContrast(Transform):
    """Stretch ``colour`` (in [0, 1]) to the full range, blended, with probability ``p``.

    ``blend_factor``: weight of the stretched colour (None: uniform in [0, 1]).

    Shapes: colour (n, 3) -> (n, 3).
    """

    random = True

    def __init__(self, p: float = 0.2, blend_factor: float | None = None) -> None:
        self.p = float(p)
        self.blend_factor = blend_factor

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        colour = sample.get("colour")
        if not isinstance(colour, np.ndarray) or colour.size == 0 or rng.random() >= self.p:
            return sample
        lo = colour.min(axis=0, keepdims=True)  # (1, 3)
        hi = colour.max(axis=0, keepdims=True)  # (1, 3)
        stretched = (colour - lo) / np.maximum(hi - lo, 1e-8)  # (n, 3)
        blend = rng.random() if self.blend_factor is None else self.blend_factor
        mixed = (1 - blend) * colour + blend * stretched
        return {**sample, "colour": np.clip(mixed, 0.0, 1.0).astype(colour.dtype)}


class ChromaticJitter(Transform):
    """Add Gaussian noise N(0, std) to ``colour`` (in [0, 1]) with probability ``p``, clipped.

    Shapes: colour (n, 3) -> (n, 3).
    """

    random = True

    def __init__(self, p: float = 0.95, std: float = 0.005) -> None:
        self.p = float(p)
        self.std = float(std)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        colour = sample.get("colour")
        if not isinstance(colour, np.ndarray) or rng.random() >= self.p:
            return sample
        noisy = colour + self.std * rng.standard_normal(colour.shape)  # (n, 3)
        return {**sample, "colour": np.clip(noisy, 0.0, 1.0).astype(colour.dtype)}

