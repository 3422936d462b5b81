"""Parameters of the ``hsi_scene`` dataset (the ``data:`` section), validated by pydantic.

See :mod:`sciformer.data.hsi.task` for every key with its default.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sciformer.contracts import SEED_MAX, check_patch_size
from sciformer.data.hsi.wavelengths import given_nanometres

# ----------------------------------------------------------------------------- config

_FIXED_ONLY = ("train_path", "test_path", "train_key", "test_key")
_STRATIFIED_ONLY = ("train_per_class",)
_BLOCKS_ONLY = ("block_size", "train_fraction", "margin")


class SplitConfig(BaseModel):
    """How labelled pixels are divided into train / val / test."""

    model_config = ConfigDict(extra="forbid")
    # each kind's own keys: another kind refuses them, and an override of ``kind`` drops those the YAML set
    KIND_OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"fixed": _FIXED_ONLY, "stratified": _STRATIFIED_ONLY, "blocks": _BLOCKS_ONLY}

    kind: Literal["fixed", "stratified", "blocks"] = "blocks"
    # fixed: label maps of the training and test pixels (test_path defaults to train_path)
    train_path: str | None = None
    test_path: str | None = None
    train_key: str | None = None  # null: 'TR' if present, else the only 2-D integer array
    test_key: str | None = None  # null: 'TE' if present, else the only 2-D integer array
    # stratified: int = pixels per class, float in (0, 1) = fraction per class
    train_per_class: int | float = 0.1
    # blocks
    block_size: int = Field(12, ge=1)
    train_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    margin: int | None = Field(None, ge=0)
    # validation, from training pixels only
    val_fraction: float | None = Field(0.1, ge=0.0, lt=1.0)
    val_per_class: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)  # null: train.seed

    @field_validator("train_per_class", mode="before")
    @classmethod
    def _count_or_fraction(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected an int count or a float fraction in (0, 1), got a boolean")
        return v

    @field_validator("train_per_class")
    @classmethod
    def _check_train_per_class(cls, v: int | float) -> int | float:
        if isinstance(v, int):
            if v < 1:
                raise ValueError(f"an int is a pixel count per class and must be >= 1, got {v}")
        elif not 0.0 < v < 1.0:
            raise ValueError(f"a float is a fraction per class and must be in (0, 1), got {v}; use an int for a count")
        return v

    @model_validator(mode="after")
    def _check_kind_options(self) -> SplitConfig:
        given = self.model_fields_set
        fields = type(self).model_fields
        for kind, keys in self.KIND_OPTIONS.items():
            if kind == self.kind:
                continue
            for key in keys:  # a dumped config repeats defaults: only a changed value is an error
                if key in given and getattr(self, key) != fields[key].default:
                    raise ValueError(f"split.{key} applies to kind '{kind}', not to kind '{self.kind}'")
        if self.kind == "fixed" and not self.train_path:
            raise ValueError("split.train_path is required for kind 'fixed' (a file with the training label map)")
        if "val_per_class" in given and self.val_per_class is not None:
            if "val_fraction" in given and self.val_fraction is not None:
                raise ValueError("give split.val_fraction or split.val_per_class, not both")
            self.val_fraction = None
        return self


class AugmentConfig(BaseModel):
    """Training-patch augmentation: random flips / 90-degree rotations (on by default) and
    two spectral ones (off by default): ``illumination`` multiplies each patch's raw
    spectra by one factor drawn uniformly from [1 - a, 1 + a] (a brighter or darker scene,
    applied exactly through the affine normalisation), ``noise`` adds Gaussian noise of
    that standard deviation in normalised units (for standardised bands: a fraction of
    each band's spread)."""

    model_config = ConfigDict(extra="forbid")

    flip: bool = True
    rotate: bool = True
    illumination: float = Field(0.0, ge=0.0, lt=1.0)
    noise: float = Field(0.0, ge=0.0, le=10.0)


class HSISceneConfig(BaseModel):
    """Parameters of the ``hsi_scene`` dataset (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    source: str = "indian_pines"
    image_key: str | None = None
    label_key: str | None = None
    label_path: str | None = None
    wavelength_key: str | None = None
    wavelengths: list[float] | None = None  # band centres in nm, one per band of the cube
    class_names: list[str] | None = None
    patch_size: int = 7
    padding: Literal["reflect", "symmetric", "edge", "zero"] = "reflect"
    normalise: Literal["standard", "minmax", "none"] = "standard"
    pca_components: int | None = Field(None, ge=1)
    split: SplitConfig = Field(default_factory=SplitConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)

    @field_validator("source")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("expected a built-in scene name (indian_pines) or a file path")
        return v

    @field_validator("patch_size")
    @classmethod
    def _odd(cls, v: int) -> int:
        return check_patch_size(v, key="", error=ValueError)

    @field_validator("wavelengths")
    @classmethod
    def _wavelengths(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        return [float(w) for w in given_nanometres(v, None, "band centres", ValueError)]

    @field_validator("class_names")
    @classmethod
    def _names(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("expected a non-empty list of class names")
            dup = sorted({n for n in v if v.count(n) > 1})
            if dup:
                raise ValueError(f"duplicate class names: {', '.join(dup)}")
        return v

    @field_validator("augment", mode="before")
    @classmethod
    def _augment_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            return {"flip": v, "rotate": v}  # spectral augmentation stays at its default (off)
        return v

    @property
    def margin(self) -> int:
        return self.patch_size // 2 if self.split.margin is None else self.split.margin


