"""Geometric point transforms: centring, scaling, rotation, jitter, flips."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from sciformer.data.transforms.base import (
    Sample,
    Transform,
    num_points,
)
from sciformer.errors import ConfigError, DataError


class CenterShift(Transform):
    """Move the bounding-box centre of x and y to 0; z by ``z``.

    ``z``: ``"center"`` (bbox centre to 0), ``"min"`` (lowest point to 0, e.g. floor
    or ground) or ``"keep"``. The applied shift is not stored.

    Shapes: coord (n, 3) -> (n, 3).
    """

    def __init__(self, z: Literal["center", "min", "keep"] = "center") -> None:
        if z not in ("center", "min", "keep"):
            raise ConfigError(f"CenterShift.z must be 'center', 'min' or 'keep', not {z!r}")
        self.z = z

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        coord = sample["coord"]  # (n, 3)
        if num_points(sample) == 0:
            return sample
        lo, hi = coord.min(axis=0), coord.max(axis=0)  # (3,)
        shift = (lo + hi) / 2.0
        if self.z == "min":
            shift[2] = lo[2]
        elif self.z == "keep":
            shift[2] = 0.0
        return {**sample, "coord": (coord - shift).astype(coord.dtype)}


def shape_extent(coord: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre (the mean) and radius (the largest distance from it) of a shape, computed in its
    dtype: what :class:`NormalizeScale` moves to the origin and scales to 1.

    Shapes: coord (n, 3), n > 0 -> ((3,), float).
    """
    coord = np.asarray(coord)  # (n, 3)
    centre = coord.mean(axis=0)  # (3,)
    return centre, float(np.linalg.norm(coord - centre, axis=1).max())


class NormalizeScale(Transform):
    """Centre on the mean and scale into the unit sphere (largest norm 1).

    Shapes: coord (n, 3) -> (n, 3).
    """

    def __init__(self) -> None:
        pass

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        if num_points(sample) == 0:
            raise DataError("NormalizeScale: empty point cloud (0 points)")
        coord = sample["coord"]  # (n, 3)
        centre, radius = shape_extent(coord)
        centred = coord - centre  # (n, 3)
        if radius > 0:
            centred = centred / radius
        return {**sample, "coord": centred.astype(coord.dtype)}


_AXES = {"x": 0, "y": 1, "z": 2}


def rotation_matrix(axis: str, angle: float) -> np.ndarray:
    """Right-handed rotation by ``angle`` radians about ``axis`` ('x', 'y', 'z'); (3, 3)."""
    c, s = math.cos(angle), math.sin(angle)
    if axis == "x":
        return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    if axis == "y":
        return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


class RandomRotate(Transform):
    """Rotate about ``axis`` through the origin by a uniform angle in ``angle`` (degrees).

    Applied with probability ``p``; rotates ``normal`` too (norms are preserved).

    Shapes: coord (n, 3) -> (n, 3); normal (n, 3) -> (n, 3).
    """

    random = True

    def __init__(self, axis: Literal["x", "y", "z"] = "z", angle: tuple[float, float] = (-180.0, 180.0), p: float = 1.0) -> None:
        if axis not in _AXES:
            raise ConfigError(f"RandomRotate.axis must be 'x', 'y' or 'z', not {axis!r}")
        self.axis = axis
        self.angle = (float(angle[0]), float(angle[1]))
        self.p = float(p)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        if rng.random() >= self.p:
            return sample
        theta = math.radians(rng.uniform(*self.angle))
        rot = rotation_matrix(self.axis, theta)  # (3, 3)
        out = dict(sample)
        out["coord"] = (sample["coord"] @ rot.T).astype(sample["coord"].dtype)  # (n, 3)
        if isinstance(sample.get("normal"), np.ndarray):
            out["normal"] = (sample["normal"] @ rot.T).astype(sample["normal"].dtype)  # (n, 3)
        return out


class RandomScale(Transform):
    """Multiply coordinates by a uniform factor in ``scale`` (one per axis if anisotropic).

    Shapes: coord (n, 3) -> (n, 3).
    """

    random = True

    def __init__(self, scale: tuple[float, float] = (0.9, 1.1), anisotropic: bool = False) -> None:
        if not 0 < scale[0] <= scale[1]:
            raise ConfigError(f"RandomScale.scale must be 0 < low <= high, got {tuple(scale)}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.anisotropic = bool(anisotropic)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        factor = rng.uniform(*self.scale, size=3 if self.anisotropic else 1)  # (3,) or (1,)
        coord = sample["coord"]
        return {**sample, "coord": (coord * factor).astype(coord.dtype)}


class RandomJitter(Transform):
    """Add Gaussian noise N(0, sigma) clipped to [-clip, clip] to every coordinate.

    Shapes: coord (n, 3) -> (n, 3).
    """

    random = True

    def __init__(self, sigma: float = 0.01, clip: float = 0.05) -> None:
        if sigma < 0 or clip <= 0:
            raise ConfigError(f"RandomJitter needs sigma >= 0 and clip > 0, got sigma={sigma}, clip={clip}")
        self.sigma = float(sigma)
        self.clip = float(clip)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        coord = sample["coord"]  # (n, 3)
        noise = np.clip(self.sigma * rng.standard_normal(coord.shape), -self.clip, self.clip)  # (n, 3)
        return {**sample, "coord": (coord + noise).astype(coord.dtype)}


class RandomFlip(Transform):
    """Mirror each axis in ``axes`` independently with probability ``p`` (normals too).

    Shapes: coord (n, 3) -> (n, 3).
    """

    random = True

    def __init__(self, axes: Sequence[Literal["x", "y", "z"]] = ("x", "y"), p: float = 0.5) -> None:
        for a in axes:
            if a not in _AXES:
                raise ConfigError(f"RandomFlip.axes entries must be 'x', 'y' or 'z', not {a!r}")
        self.axes = tuple(axes)
        self.p = float(p)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        sign = np.ones(3)
        for a in self.axes:
            if rng.random() < self.p:
                sign[_AXES[a]] = -1.0
        out = dict(sample)
        out["coord"] = (sample["coord"] * sign).astype(sample["coord"].dtype)
        if isinstance(sample.get("normal"), np.ndarray):
            out["normal"] = (sample["normal"] * sign).astype(sample["normal"].dtype)
        return out

