"""Transforms from YAML lists of ``{name: ..., <params>}``, validated like the rest of the config."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, ValidationError, create_model

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
from sciformer.registry import Registry
from sciformer.utils.suggest import did_you_mean

# --------------------------------------------------------------------------- from config

TRANSFORMS = Registry("transform", builtins=False)  # YAML name (or class name) -> transform class


def _param_model(cls: type[Transform]) -> Any:
    """A pydantic model (unknown keys forbidden) of a transform's __init__ parameters."""
    fields: dict[str, Any] = {}
    hints = typing.get_type_hints(cls.__init__)
    for pname, param in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        annotation = hints.get(pname, Any)
        default = param.default if param.default is not inspect.Parameter.empty else ...
        fields[pname] = (annotation, default)
    return create_model(f"{cls.__name__}Params", __config__=ConfigDict(extra="forbid"), **fields)


for _name, _cls in {
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
}.items():
    TRANSFORMS.register(_name, config=_param_model(_cls), aliases=(_cls.__name__,))(_cls)


def transform_names() -> list[str]:
    """Names accepted in a YAML transform list."""
    return TRANSFORMS.names()


def build_transform(spec: dict[str, Any], key: str = "transforms[0]") -> Transform:
    """One transform from ``{name: ..., <params>}``; ``key`` is the dotted config key for errors."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{key}: expected a mapping with 'name' (e.g. {{name: random_scale}}), got {spec!r}")
    entry = TRANSFORMS.get(str(spec["name"]), key=f"{key}.name")
    name, model = entry.name, entry.config
    params = {k: v for k, v in spec.items() if k != "name"}
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
        return entry.builder(**{k: getattr(parsed, k) for k in model.model_fields})
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


# A config field holding a transform list (None: the dataset's default), checked when the config loads.
TransformList = Annotated[list[dict[str, Any]] | None, AfterValidator(check_transform_specs)]
