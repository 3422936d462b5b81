"""Training randomness decided by the sample and the step, never by the process.

A run draws random numbers in three places: the batch order (``(seed, epoch)``, see
:mod:`sciformer.engine.batching`), data augmentation and dropout. Here:

- augmentation: :class:`PerSampleRNG` seeds torch's generator from ``(seed, epoch, index)``
  around each ``dataset[index]`` (point datasets also derive their numpy generator from
  the same triple), so a sample is augmented alike whichever rank or worker loads it and
  whether or not the run was resumed;
- dropout: :func:`install` swaps every ``nn.Dropout`` and stochastic-depth module for a
  keyed version. At each step :class:`StepNoise` knows the global batch and which of its
  rows this process holds; a keyed module draws the mask of the *whole global batch* from a
  generator seeded by ``(seed, global step, call number)`` and keeps this process's rows.
  One process and N processes therefore apply the same mask to the same sample.

Exactness: masks over tensors whose first dimension is the sample (every spectral model;
the classification head of point models) are exact. Tensors with another leading size
(per-point rows of point models, attention-weight dropout inside
``scaled_dot_product_attention``) draw from torch's generator seeded by
``(seed, global step, rank)``: reproducible on resume, but distinct per rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

_MASK = (1 << 63) - 1


def mix(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps), stable across platforms and versions."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & _MASK


class PerSampleRNG(Dataset):
    """``dataset[i]`` with torch's generator seeded by ``(seed, epoch, i)`` (state restored after)."""

    def __init__(self, dataset: Any, seed: int, epoch: int) -> None:
        self.dataset, self.seed, self.epoch = dataset, int(seed), int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix(self.seed, self.epoch, index, 0x61756700))
            return self.dataset[index]

    def __getattr__(self, name: str) -> Any:  # collate helpers and attributes of the wrapped dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class StepNoise:
    """Which global-batch rows this process holds at the current step, and the step's seed."""

    def __init__(self, seed: int, rank: int = 0) -> None:
        self.seed, self.rank = int(seed), int(rank)
        self.key: int | None = None
        self.rows: torch.Tensor | None = None  # (b_local,) positions in the global batch
        self.n_global = 0
        self.calls = 0

    def begin(self, step: int, rows: torch.Tensor, n_global: int) -> None:
        """Start step ``step`` holding rows ``rows`` of a global batch of ``n_global`` samples."""
        self.key, self.rows, self.n_global, self.calls = mix(self.seed, step), rows, int(n_global), 0
        torch.manual_seed(mix(self.seed, step, self.rank, 0x72616E6B))  # anything not keyed below

    def end(self) -> None:
        self.key, self.rows = None, None

    def keep_mask(self, shape: tuple[int, ...], p: float, device: torch.device) -> torch.Tensor | None:
        """A float keep-mask (1 keep, 0 drop) of ``shape`` whose rows are the sample's, or None if not keyed."""
        if self.key is None or self.rows is None or not shape or shape[0] != self.rows.numel():
            return None
        self.calls += 1
        gen = torch.Generator(device=device).manual_seed(mix(self.key, self.calls))
        full = torch.rand((self.n_global, *shape[1:]), generator=gen, device=device)  # (n_global, ...)
        return (full[self.rows.to(device)] >= p).to(torch.float32)  # (b_local, ...)


class KeyedDropout(nn.Dropout):
    """``nn.Dropout`` whose mask rows follow the sample (see :class:`StepNoise`).

    Shapes:
        x: (n, ...) -> (n, ...)
    """

    def __init__(self, p: float, noise: StepNoise) -> None:
        super().__init__(p)
        object.__setattr__(self, "_noise", noise)  # not a submodule, not in the state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        mask = self._noise.keep_mask(tuple(x.shape), self.p, x.device)
        if mask is None:
            return super().forward(x)
        return x * mask.to(x.dtype) / (1.0 - self.p)


class KeyedDropPath(nn.Module):
    """Stochastic depth with one keyed keep/drop decision per sample.

    Shapes:
        x: (n, ...) -> (n, ...)
    """

    def __init__(self, original: nn.Module, noise: StepNoise) -> None:
        super().__init__()
        self.original = original
        self.drop_prob = float(original.drop_prob)
        object.__setattr__(self, "_noise", noise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        mask = self._noise.keep_mask((x.shape[0],) + (1,) * (x.ndim - 1), self.drop_prob, x.device)
        if mask is None:
            return self.original(x)
        return x * mask.to(x.dtype) / (1.0 - self.drop_prob)


def install(model: nn.Module, noise: StepNoise) -> int:
    """Replace dropout and stochastic-depth modules of ``model`` in place; returns how many."""
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                swaps.append((parent, name, KeyedDropout(child.p, noise)))
            elif type(child).__name__ == "DropPath" and hasattr(child, "drop_prob"):
                swaps.append((parent, name, KeyedDropPath(child, noise)))
    for parent, name, module in swaps:
        setattr(parent, name, module)
    return len(swaps)
