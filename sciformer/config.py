"""Experiment schema, loading and command-line overrides.

An experiment YAML holds only what differs from the defaults below::

    name: indian_pines_demo
    data:   {name: hsi_scene, source: indian_pines, split: {kind: blocks}}
    model:  {name: spectral_spatial}
    train:  {epochs: 30, batch_size: 64}

``data`` and ``model`` name a registered dataset / model; their remaining keys are
validated by that entry's own parameter model. Unknown keys are errors everywhere,
and every error becomes one :class:`~sciformer.errors.ConfigError` line naming the
dotted key and the closest valid key or the expected type.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sciformer.config_kinds import settle_kinds
from sciformer.config_numbers import bool_for_number
from sciformer.contracts import METRIC_NAMES, SEED_MAX, plain_scalar
from sciformer.errors import ConfigError
from sciformer.frontend import from_python
from sciformer.registry import DATASETS, MODELS, Registry
from sciformer.utils import yamlio
from sciformer.utils.suggest import did_you_mean


class Section(BaseModel):
    """A config section: unknown keys forbidden, values checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class NamedSection(BaseModel):
    """``name`` of a registry entry plus that entry's parameters (validated later)."""

    model_config = ConfigDict(extra="allow")
    name: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class OptimizerConfig(Section):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0, le=100)
    weight_decay: float = Field(0.01, ge=0, le=100)
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = Field(0.9, ge=0, lt=1)  # sgd only
    nesterov: bool = False  # sgd only

    @field_validator("betas")
    @classmethod
    def _check_betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _check_nesterov(self) -> OptimizerConfig:
        if self.name == "sgd" and self.nesterov and self.momentum <= 0:
            raise ValueError("optimizer.nesterov needs optimizer.momentum > 0")
        return self


MAX_EPOCHS = 1_000_000
MAX_BATCH = 1_048_576
MAX_STEPS = 10**9
MAX_NAME = 100
MAX_MODEL_SIZE = 16_384  # model widths: beyond this a typo, not a model
MAX_MODEL_COUNT = 1_024  # depths, blocks, heads, neighbours (k)
MAX_HIDDEN_WIDTH = 4 * MAX_MODEL_SIZE  # an MLP's hidden width: the widest model at the usual mlp_ratio 4
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d{1,3})?)$")
_SIZE_KEY = re.compile(r"(^|_)(dim|dims|depth|channels|hidden|width|widths|heads|blocks|planes|tokens|embed|k)(_|$)")
_COUNT_KEY = re.compile(r"(^|_)(depth|heads|blocks|k)(_|$)")


def check_batch_size(value: Any, name: str) -> int:
    """``value`` as a batch size in 1..:data:`MAX_BATCH` (numpy's and torch's whole numbers too), for
    the command line's ``--batch-size`` and the API's ``batch_size``; a one-line ConfigError otherwise."""
    value = plain_scalar(value)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 1 <= value <= MAX_BATCH:
        raise ConfigError(f"{name} must be a whole number in 1..{MAX_BATCH}, got {value!r:.40}")
    return int(value)  # numpy's uint8 would overflow in the batch arithmetic


class ScheduleConfig(Section):
    name: Literal["cosine", "step", "constant"] = "cosine"
    warmup_epochs: float = Field(0.0, ge=0, le=MAX_EPOCHS)
    min_lr_ratio: float = Field(0.01, ge=0, le=1)  # cosine floor as a fraction of lr
    step_epochs: int = Field(30, ge=1, le=MAX_EPOCHS)  # step only
    gamma: float = Field(0.1, gt=0, le=1)  # step only


class TrainConfig(Section):
    epochs: int = Field(100, ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    seed: int = Field(0, ge=0, le=SEED_MAX)
    deterministic: bool = False
    grad_clip: float | None = Field(None, gt=0)
    amp: Literal["none", "bf16", "fp16"] = "none"  # fp16 only on CUDA
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    # cross-entropy weight per class: none; inverse_sqrt (1 / sqrt(class frequency) over the training
    # labels, scaled so that the average training label weighs 1; rare classes count more); or one
    # number per class
    class_weights: Literal["none", "inverse_sqrt"] | list[Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]] = "none"
    # exponential moving average of the weights (decay d, e.g. 0.999): validation, best.pt and the test
    # use the average, training continues from the raw weights (sciformer.engine.ema); null: off
    ema: float | None = Field(None, gt=0, lt=1)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_workers: int = Field(0, ge=0, le=256)
    threads: int | None = Field(None, ge=1, le=4096, description=(  # torch intra-op threads
        "torch intra-op threads; null: the measured best for the cores at hand, 1 on 1-2 cores "
        "(one thread trained every model measured 1.24-3x faster per step than two there; "
        "benchmarks/bench_cpu_threads.py), torch's default on more cores (not measured)"))
    val_every: int = Field(1, ge=1, le=MAX_EPOCHS)
    # validation metric that chooses best.pt (loss is minimised). A tie (exact equality: the metrics
    # are ratios of counts, so a saturated validation split repeats them) goes to the lower
    # validation loss; such a tie-broken improvement replaces best.pt and resets early_stop_patience.
    monitor: str = "oa"
    early_stop_patience: int | None = Field(None, ge=1, le=MAX_EPOCHS)  # validations without a new best.pt
    init_from: str | None = Field(None, max_length=4096, description=(  # set by `sciformer train --init-from`
        "checkpoint (or run folder: its best.pt) whose tensors matching by name and shape start the run; "
        "relative to the config's folder; not optimizer/schedule/epoch (that is --resume)"))
    max_steps_per_epoch: int | None = Field(None, ge=1, le=MAX_STEPS)
    checkpoint_every_steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    progress: Literal["auto", "always", "never"] = "auto"
    tensorboard: bool = False  # also log each epoch's metrics to <run>/tensorboard

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError(f"unknown device {_short(v)}; expected auto, cpu, cuda, cuda:N or mps")
        return v


