"""Your own labelled point clouds: semantic segmentation of any folder of scene files.

Any files :func:`~sciformer.data.pointcloud.io.read_point_file` reads (PLY, PCD, NPY/NPZ,
text tables, LAS/LAZ, raw ``.bin`` scans with ``columns``) with a per-point label, either
a field of the file (``label`` / ``class`` / ``classification`` ...) or a sibling label file.
See ``datasets/point_scenes/README.md``::

    data:
      name: point_scenes
      root: $SCIFORMER_DATA/semantickitti_scans
      train_files: ["seq01_00000[01]_points.npy"]    # paths or globs, relative to root or absolute
      val_files: [seq01_000002_points.npy]            # [] : no validation (best.pt: the last epoch)
      test_files: [demo_000700_points.npy]            # [] : no test split
      label_files: [_points.npy, _labels.npy]         # labels from a sibling file (name substitution)
      classes: {car: [1], bicycle: [2], ...}          # class -> the label values it takes
      # or  classes: [ground, tree, building]         # label value k is class k
      unmapped: ignore                                # values not listed: 'ignore' (-1) or a class name
      columns: null                                   # e.g. [x, y, z, intensity] for raw .bin scans
      features: [intensity]                           # coord, colour, intensity, normal, height, geometric

Training items are crops of ``crop_points`` points around a random point (after
optional grid sampling, ``loop`` per file and epoch), recentred in x, y and with z from
the crop's lowest point; validation and test items cover every point of whole files
(split into parts of at most ``eval_max_points``), with test metrics on every point.
The ``geometric`` feature (35 multi-scale eigenvalue and local-height channels,
:mod:`sciformer.data.pointcloud.geometric`) is computed once per whole file, before any
grid sampling or crop, and cached under ``$SCIFORMER_CACHE``; prediction computes it on
the new file with the parameters the checkpoint recorded.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections import OrderedDict
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sciformer.contracts import BuildContext, DataInfo, PredictFn, PredictOptions
from sciformer.data.pointcloud.cache import file_identity
from sciformer.data.pointcloud.export import POINT_OUTPUTS, asprs_codes_from_table, write_point_predictions
from sciformer.data.pointcloud.geometric import cached_geometric_features, features_as_recorded, geometric_state
from sciformer.data.pointcloud.io import POINT_SUFFIXES, parse_columns, read_point_file
from sciformer.data.pointcloud.label_files import label_file_of, labelled_by, read_beside, sibling_labels
from sciformer.data.pointcloud.predict_file import (
    predict_cloud,
    read_cloud,
    require_features,
    valid_points,
)
from sciformer.data.pointcloud.sample import check_features, feature_channels
from sciformer.data.pointcloud.scene_labels import UnmappedIds, check_class_spelling
from sciformer.data.pointcloud.scene_training import SceneCrops, scene_datasets
from sciformer.data.pointcloud.scenes import (
    EvalTransformList,
    SceneSegmentationTask,
    SceneSource,
)
from sciformer.data.pointcloud.split_files import check_disjoint_splits, scene_names
from sciformer.data.predicting import start_prediction, state_value, table_as_given
from sciformer.data.transforms import (
    Compose,
    Sample,
    SphereCrop,
    TransformList,
    build_transforms,
    index_points,
)
from sciformer.errors import DataError
from sciformer.registry import DATASETS
from sciformer.utils.limits import MAX_CLASS_ID

_FEATURES = ["coord", "colour", "intensity", "normal", "height", "geometric"]
DEFAULT_TRAIN_TRANSFORMS: list[dict[str, Any]] = [
    {"name": "random_rotate", "axis": "z", "angle": [-180, 180]},
    {"name": "random_flip", "axes": ["x"], "p": 0.5},
    {"name": "random_scale", "scale": [0.95, 1.05]},
]


class PointScenesConfig(BaseModel):
    """``data:`` parameters of the ``point_scenes`` dataset."""

    model_config = ConfigDict(extra="forbid")

    root: str | None = None  # folder relative file names and globs start from (default: the config's folder)
    train_files: list[str] = Field(min_length=1)
    val_files: list[str]  # required; [] : no validation (a refit: train on the training and validation files together; best.pt is the last epoch)
    test_files: list[str] = []
    classes: Annotated[list[str] | dict[str, list[int]], BeforeValidator(check_class_spelling)]
    unmapped: str = "ignore"  # label values no class takes: 'ignore' (-1) or a class name
    label_files: tuple[str, str] | None = None  # (from, to): labels in a sibling file named by substitution
    columns: list[str] | str | None = None  # headerless tables and raw .bin scans, e.g. [x, y, z, intensity]
    features: Annotated[list[str], AfterValidator(lambda v: check_features(v, _FEATURES))] = []
    grid_size: float | None = Field(None, gt=0)
    crop_points: int | None = Field(20000, gt=0)  # None: whole files as training items
    loop: int = Field(1, ge=1)
    eval_max_points: int | None = Field(100000, gt=0)
    train_transforms: TransformList = None  # None: DEFAULT_TRAIN_TRANSFORMS; []: none
    eval_transforms: EvalTransformList = None

    @model_validator(mode="after")
    def _check(self) -> PointScenesConfig:
        check_classes(self.classes, self.unmapped)
        if self.columns is not None:
            try:
                parse_columns(self.columns, "data.columns")
            except DataError as exc:
                raise ValueError(str(exc).removeprefix("data.columns: ")) from None
        return self


def class_table(classes: list[str] | dict[str, list[int]], noun: str = "label value") -> dict[str, list[int]]:
    """``{class: [label values]}``; a list of names means label value k is class k (each value once)."""
    if isinstance(classes, dict):
        table = {str(k): [int(v) for v in vs] for k, vs in classes.items()}
    else:
        table = {str(name): [k] for k, name in enumerate(classes)}
    seen: dict[int, str] = {}
    for name, values in table.items():
        for v in values:
            if v == -1:
                raise ValueError(f"classes.{name}: {noun} -1 is the ignore value, not a class's label (labels no class lists are ignored with unmapped: ignore)")
            if not 0 <= v <= MAX_CLASS_ID:
                raise ValueError(f"classes.{name}: {noun} {v} is not an id a label can hold (0..{MAX_CLASS_ID})")
            if v in seen:
                raise ValueError(f"classes.{name}: {noun} {v} is already class '{seen[v]}'")
            seen[v] = name
    return table


def check_classes(classes: list[str] | dict[str, list[int]], unmapped: str, noun: str = "label value") -> dict[str, list[int]]:
    """The class table of a ``data:`` section, checked: one class at least, each ``noun`` (label
    value, ASPRS code) in one class, ``unmapped`` 'ignore' or a class (ValueError for pydantic)."""
    table = class_table(classes, noun)
    if not table:
        raise ValueError("classes: at least one class is needed")
    if unmapped != "ignore" and unmapped not in table:
        raise ValueError(f"unmapped: '{unmapped}' is neither 'ignore' nor a class ({', '.join(table)})")
    return table


def map_labels(raw: np.ndarray, table: dict[str, list[int]], unmapped: str) -> np.ndarray:
    """Raw label values (n,) -> class ids (n,) int64 through ``table`` (unlisted: ``unmapped``)."""
    names = list(table)
    default = -1 if unmapped == "ignore" else names.index(unmapped)
    raw = np.asarray(raw).astype(np.int64).reshape(-1)
    values, inverse = np.unique(raw, return_inverse=True)
    lookup = {v: k for k, name in enumerate(names) for v in table[name]}
    mapped = np.array([lookup.get(int(v), default) for v in values], dtype=np.int64)
    return mapped[inverse]


def expand_files(key: str, patterns: list[str], root: Path) -> list[Path]:
    """Paths of ``patterns`` (file names or globs, relative to ``root`` or absolute; ``$VARS`` and ``~``)."""
    out: list[Path] = []
    for pattern in patterns:
        text = os.path.expanduser(os.path.expandvars(pattern))
        full = text if os.path.isabs(text) else str(root / text)
        if glob.has_magic(text):
            found = sorted(Path(p) for p in glob.glob(full) if Path(p).is_file())
            if not found:
                raise DataError(f"data.{key}: '{pattern}' matches no file under {root}")
        else:
            if not Path(full).is_file():
                raise DataError(f"data.{key}: '{pattern}' not found under {root}" if not os.path.isabs(text)
                                else f"data.{key}: '{pattern}' not found")
            found = [Path(full)]
        for p in found:
            if p.suffix.lower() not in POINT_SUFFIXES:
                raise DataError(f"data.{key}: '{p.name}' is not a point file ({', '.join(POINT_SUFFIXES)})")
        out.extend(found)
    return out


def point_sample(data: dict[str, np.ndarray]) -> Sample:
    """The fields of a read file a scene sample keeps: coord (n, 3) float64; colour (n, 3),
    intensity (n,) and normal (n, 3) float32 where the file has them."""
    sample: Sample = {"coord": np.asarray(data["coord"], dtype=np.float64)}
    for key in ("colour", "intensity", "normal"):
        if key in data:
            sample[key] = np.asarray(data[key], dtype=np.float32)
    return sample


class SceneFiles(SceneSource):
    """Labelled scene files read on access (a few kept in memory); invalid points dropped
    (their rows are remembered: :meth:`left_out_rows`)."""

    def __init__(self, paths: list[Path], cfg: PointScenesConfig, features: list[str], cache_dir: Path,
                 listed: str = "data.test_files") -> None:
        self.paths = paths
        self.names = scene_names(paths, listed)  # distinct: each names its own prediction files
        self.cfg = cfg
        self.features = features
        self.cache_dir = cache_dir
        self.table = class_table(cfg.classes)
        self._cache: OrderedDict[int, Sample] = OrderedDict()
        self._left_out: dict[int, tuple[np.ndarray, int] | None] = {}  # loaded scene -> (rows left out, rows in the file)
        self.unmapped = UnmappedIds()  # raw label ids no class takes, over the files loaded

    def __len__(self) -> int:
        return len(self.paths)

    def left_out_rows(self, index: int) -> tuple[np.ndarray, int] | None:
        if index not in self._left_out:  # known once the file has been loaded
            self.load(index)
        return self._left_out[index]

    def name(self, index: int) -> str:
        return self.names[index]

    def unlabelled_hint(self) -> str:
        return self.unmapped.hint()

    def key(self, index: int) -> str:
        return ":".join(map(str, file_identity(self.paths[index])))

    def load(self, index: int) -> Sample:
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        path = self.paths[index]
        data = read_point_file(path, self.cfg.columns, keep_invalid=True)
        raw = sibling_labels(path, self.cfg.label_files) if self.cfg.label_files else data.get("label")
        if raw is None:
            raise DataError(f"{path}: no label field (label, class, classification, ...); "
                            "name a sibling label file with data.label_files")
        if len(raw) != len(data["coord"]):
            raise DataError(f"{path}: {len(raw)} labels for {len(data['coord'])} points")
        require_features(path, data, self.features, training=True)
        sample = point_sample(data)
        sample["label"] = map_labels(raw, self.table, self.cfg.unmapped)
        self.unmapped.add(raw, sample["label"])
        ok = valid_points(sample, self.features)
        self._left_out[index] = None if ok.all() else (np.flatnonzero(~ok), len(ok))
        if not ok.all():
            sample = index_points(sample, np.flatnonzero(ok))
        if len(sample["coord"]) == 0:
            raise DataError(f"{path}: no point with finite coordinates")
        if "geometric" in self.features:
            kept = hashlib.sha256(np.packbits(ok)).hexdigest()  # another data.features keeps other rows of the file
            sample["geometric"] = cached_geometric_features(  # (n, 35) over the usable points
                sample["coord"], self.cache_dir, "scene-geometric", file_identity(path), self.cfg.columns, kept)
        self._cache[index] = sample
        while len(self._cache) > 3:
            self._cache.popitem(last=False)
        return sample



class SceneCropDataset(SceneCrops):
    """Training crops: ``crop_points`` nearest points to a random point of a (grid-sampled) file."""

    def __init__(self, files: SceneFiles, cfg: PointScenesConfig, features: list[str], transform: Compose, seed: int) -> None:
        super().__init__(len(files), cfg.loop, cfg.grid_size, "min", features, transform, seed)
        self.files = self.source = files  # source: the whole training files (SceneSource)
        self.cfg = cfg
        self._crop = SphereCrop(cfg.crop_points, mode="random") if cfg.crop_points else None

    def describe_item(self, index: int) -> str:
        return f"crop of {self.files.paths[index % len(self.files)]}"

    def load(self, index: int, rng: np.random.Generator) -> Sample:
        sample = self.grid(dict(self.files.load(index % len(self.files))), rng)
        if self._crop is not None:
            sample = self._crop(sample, rng)
        return self.shift(sample)


def predict_point_scenes_file(
    cfg: PointScenesConfig,
    state: dict[str, Any],
    predict: PredictFn,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    *,
    options: PredictOptions | None = None,
) -> Path:
    """Segment every point of a new file with the checkpoint's classes (the label values of a
    ``data.classes`` override of the same classes: :func:`~sciformer.data.predicting.table_as_given`),
    features, grid and columns.

    Output by suffix (:mod:`sciformer.data.pointcloud.export`): ``.npy``, ``.npz``, ``.ply``
    (class names in the header) or ``.las``/``.laz`` for a LAS input (classes written as
    their first label value; a class without values as 1, unclassified: :func:`asprs_codes_from_table`, as for las_tiles);
    one row per input point, NaN/Inf points as no data.
    ``--columns`` overrides the trained ``data.columns`` for headerless files.
    """
    options, input_path, output_path = start_prediction(
        "point_scenes", options, input_path, output_path, POINT_OUTPUTS, refuse=("votes", "category", "labels"))
    table = table_as_given(state_value(state, "classes", "point_scenes"), class_table(cfg.classes), state.get("unmapped"), cfg.unmapped)
    features = list(state_value(state, "features", "point_scenes"))
    data = read_cloud(input_path, options.columns or state.get("columns"))
    require_features(input_path, data, features)
    sample = point_sample(data)
    if "geometric" in features:
        sample["geometric"] = features_as_recorded(sample["coord"], state_value(state, "geometric", "point_scenes"),
                                                   usable=valid_points(sample, features))  # the points training keeps
    label_files = state.get("label_files")
    raw = data.get("label")
    truth = label_file_of(input_path, label_files)
    if truth is not None and truth.is_file():
        raw = sibling_labels(input_path, (str(label_files[0]), str(label_files[1])))  # the truth, for the output's label field
    if raw is not None and len(raw) == len(sample["coord"]):
        sample["label"] = map_labels(raw, table, cfg.unmapped)
    prediction = predict_cloud(
        predict, sample, class_names=list(table), features=features, grid_size=state.get("grid_size"),
        max_points=cfg.eval_max_points, part_z="min",
        transform=build_transforms(cfg.eval_transforms, "data.eval_transforms"), batch_size=batch_size,
        options=options, desc=input_path.name,
    )
    out: Sample = {"coord": sample["coord"], "colour": data.get("colour"), "label": sample.get("label")}
    return write_point_predictions(output_path, {k: v for k, v in out.items() if v is not None}, prediction,
                                   source=input_path, asprs_codes=asprs_codes_from_table(table), probabilities=options.probabilities)


predict_point_scenes_file.suffixes = POINT_OUTPUTS  # type: ignore[attr-defined]  # checked before the model loads
predict_point_scenes_file.read_beside = read_beside  # type: ignore[attr-defined]  # never an output name
predict_point_scenes_file.labelled_by = labelled_by  # type: ignore[attr-defined]  # nor another file's label file


@DATASETS.register("point_scenes", config=PointScenesConfig, predictor=predict_point_scenes_file)
def build_point_scenes(cfg: PointScenesConfig, ctx: BuildContext) -> SceneSegmentationTask:
    """Your own labelled point clouds (any readable format, a class table in the YAML)."""
    root = ctx.resolve(cfg.root) if cfg.root else ctx.base_dir
    paths = {split: expand_files(f"{split}_files", getattr(cfg, f"{split}_files"), root) for split in ("train", "val", "test")}
    check_disjoint_splits(paths)
    table = class_table(cfg.classes)
    features = list(cfg.features)
    columns = cfg.columns if isinstance(cfg.columns, str) or cfg.columns is None else ",".join(cfg.columns)
    files = {s: SceneFiles(ps, cfg, features, ctx.cache_dir / "point_scenes", f"data.{s}_files") for s, ps in paths.items()}
    splits, transforms = scene_datasets(
        cfg, DEFAULT_TRAIN_TRANSFORMS, lambda tf: SceneCropDataset(files["train"], cfg, features, tf, ctx.seed),
        files.__getitem__, features=features, part_z="min", seed=ctx.seed,
    )

    info = DataInfo(num_classes=len(table), class_names=list(table), in_channels=feature_channels(features),
                    task="segmentation", features=list(features))
    protocol = {
        "dataset": "point_scenes",
        "root": str(root),
        "files": {s: [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in ps] for s, ps in paths.items()},
        "classes": table,
        "unmapped": cfg.unmapped,
        "features": features,
        "crop": f"{cfg.crop_points} points around a random point" if cfg.crop_points else "whole files",
        "grid_size": cfg.grid_size,
        "test": "whole files, every point (export)" if paths["test"] else "none (data.test_files: [])",
        **transforms,
    }
    state = {"classes": table, "unmapped": cfg.unmapped, "features": features, "grid_size": cfg.grid_size,
             "eval_max_points": cfg.eval_max_points, "columns": columns,
             "label_files": list(cfg.label_files) if cfg.label_files else None}
    if "geometric" in features:
        state["geometric"] = protocol["geometric"] = geometric_state()
    return SceneSegmentationTask(info, splits, protocol=protocol, state=state)
