"""Point-cloud transforms: callables on a sample dict of numpy arrays.

A sample holds ``coord`` (n, 3) and any per-point arrays (first dimension n:
``colour`` (n, 3) in [0, 1], ``normal`` (n, 3), ``intensity`` (n,), ``label`` (n,),
``feat`` (n, c), ...) plus per-sample values (``label`` () for classification,
``category`` ()). Transforms that drop or reorder points apply the same index to
every per-point array; geometric ones move ``coord`` and rotate/flip ``normal``.

Randomness comes from the ``rng`` argument (a ``numpy.random.Generator``)::

    t = Compose([RandomRotate(axis="z"), RandomScale((0.9, 1.1))])
    sample = t(sample, rng=np.random.default_rng(0))

Datasets pass a generator seeded per worker (and epoch) so runs are reproducible;
without ``rng`` a transform falls back to its own unseeded generator.

From YAML, a list of ``{name: ..., <params>}`` is validated by
:func:`build_transforms` (unknown names or parameters raise ConfigError)::

    - {name: random_rotate, axis: z, angle: [-180, 180]}
    - {name: random_jitter, sigma: 0.01, clip: 0.05}
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import ConfigDict, ValidationError, create_model

from sciformer.errors import ConfigError, DataError
from sciformer.utils.suggest import did_you_mean

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
        centred = coord - coord.mean(axis=0)
        radius = float(np.linalg.norm(centred, axis=1).max())
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


class RandomDropout(Transform):
    """With probability ``p``, drop a fraction ``ratio`` of the points (at least one kept).

    Shapes: per-point arrays (n, ...) -> (m, ...), m = n - floor(n * ratio).
    """

    random = True

    keeps_points = False

    def __init__(self, ratio: float = 0.2, p: float = 0.5) -> None:
        if not 0 <= ratio < 1:
            raise ConfigError(f"RandomDropout.ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)
        self.p = float(p)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        n = num_points(sample)
        if n == 0 or rng.random() >= self.p:
            return sample
        keep = max(1, n - int(n * self.ratio))
        index = np.sort(rng.choice(n, keep, replace=False))  # (m,)
        return index_points(sample, index)


class ShufflePoints(Transform):
    """Randomly permute the points.

    Shapes: per-point arrays (n, ...) -> (n, ...).
    """

    random = True

    keeps_points = False

    def __init__(self) -> None:
        pass

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        return index_points(sample, rng.permutation(num_points(sample)))


class RandomSample(Transform):
    """Keep ``n`` random points (without replacement; with replacement only if fewer).

    Shapes: per-point arrays (m, ...) -> (n, ...).
    """

    random = True

    keeps_points = False

    def __init__(self, n: int) -> None:
        if n <= 0:
            raise ConfigError(f"RandomSample.n must be positive, got {n}")
        self.n = int(n)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        rng = self._rng(rng)
        m = num_points(sample)
        if m == 0:
            raise DataError("RandomSample: empty point cloud (0 points)")
        index = rng.choice(m, self.n, replace=m < self.n)  # (n,)
        return index_points(sample, index)


class FixedPoints(Transform):
    """Keep the first ``n`` points (deterministic); fewer points are repeated cyclically.

    Shapes: per-point arrays (m, ...) -> (n, ...).
    """

    keeps_points = False

    def __init__(self, n: int) -> None:
        if n <= 0:
            raise ConfigError(f"FixedPoints.n must be positive, got {n}")
        self.n = int(n)

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        m = num_points(sample)
        if m == 0:
            raise DataError("FixedPoints: empty point cloud (0 points)")
        return index_points(sample, np.arange(self.n) % m)


def grid_sample_indices(
    coord: np.ndarray, size: float, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One point per occupied voxel of edge ``size`` (voxels from :func:`sciformer.geometry.grid_pool`).

    Voxels are anchored at the cloud's minimum corner and computed in float64.
    Without ``rng`` the lowest-index point of each voxel is kept (deterministic);
    with it, a uniformly random one. Returns ``keep`` (m,) original indices ordered
    by voxel and ``inverse`` (n,) with ``keep[inverse[i]]`` in the voxel of point i,
    so values on the kept points map back to every point as ``values[inverse]``.
    """
    from sciformer.geometry import grid_pool

    if not size > 0:
        raise ConfigError(f"grid size must be positive, got {size}")
    n = coord.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pooled = grid_pool(torch.from_numpy(np.ascontiguousarray(coord, dtype=np.float64)), float(size))
    inverse = pooled.cluster.numpy()  # (n,)
    if rng is None:
        return pooled.index.numpy(), inverse
    count = pooled.count.numpy()  # (m,)
    order = np.argsort(inverse, kind="stable")  # (n,) points grouped by voxel
    starts = np.cumsum(count) - count  # (m,)
    keep = order[starts + (rng.random(len(count)) * count).astype(np.int64)]
    return keep, inverse


class GridSample(Transform):
    """Keep one point per voxel of edge ``size`` (random in ``train`` mode, first in ``test``).

    Stores ``inverse`` (n_original,) so predictions on the kept points map back to
    every original point (``pred[inverse]``); repeated grid sampling composes it.

    Shapes: per-point arrays (n, ...) -> (m, ...); inverse (n_original,).
    """

    keeps_points = False

    def __init__(self, size: float = 0.04, mode: Literal["train", "test"] = "train") -> None:
        if size <= 0:
            raise ConfigError(f"GridSample.size must be positive, got {size}")
        if mode not in ("train", "test"):
            raise ConfigError(f"GridSample.mode must be 'train' or 'test', not {mode!r}")
        self.size = float(size)
        self.mode = mode
        self.random = mode == "train"

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        if num_points(sample) == 0:
            raise DataError("GridSample: empty point cloud (0 points)")
        rng = self._rng(rng) if self.mode == "train" else None
        keep, inverse = grid_sample_indices(sample["coord"], self.size, rng)
        out = index_points(sample, keep)
        previous = sample.get("inverse")
        out["inverse"] = inverse if previous is None else inverse[previous]
        return out