class EvaluationConfig(Section):
    batch_size: int = Field(256, ge=1, le=MAX_BATCH)  # samples per batch (each brings ``votes`` copies)
    split: Literal["test", "val"] = "test"
    votes: int = Field(1, ge=1, le=100)  # test-time voting in the final evaluation (classification datasets)
    # whole-scene segmentation (point_scenes, las_tiles, s3dis): the final evaluation's views of each
    # scene, softmax summed per point, as ``sciformer predict --tta-rotations / --tta-flip / --overlap``
    tta_rotations: int = Field(1, ge=1, le=100, strict=True)  # equal turns about z, the first unturned (true is not 1)
    tta_flip: bool = False  # each turn also mirrored in x
    overlap: float = Field(0.0, ge=0.0, le=4.0)  # context points per core point of a chunk (0: the evaluation items)


class ExportConfig(Section):
    npy: bool = True
    png: bool = True
    envi: bool = True
    ply: bool = True


class ExperimentConfig(Section):
    """The whole experiment."""

    name: str = "experiment"
    description: str = ""
    data: NamedSection
    model: NamedSection
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: TrainConfig = TrainConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    export: ExportConfig = ExportConfig()

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        bad = not v or len(v) > MAX_NAME or v in (".", "..") or any(c in v for c in "/\\:") or not v.isprintable() or v != v.strip()
        if bad:
            raise ValueError(f"expected a file-name component of 1..{MAX_NAME} printable characters without '/', '\\' or ':' "
                             "(the run folder is runs/<name>-<time>)")
        return v

    @model_validator(mode="after")
    def _check_monitor(self) -> ExperimentConfig:
        if self.train.monitor not in METRIC_NAMES:
            raise ValueError(f"train.monitor must be one of {', '.join(METRIC_NAMES)}, got '{self.train.monitor}'")
        return self


class Experiment:
    """A validated experiment: the schema object plus the typed data/model parameters."""

    def __init__(self, cfg: ExperimentConfig, data_params: BaseModel, model_params: BaseModel, base_dir: Path) -> None:
        self.cfg = cfg
        self.data_params = data_params
        self.model_params = model_params
        self.base_dir = base_dir

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config (defaults filled in) as plain data."""
        out = self.cfg.model_dump(mode="json")
        out["data"] = {"name": self.cfg.data.name, **self.data_params.model_dump(mode="json")}
        out["model"] = {"name": self.cfg.model.name, **self.model_params.model_dump(mode="json")}
        return out

    def to_yaml(self) -> str:
        return yamlio.dumps(self.to_dict())


# ---------------------------------------------------------------------------- errors


def _fields_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """Field names of the nested model reached by ``loc`` (for suggestions)."""
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        annotation = model.model_fields[part].annotation
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        model = next((a for a in candidates if issubclass(a, BaseModel)), None)
    return list(model.model_fields) if model is not None else []


def _one_line(exc: ValidationError, model: type[BaseModel], prefix: str = "", source: str = "") -> ConfigError:
    """Turn the first pydantic error into one line naming the dotted key."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    key = ".".join([prefix] * bool(prefix) + [str(p) for p in loc]) or (prefix or "<root>")
    where = f"{source}: " if source else ""
    if err["type"] == "extra_forbidden":
        hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1]))
        if hint:
            parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
            hint = hint.replace("'", f"'{parent}", 1)
        return ConfigError(f"{where}unknown key '{key}'{hint}")
    if err["type"] == "missing":
        return ConfigError(f"{where}missing required key '{key}'")
    msg = err["msg"].removeprefix("Value error, ")
    if loc:
        return ConfigError(f"{where}{key}: {msg} (got {_short(err.get('input'))})")
    if prefix and not msg.startswith(f"{prefix}."):  # a whole-section check (model validator): name the section
        return ConfigError(f"{where}{prefix}: {msg}")
    return ConfigError(f"{where}{msg}")


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 10 MB value never prints 10 MB)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 20] + f"... ({len(text)} chars)"


