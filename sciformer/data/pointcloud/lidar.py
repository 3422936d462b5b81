"""Airborne LiDAR tiles (.las/.laz) with per-point ASPRS classes: semantic segmentation.

Any collection of classified LAS 1.x / LAZ tiles works (national LiDAR programmes,
OpenTopography, the laspy/PDAL test files in ``$SCIFORMER_DATA/lidar``); see
``datasets/lidar/README.md``. Expected layout: tiles anywhere under ``root``, listed
per split by relative path::

    data:
      name: las_tiles
      root: /data/lidar
      train_files: [a.laz, b.laz]
      val_files: [c.laz]
      test_files: [d.laz]
      classes: {ground: [2], vegetation: [3, 4, 5], building: [6], other: []}
      unmapped: other          # or 'ignore' (label -1, left out of loss and metrics)

ASPRS codes map to labels through ``classes`` (ordered; label = position);
codes not listed go to ``unmapped``. Training items are random square crops of
``crop_size`` metres (centred on a random point; redrawn up to 10 times when
they hold fewer than ``crop_min_points``), ``crops_per_tile`` per tile and epoch,
optionally grid-sampled and capped at ``crop_max_points``. Coordinates are recentred
per crop in float64 (x, y by the crop's bbox centre, z by its lowest point) before
becoming float32, as LAS coordinates are large. Features: ``colour`` (RGB / 255 or
/ 65535 by bit depth), ``intensity`` (divided by ``intensity_scale``, or by each
tile's 99th percentile, clipped to [0, 1]), ``height`` (z above the crop's lowest
point), ``coord``, ``geometric`` (35 eigenvalue and local-height features per point,
computed once on the whole tile and cached beside it: :mod:`.geometric`); by default
colour when every tile has RGB, plus intensity.
Validation and test items cover whole tiles (every point, or grid-sampled with the
inverse kept), split into compact parts of at most ``eval_max_points`` points; test
metrics at export are per original point.

Tiles are decoded once into ``ctx.cache_dir/las_tiles`` (.npy, memory-mapped).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sciformer.contracts import (
    BuildContext,
    DataInfo,
    PredictFn,
    PredictOptions,
    default_data_root,
)
from sciformer.data.pointcloud.cache import (
    cache_key,
    file_identity,
    load_arrays,
    save_arrays_atomic,
)
from sciformer.data.pointcloud.chunking import detached_points
from sciformer.data.pointcloud.export import (
    POINT_OUTPUTS,
    asprs_codes_from_table,
    write_point_predictions,
)
from sciformer.data.pointcloud.geometric import cached_geometric_features, features_as_recorded, geometric_state
from sciformer.data.pointcloud.io import las_has_rgb, read_point_file
from sciformer.data.pointcloud.point_scenes import check_classes
from sciformer.data.pointcloud.predict_file import (
    predict_cloud,
    read_cloud,
    require_features,
)
from sciformer.data.pointcloud.sample import check_features, feature_channels
from sciformer.data.pointcloud.scene_labels import check_class_spelling
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
    TransformList,
    index_points,
)
from sciformer.errors import DataError
from sciformer.registry import DATASETS

DEFAULT_CLASSES: dict[str, list[int]] = {"ground": [2], "vegetation": [3, 4, 5], "building": [6], "other": []}

DEFAULT_TRAIN_TRANSFORMS: list[dict[str, Any]] = [
    {"name": "random_rotate", "axis": "z", "angle": [-180, 180]},
    {"name": "random_flip", "axes": ["x"], "p": 0.5},
    {"name": "random_scale", "scale": [0.95, 1.05]},
    {"name": "random_jitter", "sigma": 0.02, "clip": 0.1},
]
_FEATURES = ["coord", "colour", "intensity", "height", "geometric"]


class LasTilesConfig(BaseModel):
    """``data:`` parameters of the ``las_tiles`` dataset."""

    model_config = ConfigDict(extra="forbid")

    root: str | None = None  # default: $SCIFORMER_DATA/lidar
    train_files: list[str] = Field(min_length=1)
    val_files: list[str]  # required; [] : no validation (a refit: train on the training and validation tiles together; best.pt is the last epoch)
    test_files: list[str] = Field(min_length=1)
    classes: Annotated[dict[str, list[int]], BeforeValidator(check_class_spelling)] = Field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_CLASSES.items()})
    unmapped: str = "other"  # 'ignore' (-1) or one of the class names
    features: Annotated[list[str], AfterValidator(lambda v: check_features(v, _FEATURES))] | None = None
    intensity_scale: float | None = Field(None, gt=0)  # None: each tile's 99th percentile
    crop_size: float = Field(50.0, gt=0)  # metres
    crop_min_points: int = Field(100, ge=1)
    crops_per_tile: int = Field(8, ge=1)  # training items per tile and epoch
    crop_max_points: int | None = Field(40000, gt=0)
    grid_size: float | None = Field(None, gt=0)  # metres; None: every point
    eval_max_points: int | None = Field(100000, gt=0)
    train_transforms: TransformList = None  # None: DEFAULT_TRAIN_TRANSFORMS; []: none
    eval_transforms: EvalTransformList = None

    @model_validator(mode="after")
    def _check(self) -> LasTilesConfig:
        for name, codes in self.classes.items():
            for code in codes:
                if not 0 <= code <= 255:
                    raise ValueError(f"classes.{name}: code {code} outside the ASPRS range 0..255")
        check_classes(self.classes, self.unmapped, "code")
        return self


def code_table(classes: dict[str, list[int]], unmapped: str) -> np.ndarray:
    """Lookup table (256,) int64 from ASPRS code to label (-1 = ignore)."""
    names = list(classes)
    table = np.full(256, -1 if unmapped == "ignore" else names.index(unmapped), dtype=np.int64)
    for label, name in enumerate(names):
        table[np.asarray(classes[name], dtype=np.int64)] = label
    return table


# --------------------------------------------------------------------------- tiles


def tile_sample(arrays: dict[str, np.ndarray], table: np.ndarray, intensity_scale: float,
                rows: np.ndarray | None = None) -> Sample:
    """Rows of a tile as a sample: coord float64, label from ``code`` through ``table``,
    intensity / ``intensity_scale`` clipped to [0, 1], colour if present."""
    pick = (lambda a: np.asarray(a)) if rows is None else (lambda a: np.asarray(a[rows]))
    sample: Sample = {"coord": pick(arrays["coord"]).astype(np.float64)}  # (n, 3)
    if "code" in arrays:
        sample["label"] = table[np.clip(pick(arrays["code"]), 0, 255).astype(np.int64)]  # (n,)
    if "intensity" in arrays:
        sample["intensity"] = np.clip(pick(arrays["intensity"]) / intensity_scale, 0.0, 1.0).astype(np.float32)  # (n,)
    if "colour" in arrays:
        sample["colour"] = pick(arrays["colour"]).astype(np.float32)  # (n, 3)
    if "geometric" in arrays:
        sample["geometric"] = pick(arrays["geometric"]).astype(np.float32)  # (n, 35)
    return sample



class LasTiles(SceneSource):
    """Tiles decoded once into the cache; loads map codes, normalise colour and intensity."""

    def __init__(self, paths: list[Path], table: np.ndarray, intensity_scale: float | None, cache_dir: Path,
                 geometric: bool = False, listed: str = "data.test_files") -> None:
        self.paths = paths
        self.names = scene_names(paths, listed)  # distinct: each names its own prediction files
        self.geometric = geometric
        self.table = table
        self.intensity_scale = intensity_scale
        self.cache_dir = cache_dir
        self._keys = [cache_key("las-v2", file_identity(p)) for p in paths]  # v2: p99 without gross outliers
        self._p99: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def name(self, index: int) -> str:
        return self.names[index]

    def key(self, index: int) -> str:
        return self._keys[index]

    def arrays(self, index: int) -> dict[str, np.ndarray]:
        """Raw cached arrays: coord (n, 3) float64, code (n,) uint8, intensity (n,), colour (n, 3)."""
        folder = self.cache_dir / self._keys[index]
        if not (folder / "meta.json").is_file():
            data = read_point_file(self.paths[index])
            arrays = {
                "coord": data["coord"],
                "code": np.clip(data["label"], 0, 255).astype(np.uint8),
                "intensity": data["intensity"].astype(np.float32),
            }
            if "colour" in data:
                arrays["colour"] = data["colour"]
            p99 = intensity_p99(arrays["coord"], arrays["intensity"])
            meta = {"file": str(self.paths[index]), "points": len(data["coord"]), "intensity_p99": p99}
            save_arrays_atomic(folder, arrays, meta)
        if index not in self._p99:
            self._p99[index] = float(json.loads((folder / "meta.json").read_text())["intensity_p99"])
        arrays = load_arrays(folder, ["coord", "code", "intensity", "colour"])
        if self.geometric:
            arrays["geometric"] = cached_geometric_features(np.asarray(arrays["coord"]), self.cache_dir, "las-geometric", self._keys[index])  # (n, 35)
        return arrays

    def sample(self, index: int, arrays: dict[str, np.ndarray], rows: np.ndarray | None = None) -> Sample:
        """A sample of ``rows`` (all when None): coord float64, label, intensity, colour."""
        scale = self.intensity_scale or max(self._p99.get(index, 1.0), 1.0)
        return tile_sample(arrays, self.table, scale, rows)

    def load(self, index: int) -> Sample:
        return self.sample(index, self.arrays(index))


class LasCropDataset(SceneCrops):
    """Random square crops of training tiles, ``crops_per_tile`` per tile and epoch."""

    def __init__(self, tiles: LasTiles, cfg: LasTilesConfig, features: list[str], transform: Compose, seed: int) -> None:
        super().__init__(len(tiles), cfg.crops_per_tile, cfg.grid_size, "min", features, transform, seed)
        self.tiles = self.source = tiles  # source: the whole training tiles (SceneSource)
        self.cfg = cfg

    def describe_item(self, index: int) -> str:
        return f"crop of {self.tiles.paths[index % len(self.tiles)]}"

    def crop_rows(self, xy: np.ndarray, rng: np.random.Generator, tries: int = 10) -> np.ndarray:
        """Rows of the best of up to ``tries`` random squares (first with enough points)."""
        half = self.cfg.crop_size / 2
        best = np.zeros(0, dtype=np.int64)
        for _ in range(tries):
            centre = xy[rng.integers(len(xy))]
            rows = np.flatnonzero((np.abs(xy[:, 0] - centre[0]) <= half) & (np.abs(xy[:, 1] - centre[1]) <= half))
            if len(rows) > len(best):
                best = rows
            if len(best) >= self.cfg.crop_min_points:
                break
        return best

    def load(self, index: int, rng: np.random.Generator) -> Sample:
        t = index % len(self.tiles)
        arrays = self.tiles.arrays(t)
        xy = np.asarray(arrays["coord"][:, :2])  # (n, 2)
        if len(xy) == 0:
            raise DataError(f"{self.tiles.paths[t]}: empty point cloud (0 points)")
        sample = self.grid(self.tiles.sample(t, arrays, self.crop_rows(xy, rng)), rng)
        n = sample["coord"].shape[0]
        if self.cfg.crop_max_points and n > self.cfg.crop_max_points:
            sample = index_points(sample, np.sort(rng.choice(n, self.cfg.crop_max_points, replace=False)))
        return self.shift(sample)  # float64 recentring; float32 at feature assembly


def intensity_p99(coord: np.ndarray, intensity: np.ndarray) -> float:
    """The 99th percentile of a tile's finite intensities (its intensity scale), the points with
    non-finite coordinates and the gross outliers (:func:`detached_points`, e.g. no-data returns
    at z = -9999 with intensity 65535) set aside: they move no other point's features; 1.0 when none is left.

    Shapes: coord (n, 3), intensity (n,) -> scalar.
    """
    keep = np.isfinite(np.asarray(intensity, dtype=np.float64))  # (n,)
    placed = np.flatnonzero(np.isfinite(coord).all(axis=1))  # (m,)
    keep[np.setdiff1d(np.arange(len(keep)), placed)] = False
    for rows in detached_points(np.asarray(coord)[placed]):
        keep[placed[rows]] = False
    return float(np.percentile(intensity[keep], 99)) if keep.any() else 1.0


def predict_las_file(
    cfg: LasTilesConfig,
    state: dict[str, Any],
    predict: PredictFn,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    *,
    options: PredictOptions | None = None,
) -> Path:
    """Classify every point of a tile (.las/.laz or another point file) with a trained model.

    Uses the checkpoint's class table (the codes of a ``data.classes`` override of the same
    classes: :func:`~sciformer.data.predicting.table_as_given`), features, intensity scale
    and grid size (never the new file's own). Output by suffix (:mod:`sciformer.data.pointcloud.export`):
    ``.las``/``.laz`` (the input tile with predicted ASPRS codes in ``classification``,
    the original classes and a confidence as extra dimensions), ``.ply``, ``.npz`` or
    ``.npy``. ``options`` sets the chunk overlap, the test-time views and whether class
    probabilities are written.
    """
    options, input_path, output_path = start_prediction(
        "las_tiles", options, input_path, output_path, POINT_OUTPUTS, refuse=("votes", "category", "labels"))
    unmapped = state_value(state, "unmapped", "las_tiles")
    classes = table_as_given(state_value(state, "classes", "las_tiles"), cfg.classes, unmapped, cfg.unmapped)  # an override's codes
    features = list(state_value(state, "features", "las_tiles"))
    data = read_cloud(input_path, options.columns)
    require_features(input_path, data, features)
    arrays: dict[str, np.ndarray] = {"coord": data["coord"]}
    for key in ("intensity", "colour"):
        if key in data:
            arrays[key] = data[key]
    if "label" in data:  # ASPRS classification of a LAS tile: the truth to compare with
        arrays["code"] = data["label"]
    if "geometric" in features:
        arrays["geometric"] = features_as_recorded(data["coord"], state_value(state, "geometric", "las_tiles"))
    intensity = arrays.get("intensity")
    scale = state.get("intensity_scale") or max(1.0 if intensity is None else intensity_p99(data["coord"], intensity), 1.0)
    sample = tile_sample(arrays, code_table(classes, cfg.unmapped), scale)
    prediction = predict_cloud(
        predict, sample, class_names=list(classes),
        features=features, grid_size=state.get("grid_size"), max_points=cfg.eval_max_points, part_z="min",
        transform=None, batch_size=batch_size, options=options, desc=input_path.name,
    )
    return write_point_predictions(output_path, sample, prediction, source=input_path,
                                   asprs_codes=asprs_codes_from_table(classes), probabilities=options.probabilities)


@DATASETS.register("las_tiles", config=LasTilesConfig, predictor=predict_las_file)
def build_las_tiles(cfg: LasTilesConfig, ctx: BuildContext) -> SceneSegmentationTask:
    """Airborne LiDAR tiles (.las/.laz) with ASPRS classes mapped to labels by a table."""
    root = ctx.resolve(cfg.root) if cfg.root else default_data_root() / "lidar"
    paths: dict[str, list[Path]] = {}
    for split, files in (("train", cfg.train_files), ("val", cfg.val_files), ("test", cfg.test_files)):
        paths[split] = []
        for f in files:
            p = Path(os.path.expandvars(f)).expanduser()
            p = p if p.is_absolute() else root / p  # absolute paths and $VARS work too
            if p.exists() and not p.is_file():
                raise DataError(f"data.{split}_files: '{f}' under {root} is not a file; expected a .las/.laz tile")
            if not p.is_file():
                raise DataError(f"data.{split}_files: '{f}' not found under {root}")
            if p.suffix.lower() not in (".las", ".laz"):
                raise DataError(f"data.{split}_files: '{f}' is not a .las/.laz file")
            paths[split].append(p)
    check_disjoint_splits(paths, "tiles")  # './a.laz', an absolute path, a link or a copy is the same tile
    every = [p for ps in paths.values() for p in ps]
    with_rgb = {p: las_has_rgb(p) for p in every}
    if cfg.features is None:
        features = (["colour"] if all(with_rgb.values()) else []) + ["intensity"]
    else:
        features = list(cfg.features)
        if "colour" in features:
            missing = [p.name for p, ok in with_rgb.items() if not ok]
            if missing:
                raise DataError(f"data.features: 'colour' is used but {', '.join(missing)} has no RGB; "
                               "drop 'colour' from data.features or use tiles with RGB")
    table = code_table(cfg.classes, cfg.unmapped)
    cache_dir = ctx.cache_dir / "las_tiles"
    tiles = {s: LasTiles(paths[s], table, cfg.intensity_scale, cache_dir, "geometric" in features, f"data.{s}_files")
             for s in paths}
    splits, transforms = scene_datasets(
        cfg, DEFAULT_TRAIN_TRANSFORMS, lambda tf: LasCropDataset(tiles["train"], cfg, features, tf, ctx.seed),
        tiles.__getitem__, features=features, part_z="min", seed=ctx.seed, cache_dir=cache_dir,
    )

    class_names = list(cfg.classes)
    info = DataInfo(
        num_classes=len(class_names),
        class_names=class_names,
        in_channels=feature_channels(features),
        task="segmentation",
        features=list(features),
    )
    protocol = {
        "dataset": "las_tiles",
        "root": str(root),
        "files": {s: [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in ps] for s, ps in paths.items()},
        "classes": {k: list(v) for k, v in cfg.classes.items()},
        "unmapped": cfg.unmapped,
        "features": features,
        "crop": f"{cfg.crop_size:g} m squares, >= {cfg.crop_min_points} points, {cfg.crops_per_tile} per tile and epoch",
        "grid_size": cfg.grid_size,
        "test": "whole tiles, every original point (export)",
        **transforms,
    }
    state = {
        "classes": {k: list(v) for k, v in cfg.classes.items()},
        "unmapped": cfg.unmapped,
        "features": features,
        "intensity_scale": cfg.intensity_scale,
        "grid_size": cfg.grid_size,
        "crop_size": cfg.crop_size,
        "eval_max_points": cfg.eval_max_points,
    }
    if "geometric" in features:
        state["geometric"] = protocol["geometric"] = geometric_state()
    return SceneSegmentationTask(info, splits, protocol=protocol, state=state)


predict_las_file.suffixes = POINT_OUTPUTS  # type: ignore[attr-defined]  # checked before the model loads
