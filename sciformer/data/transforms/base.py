"""Sample helpers and the transform base classes (``Transform``, ``Compose``, ``ToTensor``).

See :mod:`sciformer.data.transforms` for the sample layout and randomness rules.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sciformer.errors import DataError

Sample = dict[str, Any]


# Arrays that are never per-point even when their length happens to equal n.
NON_POINT_KEYS = frozenset({"inverse", "offset", "category", "index", "shift"})


def num_points(sample: Sample) -> int:
    """Number of points of a sample (rows of ``coord``)."""
    coord = sample.get("coord")
    if not isinstance(coord, np.ndarray) or coord.ndim != 2 or coord.shape[1] != 3:
        shape = getattr(coord, "shape", None)
        raise DataError(f"sample 'coord' has shape {shape}, expected (n, 3)")
    return int(coord.shape[0])


def point_keys(sample: Sample) -> list[str]:
    """Keys of the per-point arrays of ``sample`` (first dimension equal to n)."""
    n = num_points(sample)
    return [
        k
        for k, v in sample.items()
        if k not in NON_POINT_KEYS and isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == n
    ]


def index_points(sample: Sample, index: np.ndarray) -> Sample:
    """A copy of ``sample`` with every per-point array indexed by ``index`` (m,)."""
    keys = point_keys(sample)
    out = dict(sample)
    for k in keys:
        out[k] = sample[k][index]
    return out


class Transform:
    """Base class: ``transform(sample, rng=None) -> sample`` with a readable repr."""

    random = False  # whether the transform draws from ``rng``
    keeps_points = True  # False when points are dropped, added or reordered

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        raise NotImplementedError

    def _rng(self, rng: np.random.Generator | None) -> np.random.Generator:
        if rng is not None:
            return rng
        if getattr(self, "_fallback", None) is None:
            self._fallback = np.random.default_rng()
        return self._fallback

    def __repr__(self) -> str:
        params = inspect.signature(type(self).__init__).parameters
        shown = []
        for name in list(params)[1:]:
            value = getattr(self, name, None)
            if isinstance(value, float):
                value = round(value, 6)
            shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


class Compose(Transform):
    """Apply transforms in order, passing the same ``rng`` to each."""

    def __init__(self, transforms: Sequence[Callable[..., Sample]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng) if any(getattr(t, "random", True) for t in self.transforms) else rng
        for t in self.transforms:
            sample = t(sample, rng) if isinstance(t, Transform) else t(sample)
        return sample

    def __len__(self) -> int:
        return len(self.transforms)

    def __repr__(self) -> str:
        if not self.transforms:
            return "Compose([])"
        inner = ",\n".join(f"  {t!r}" for t in self.transforms)
        return f"Compose([\n{inner}\n])"



class ToTensor(Transform):
    """Convert numpy arrays to torch tensors (float64 -> float32; other dtypes kept)."""

    def __init__(self) -> None:
        pass

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        out: Sample = {}
        for k, v in sample.items():
            if isinstance(v, np.ndarray):
                if v.dtype == np.float64:
                    v = v.astype(np.float32)
                v = torch.from_numpy(np.ascontiguousarray(v))
            out[k] = v
        return out

