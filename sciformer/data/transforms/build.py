"""Transforms from YAML lists of ``{name: ..., <params>}``, validated like the rest of the config."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict, ValidationError, create_model

from sciformer.data.transforms.base import (
    Compose,
    ToTensor,
    Transform,
)
from sciformer.data.transforms.colour import ChromaticAutoContrast, ChromaticJitter
from sciformer.data.transforms.geometric import (
    CenterShift,
    NormalizeScale,
    RandomFlip,
    RandomJitter,
    RandomRotate,
    RandomScale,
)
from sciformer.data.transforms.sampling import (
    FixedPoints,
    GridSample,
    RandomDropout,
    RandomSample,
    ShufflePoints,
    SphereCrop,
)
from sciformer.errors import ConfigError
from sciformer.utils.suggest import did_you_mean

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
