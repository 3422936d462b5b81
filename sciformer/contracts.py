"""The contract between a dataset and the engine.

A dataset registered in :data:`sciformer.registry.DATASETS` is a builder::

    @DATASETS.register("hsi_scene", config=HSISceneConfig, predictor=predict_hsi_file)
    def build_hsi_scene(cfg: HSISceneConfig, ctx: BuildContext) -> TaskData: ...

The engine only talks to :class:`TaskData`: it asks for the three splits as torch
datasets, collates items into batch dicts (``batch["target"]`` holds the labels,
int64, ``ignore_index`` where unlabelled), passes the whole batch dict to the model
(``model(batch) -> logits (n, num_classes)`` with ``n == batch["target"].numel()``),
and lets the task write what is specific to it (split masks, maps, point files).

``state()`` is stored in every checkpoint (plain tensors, numbers, strings, lists
and dicts only, so checkpoints load with ``weights_only=True``); the dataset's
``predictor`` receives it to predict a new file exactly as the model was trained
(same normalisation, same class names).
"""

from __future__ import annotations

import math
import numbers
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from sciformer.errors import ConfigError, DataError, SciformerError
from sciformer.frontend import option

Batch = dict[str, Any]
PredictFn = Callable[[Batch], torch.Tensor]  # batch dict -> logits (n, num_classes)
# Optional batch key: (num_classes,) bool, False for classes the model may never predict (no
# training pixel, e.g. label ids that were never used); see :func:`masked_logits`.
CLASS_MASK = "class_mask"