class SphereCrop(Transform):
    """Keep the ``n`` points nearest to a centre: a random point (``random``) or the bbox centre.

    Clouds with at most ``n`` points are unchanged.

    Shapes: per-point arrays (m, ...) -> (min(m, n), ...).
    """

    random = True

    keeps_points = False

    def __init__(self, n: int = 80000, mode: Literal["random", "center"] = "random") -> None:
        if n <= 0:
            raise ConfigError(f"SphereCrop.n must be positive, got {n}")
        if mode not in ("random", "center"):
            raise ConfigError(f"SphereCrop.mode must be 'random' or 'center', not {mode!r}")
        self.n = int(n)
        self.mode = mode

    def __call__(self, sample: Sample, rng: np.random.Generator | None = None) -> Sample:
        m = num_points(sample)
        if m <= self.n:
            return sample
        coord = sample["coord"]  # (m, 3)
        if self.mode == "random":
            centre = coord[self._rng(rng).integers(m)]
        else:
            centre = (coord.min(axis=0) + coord.max(axis=0)) / 2.0
        dist = np.sum((coord - centre) ** 2, axis=1)  # (m,)
        index = np.sort(np.argpartition(dist, self.n - 1)[: self.n])  # (n,)
        return index_points(sample, index)


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


# --------------------------------------------------------------------------- from config

TRANSFORMS: dict[str, type[Transform]] = {
    "center_shift": CenterShift,
    "normalize_scale": NormalizeScale,
    "random_rotate": RandomRotate,
    "random_scale": RandomScale,
    "random_jitter": RandomJitter,
    "random_flip": RandomFlip,
    "chromatic_auto_contrast": ChromaticAutoContrast,
    "chromatic_jitter": ChromaticJitter,
    "random_dropout": RandomDropout,
    "shuffle_points": ShufflePoints,
    "random_sample": RandomSample,
    "fixed_points": FixedPoints,
    "grid_sample": GridSample,
    "sphere_crop": SphereCrop,
    "to_tensor": ToTensor,
}
_CLASS_NAMES = {cls.__name__: name for name, cls in TRANSFORMS.items()}
_PARAM_MODELS: dict[str, Any] = {}


def _param_model(name: str) -> Any:
    """A pydantic model (unknown keys forbidden) of a transform's __init__ parameters."""
    if name not in _PARAM_MODELS:
        cls = TRANSFORMS[name]
        fields: dict[str, Any] = {}
        hints = typing.get_type_hints(cls.__init__)
        for pname, param in list(inspect.signature(cls.__init__).parameters.items())[1:]:
            annotation = hints.get(pname, Any)
            default = param.default if param.default is not inspect.Parameter.empty else ...
            fields[pname] = (annotation, default)
        _PARAM_MODELS[name] = create_model(
            f"{cls.__name__}Params", __config__=ConfigDict(extra="forbid"), **fields
        )
    return _PARAM_MODELS[name]


def transform_names() -> list[str]:
    """Names accepted in a YAML transform list."""
    return sorted(TRANSFORMS)


def build_transform(spec: dict[str, Any], key: str = "transforms[0]") -> Transform:
    """One transform from ``{name: ..., <params>}``; ``key`` is the dotted config key for errors."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{key}: expected a mapping with 'name' (e.g. {{name: random_scale}}), got {spec!r}")
    raw_name = str(spec["name"])
    name = _CLASS_NAMES.get(raw_name, raw_name)
    if name not in TRANSFORMS:
        hint = did_you_mean(raw_name, list(TRANSFORMS) + list(_CLASS_NAMES))
        raise ConfigError(f"{key}.name: unknown transform '{raw_name}'{hint}; valid transforms: {', '.join(transform_names())}")
    params = {k: v for k, v in spec.items() if k != "name"}
    model = _param_model(name)
    try:
        parsed = model(**params)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            valid = ", ".join(model.model_fields) or "(none)"
            hint = did_you_mean(loc, model.model_fields)
            raise ConfigError(f"{key}.{loc}: unknown parameter of {name}{hint}; valid: {valid}") from None
        raise ConfigError(f"{key}.{loc}: {err['msg']}") from None
    try:
        return TRANSFORMS[name](**{k: getattr(parsed, k) for k in model.model_fields})
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def build_transforms(specs: Sequence[dict[str, Any]] | None, key: str = "transforms") -> Compose:
    """A :class:`Compose` from a YAML list of ``{name: ..., <params>}`` (None: empty)."""
    if specs is None:
        return Compose([])
    if not isinstance(specs, (list, tuple)):
        raise ConfigError(f"{key}: expected a list of transforms, got {type(specs).__name__}")
    return Compose([build_transform(spec, f"{key}[{i}]") for i, spec in enumerate(specs)])


def check_transform_specs(specs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Pydantic ``AfterValidator``: fail config validation early on a bad transform list."""
    build_transforms(specs, key="")
    return specs


__all__ = [
    "Compose", "CenterShift", "NormalizeScale", "RandomRotate", "RandomScale", "RandomJitter",
    "RandomFlip", "ChromaticAutoContrast", "ChromaticJitter", "RandomDropout", "ShufflePoints",
    "RandomSample", "FixedPoints", "GridSample", "SphereCrop", "ToTensor", "Transform",
    "TRANSFORMS", "build_transform", "build_transforms", "check_transform_specs",
    "grid_sample_indices", "index_points", "point_keys", "rotation_matrix", "transform_names",
]