def _check_values(node: Any, key: str, source: str) -> None:
    """Refuse NaN/inf anywhere, and absurd model sizes (a typo like 1e6 would allocate terabytes)."""
    where = f"{source}: " if source else ""
    if isinstance(node, dict):
        for k, v in node.items():
            _check_values(v, f"{key}.{k}" if key else str(k), source)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _check_values(v, f"{key}.{i}", source)
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{where}{key}: expected a finite number, got {node}")
    if key.startswith("model.") and _SIZE_KEY.search(key.split(".")[1]):
        top = MAX_MODEL_COUNT if _COUNT_KEY.search(key.split(".")[1]) else MAX_MODEL_SIZE
        sizes = node if isinstance(node, (list, tuple)) else [node]
        for v in sizes:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > top:
                raise ConfigError(f"{where}{key}: {_short(v)} is beyond the largest model size {top}")


# ---------------------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.epochs=5"`` -> (["train", "epochs"], 5); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.sub=value")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override '{text}' has an empty key part")
    return parts, yamlio.loads(value, source=f"override {_short(text)}") if value.strip() else ""


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides to a raw config mapping (returns a copy)."""
    out = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override '{text}': '{'.'.join(parts[: i + 1])}' is not a section")
            node = child
        node[parts[-1]] = value
    return out


# ---------------------------------------------------------------------------- loading


def _no_bool_for_a_number(model: type[BaseModel], values: Any, key: str, source: str) -> None:
    found = bool_for_number(model, values, key)
    if found:
        raise ConfigError(f"{source}: {found}" if source else found)


def _validate_entry(registry: Registry, section: NamedSection, key: str, source: str) -> BaseModel:
    entry = registry.get(section.name, key=f"{key}.name")
    _no_bool_for_a_number(entry.config, section.params(), key, source)
    try:
        return entry.config.model_validate(section.params())
    except ValidationError as exc:
        raise _one_line(exc, entry.config, prefix=key, source=source) from None


def validate(raw: Any, *, base_dir: Path, source: str = "") -> Experiment:
    """Validate a raw mapping into an :class:`Experiment`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source or 'config'}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    _check_values(raw, "", source)
    _no_bool_for_a_number(ExperimentConfig, raw, "", source)  # its sections; data and model parameters below
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise _one_line(exc, ExperimentConfig, source=source) from None
    data_params = _validate_entry(DATASETS, cfg.data, "data", source)
    model_params = _validate_entry(MODELS, cfg.model, "model", source)
    _check_hidden_width(model_params, source)
    return Experiment(cfg, data_params, model_params, base_dir)


def _check_hidden_width(params: Any, source: str) -> None:
    """``model.mlp_ratio`` times the model's widest width (``dim``, ``channels`` or ``decoder_channels``) within :data:`MAX_HIDDEN_WIDTH`."""
    ratio = getattr(params, "mlp_ratio", None)
    widths = [getattr(params, "dim", None) or 0, *(getattr(params, "channels", None) or []), *(getattr(params, "decoder_channels", None) or [])]
    if isinstance(ratio, (int, float)) and max(widths) * ratio > MAX_HIDDEN_WIDTH:
        raise ConfigError(f"{source + ': ' if source else ''}model.mlp_ratio: {ratio:g} makes an MLP hidden width of "
                          f"{max(widths) * ratio:.4g} ({max(widths)} x {ratio:g}), beyond the largest {MAX_HIDDEN_WIDTH}")


@contextlib.contextmanager
def blame_overrides(overrides: list[str] | None, source: str) -> Iterator[None]:
    """A config error about a key set on the command line names that override, not ``source``."""
    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        for override in reversed(overrides or []):
            key = override.partition("=")[0].strip()
            rest = text.removeprefix(f"{source}: ")
            if rest != text and (rest.startswith((f"{key}:", f"{key}.")) or f"'{key}'" in rest):
                raise ConfigError(f"{'override' if from_python() else 'command line'} '{override}': {rest}") from None
        raise


def load(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Load, override and validate an experiment YAML."""
    path = Path(path)
    raw = yamlio.load_file(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    raw = _overridden(raw, overrides or [], str(path))
    with blame_overrides(overrides, str(path)):
        return validate(raw, base_dir=path.resolve().parent, source=str(path))


def from_dict(raw: dict[str, Any], base_dir: Path, overrides: list[str] | None = None, *, source: str = "checkpoint config") -> Experiment:
    """Validate a resolved config stored in a checkpoint or run folder."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    with blame_overrides(overrides, source):
        return validate(_overridden(raw, overrides or [], source), base_dir=base_dir, source=source)


def _overridden(raw: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """``raw`` with ``overrides`` applied; keys ``source`` set for a kind or model an override switched away from left out."""
    return settle_kinds(apply_overrides(raw, overrides), [(t, *parse_override(t)) for t in overrides], source,
                        {"data": DATASETS, "model": MODELS})