def masked_logits(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``logits`` (n, C) with the classes ``batch[CLASS_MASK]`` rules out set to -inf (never the
    arg-max, probability exactly 0); ``logits`` itself when the batch carries no mask."""
    mask = batch.get(CLASS_MASK)
    if mask is None:
        return logits
    return logits.masked_fill(~torch.as_tensor(mask, dtype=torch.bool, device=logits.device), float("-inf"))
# (target, pred) per-point label arrays, e.g. one pair per whole scene -> JSON-ready scores.
# The engine supplies it (sciformer.engine.metrics.label_scorer) so scores have one home.
ScoreFn = Callable[[Iterable[tuple[np.ndarray, np.ndarray]]], dict[str, Any]]

SPLITS = ("train", "val", "test")
# Validation scores ``train.monitor`` may name (``loss`` is minimised, the others maximised).
# The part metrics need a task whose DataInfo declares ``category_parts`` (sciformer.engine.metrics.PartIoU).
PART_METRIC_NAMES = ("instance_miou", "category_miou")
METRIC_NAMES = ("oa", "aa", "macc", "kappa", "miou", *PART_METRIC_NAMES, "loss")


def default_data_root() -> Path:
    """Folder of real data: ``$SCIFORMER_DATA`` or ``../shared/data`` beside the repo."""
    env = os.environ.get("SCIFORMER_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def default_cache_dir() -> Path:
    """Preprocessing cache: ``$SCIFORMER_CACHE`` or ``~/.cache/sciformer``."""
    env = os.environ.get("SCIFORMER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sciformer"


@dataclass
class BuildContext:
    """What a dataset builder gets besides its config."""

    base_dir: Path  # relative paths in the config resolve against this (the config's folder)
    cache_dir: Path = field(default_factory=default_cache_dir)
    seed: int = 0

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """Resolve a config path: ``~`` and ``$VARS`` expanded, relative to ``base_dir``.

        ``$SCIFORMER_DATA`` falls back to :func:`default_data_root` when unset, so
        experiment files can name real data portably.
        """
        text = os.fspath(path)
        if "SCIFORMER_DATA" not in os.environ:
            root = str(default_data_root())
            text = text.replace("${SCIFORMER_DATA}", root).replace("$SCIFORMER_DATA", root)
        p = Path(os.path.expandvars(text)).expanduser()
        return p if p.is_absolute() else (self.base_dir / p)


def plain_scalar(value: Any) -> Any:
    """A torch or numpy 0-d value as the Python number or bool it holds; anything else as it is."""
    return value.item() if getattr(value, "ndim", None) == 0 and hasattr(value, "item") else value


def _real(value: Any) -> bool:
    """A finite real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class PredictOptions:
    """How a dataset's ``predictor`` treats a new file (``sciformer predict`` flags).

    A predictor accepts the options that apply to its task and refuses the others
    with :meth:`require_defaults`, so a flag is never silently ignored.
    """

    overlap: float = 0.25  # point scenes: context points per core point of a chunk (--overlap)
    rotations: int = 1  # point scenes: test-time turns about z, the first unturned (--tta-rotations)
    flip: bool = False  # point scenes: each view also mirrored in x (--tta-flip)
    votes: int = 1  # shape classification: augmented copies averaged (--votes)
    probabilities: bool = False  # per-point / per-pixel outputs also carry class probabilities (--probabilities)
    columns: str | None = None  # point files without a header (raw .bin scans): "x,y,z,intensity[:float32]" (--columns)
    category: str | None = None  # part segmentation: the shape's category, e.g. Airplane (--category)
    labels: str | None = None  # hyperspectral: a ground-truth label map for the figure and metrics (--labels)
    # hyperspectral: the input's band centres in nm (a list, or a .hdr/.npy/text file or 'a,b,...'; --wavelengths)
    wavelengths: Any = None
    allow_band_mismatch: bool = False  # hyperspectral: run an index-position model on other band centres (--allow-band-mismatch)
    match_frame: bool = False  # part segmentation: centre and scale the shape into the training shapes' frame (--match-frame)

    FLAGS = {"overlap": "--overlap", "rotations": "--tta-rotations", "flip": "--tta-flip", "votes": "--votes",  # noqa: RUF012
             "probabilities": "--probabilities", "columns": "--columns", "category": "--category", "labels": "--labels",
             "wavelengths": "--wavelengths", "allow_band_mismatch": "--allow-band-mismatch", "match_frame": "--match-frame"}
    # Options only the predictors that name them in ``start_prediction(accept=...)`` take; the others refuse them.
    OPT_IN = ("wavelengths", "allow_band_mismatch", "match_frame")

    def __post_init__(self) -> None:
        for name in ("overlap", "rotations", "votes", "flip", "probabilities", "allow_band_mismatch", "match_frame"):
            object.__setattr__(self, name, plain_scalar(getattr(self, name)))  # numpy's / torch's: Python's
        if self.wavelengths is not None and not isinstance(self.wavelengths, (str, os.PathLike)):
            given = self.wavelengths
            given = given.detach().cpu() if hasattr(given, "detach") else given  # a torch tensor, even one requiring grad
            try:
                arr = np.asarray(given, dtype=np.float64)
            except (TypeError, ValueError):
                raise DataError("wavelengths: expected a list of band centres in nm, a file or 'a,b,...'") from None
            # frozen: a hashable tuple of nm; an array that is no column ((B, 1) and (1, B) are) keeps its rows,
            # so that the predictor's check refuses a (B, 2) table or a grid as on the command line (flattened, it ran)
            flat = arr.reshape(-1)  # (B,)
            rows = flat if flat.size in (*arr.shape, 1) else arr.reshape(arr.shape[0], -1)  # (B,) or (R, C)
            object.__setattr__(self, "wavelengths", tuple(tuple(float(v) for v in r) if r.ndim else float(r) for r in rows))
        for name in ("flip", "probabilities", "allow_band_mismatch", "match_frame"):  # from Python too: "no" is not False
            if not isinstance(getattr(self, name), bool):
                raise SciformerError(f"{option(self.FLAGS[name])}: expected true or false, got {getattr(self, name)!r}")
        for name in ("columns", "category", "labels"):
            if not isinstance(getattr(self, name), (str, os.PathLike, type(None))):
                raise SciformerError(f"{option(self.FLAGS[name])}: expected text, got {getattr(self, name)!r}")
        if not _real(self.overlap) or not 0.0 <= self.overlap <= 4.0:
            raise SciformerError(f"{option('--overlap')} must be between 0 and 4 (context points per core point), got {self.overlap!r}")
        for name in ("rotations", "votes"):
            value = getattr(self, name)
            if not (_real(value) and value == int(value)) or not 1 <= value <= 100:
                raise SciformerError(f"{option(self.FLAGS[name])} must be between 1 and 100 (a whole number), got {value!r}")
            object.__setattr__(self, name, int(value))  # 4.0: the predictors count with it
        object.__setattr__(self, "overlap", float(self.overlap))

    @property
    def single_pass(self) -> bool:
        """No test-time views: one turn, no mirror, no chunk overlap (each evaluation item once)."""
        return self.rotations == 1 and not self.flip and self.overlap == 0.0

    def require_defaults(self, dataset: str, *names: str) -> None:
        """Refuse options ``names`` when set: they do not apply to ``dataset``'s predictions."""
        default = PredictOptions()
        for name in names:
            if getattr(self, name) != getattr(default, name):
                raise SciformerError(f"{option(self.FLAGS[name])} does not apply to '{dataset}' predictions")


@dataclass
class DataInfo:
    """What a model builder needs to know about the data (stored in checkpoints as plain data)."""

    num_classes: int
    class_names: list[str]
    in_channels: int  # spectral bands (hyperspectral) or per-point feature channels (points)
    task: Literal["classification", "segmentation"] | None = None  # point clouds: one label per cloud or per point
    patch_size: int | None = None  # hyperspectral: odd side p of the (B, p, p) pixel patches
    wavelengths: list[float] | None = None  # hyperspectral: band centres in nm (None: unknown, or PCA components)
    features: list[str] | None = None  # point clouds: per-point feature names, in channel order
    category_names: list[str] | None = None  # part segmentation: object categories (one-hot input)
    # part segmentation: class ids of each category's parts; when set, batches carry ``category`` (B,) and
    # ``offset`` (B,), evaluation predicts each shape among its category's parts and adds instance/category mIoU
    category_parts: dict[str, list[int]] | None = None

    @property
    def label_ids(self) -> list[int]:
        """The id each class has in the task's maps and prediction files, in class order: k + 1 in a
        hyperspectral map (the training map's label ids; 0 = unlabelled), k in a point prediction's ``pred``."""
        first = 0 if self.patch_size is None else 1
        return list(range(first, first + self.num_classes))

    def __post_init__(self) -> None:
        if self.task not in (None, "classification", "segmentation"):
            raise DataError(f"DataInfo.task: expected 'classification', 'segmentation' or None, got {self.task!r}")
        if self.patch_size is not None:
            self.patch_size = check_patch_size(self.patch_size, key="DataInfo.patch_size")


SEED_MAX = 2**32 - 1  # every config seed is 0..2**32-1: what numpy's global seeding takes
MAX_PATCH_SIZE = 99  # a (B, 99, 99) window is already ~8 MB per sample at 200 bands


def check_patch_size(patch_size: Any, *, key: str = "patch_size", error: type[Exception] = DataError) -> int:
    """The patch-size rule, written once: a positive odd integer (patches have a centre pixel).

    Returns it as an int; otherwise raises ``error`` naming ``key`` (no prefix when empty).
    """
    ok = isinstance(patch_size, (int, np.integer)) and not isinstance(patch_size, bool) and 1 <= patch_size <= MAX_PATCH_SIZE and patch_size % 2 == 1
    if not ok:
        where = f"{key}: " if key else ""
        raise error(f"{where}expected a positive odd integer (1, 3, 5, 7, ... up to {MAX_PATCH_SIZE}), got {str(patch_size)[:40]}")
    return int(patch_size)


class TaskData(ABC):
    """A dataset prepared for one experiment: splits, collation and task outputs."""

    info: DataInfo
    ignore_index: int = -1

    @abstractmethod
    def dataset(self, split: str) -> Dataset:
        """The torch dataset of ``split`` (one of ``train``, ``val``, ``test``).

        A dataset with a ``set_epoch(epoch)`` method is told the epoch before each pass,
        so random crops and augmentations depend only on (seed, epoch) and resumed runs
        draw exactly what an uninterrupted run would.
        """

    @abstractmethod
    def collate(self, items: list[Any]) -> Batch:
        """Stack items into a batch dict with ``target`` (int64)."""

    def voting_dataset(self, split: str, votes: int) -> Dataset:
        """``split`` for test-time voting: item i is a list of ``votes`` augmented copies.

        :meth:`collate` of such items returns one batch of ``len(items) * votes``
        samples (copies of an item adjacent) with ``batch["votes"] = votes``; the
        evaluation averages the class probabilities of the copies. Only tasks with one
        prediction per sample (shape classification) support it.
        """
        raise ConfigError(f"evaluation.votes={votes}: this dataset does not support test-time voting "
                          "(it needs one prediction per sample, as in shape classification); use evaluation.votes=1")

    def describe(self) -> dict[str, Any]:
        """Protocol facts printed with results and stored in ``metrics.json``."""
        return {}

    def check_trainable(self) -> None:
        """Refuse, in one line before any training step, a training split with no labelled
        target (every label ignored: the model would never get a gradient); a no-op by default."""

    def class_counts(self) -> list[int] | None:
        """Labelled training targets (points, pixels, shapes) per class, for class-balanced
        losses (``train.class_weights: inverse_sqrt``); None where the task cannot count them."""
        return None

    def state(self) -> dict[str, Any]:
        """Fitted preprocessing state stored in checkpoints (weights_only-safe types)."""
        return {}

    def save_artifacts(self, run_dir: Path) -> None:
        """Write split masks, protocol files and the like into the run folder."""

    def match_checkpoint(self, state: dict[str, Any], *, allow_band_mismatch: bool = False) -> None:
        """Check (and adapt) this data against the data state of the checkpoint that evaluates it.

        ``state`` is the checkpoint's data state plus the model's ``position_source``;
        a mismatch the model cannot take is a one-line error. Hyperspectral tasks check
        the band set (count and wavelengths); the default accepts everything.
        """

    def check_test_views(self, views: PredictOptions) -> None:
        """Refuse test-time views (``views.rotations``, ``flip``, ``overlap``: the ``evaluation``
        settings ``tta_rotations``, ``tta_flip``, ``overlap``) this task cannot use: only
        whole-scene segmentation takes them."""
        if not views.single_pass:
            raise ConfigError("evaluation.tta_rotations / tta_flip / overlap apply to whole-scene segmentation only "
                              "(point_scenes, las_tiles, s3dis); shape classification uses evaluation.votes")

    def export_predictions(self, predict: PredictFn, out_dir: Path, batch_size: int, export: Any, split: str = "test",
                           score: ScoreFn | None = None, views: PredictOptions | None = None) -> dict[str, Any]:
        """Write task-specific predictions (maps, point files) of ``split`` after evaluation.

        ``export`` has boolean attributes ``npy``, ``png``, ``envi``, ``ply``. Returns extra
        facts to store in ``metrics.json`` (may be empty). A task that predicts at another
        resolution than its items (whole scenes on every original point) scores those
        labels with ``score``, never with a metric of its own; ``views`` are its test-time
        views (:meth:`check_test_views` accepted them).
        """
        return {}
