"""S3DIS indoor semantic segmentation (Stanford 3D Indoor Scenes, 6 areas, 13 classes).

Get ``Stanford3dDataset_v1.2_Aligned_Version`` from the Stanford form (research
use); see ``datasets/s3dis/README.md``. Expected layout::

    root/Area_1/conferenceRoom_1/Annotations/chair_1.txt   lines 'x y z r g b'
    root/Area_1/conferenceRoom_1/Annotations/wall_3.txt
    ...
    root/Area_6/...

The class of each annotation file is its name before the last ``_``; ``stairs``
counts as ``clutter`` (as usual). The release has malformed lines (e.g. a stray
control character in ``Area_5/hallway_6``); ``malformed_lines: skip`` drops them
with a warning naming the file and count, ``error`` stops at ``file:line``.

Rooms are converted once into ``ctx.cache_dir/s3dis/<key>/Area_N/<room>/``
(``coord.npy`` float32, ``colour.npy`` uint8, ``label.npy`` uint8), never beside
the raw data. z is measured from each room's lowest point.

Splits: ``test_area`` (default 5) is held out for test (``null``: no test split, for a
copy with only some areas; evaluate with ``evaluation.split=val``); validation is either a
whole ``val_area`` or a seeded ``val_fraction`` of the training rooms (never the
test area). Both areas must be among those found under ``root``. Training items are crops of grid-sampled rooms (``sphere``: the
``crop_points`` nearest points to a random point; ``box``: a random
``box_size`` x ``box_size`` m column resampled to ``crop_points``; ``none``: the
whole room); each room appears ``loop`` times per epoch. Validation and test items
are whole grid-sampled rooms (split into parts of at most ``eval_max_points``);
the test metrics written at export are computed on every original point.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sciformer.contracts import (
    SEED_MAX,
    BuildContext,
    DataInfo,
    default_data_root,
)
from sciformer.data.pointcloud.cache import cache_key, file_identity, load_arrays, save_arrays_atomic
from sciformer.data.pointcloud.file_predictors import predict_s3dis_file
from sciformer.data.pointcloud.io import parse_text_table
from sciformer.data.pointcloud.sample import check_features, feature_channels
from sciformer.data.pointcloud.scene_training import SceneCrops, scene_datasets
from sciformer.data.pointcloud.scenes import (
    EvalTransformList,
    SceneSegmentationTask,
    SceneSource,
)
from sciformer.data.transforms import (
    Compose,
    Sample,
    SphereCrop,
    TransformList,
    index_points,
)
from sciformer.errors import ConfigError, DataError
from sciformer.registry import DATASETS
from sciformer.utils.progress import progress

S3DIS_CLASSES = [
    "ceiling", "floor", "wall", "beam", "column", "window", "door",
    "table", "chair", "sofa", "bookcase", "board", "clutter",
]
CLASS_ALIASES = {"stairs": "clutter"}

DEFAULT_TRAIN_TRANSFORMS: list[dict[str, Any]] = [
    {"name": "random_rotate", "axis": "z", "angle": [-180, 180]},
    {"name": "random_scale", "scale": [0.9, 1.1]},
    {"name": "random_flip", "axes": ["x"], "p": 0.5},
    {"name": "random_jitter", "sigma": 0.005, "clip": 0.02},
    {"name": "chromatic_auto_contrast", "p": 0.2},
    {"name": "chromatic_jitter", "p": 0.95, "std": 0.05},
]


class S3DISConfig(BaseModel):
    """``data:`` parameters of the ``s3dis`` dataset."""

    model_config = ConfigDict(extra="forbid")

    root: str | None = None  # default: $SCIFORMER_DATA/Stanford3dDataset_v1.2_Aligned_Version
    test_area: int | None = Field(5, ge=1)  # None: no test area (evaluate on val: evaluation.split=val)
    val_area: int | None = Field(None, ge=1)  # None: val_fraction of the training rooms
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    split_seed: int = Field(0, ge=0, le=SEED_MAX)
    malformed_lines: Literal["skip", "error"] = "skip"
    grid_size: float | None = Field(0.04, gt=0)  # metres; None: no grid sampling
    crop: Literal["sphere", "box", "none"] = "sphere"
    crop_points: int = Field(24000, gt=0)
    box_size: float = Field(1.0, gt=0)  # metres (crop: box)
    loop: int = Field(1, ge=1)  # training items per room and epoch
    eval_max_points: int | None = Field(300000, gt=0)  # split bigger evaluation rooms into parts
    features: Annotated[list[str], AfterValidator(lambda v: check_features(v, ["coord", "colour", "height"]))] = [
        "coord", "colour"
    ]
    train_transforms: TransformList = None  # None: DEFAULT_TRAIN_TRANSFORMS; []: none
    eval_transforms: EvalTransformList = None


# --------------------------------------------------------------------------- preparation


def annotation_class(path: Path) -> int:
    """Class index of an annotation file from its name (``chair_3.txt`` -> chair)."""
    name = path.stem.rsplit("_", 1)[0]
    name = CLASS_ALIASES.get(name, name)
    if name not in S3DIS_CLASSES:
        raise DataError(f"{path}: unknown class '{name}' in file name; expected one of {', '.join(S3DIS_CLASSES)} (or stairs)")
    return S3DIS_CLASSES.index(name)


def find_rooms(root: Path) -> list[tuple[int, str, Path]]:
    """(area number, room name, room folder) of every room with an Annotations folder."""
    rooms = []
    for area_dir in sorted(root.glob("Area_*")):
        match = re.fullmatch(r"Area_(\d+)", area_dir.name)
        if not match or not area_dir.is_dir():
            continue
        for room_dir in sorted(p for p in area_dir.iterdir() if (p / "Annotations").is_dir()):
            rooms.append((int(match.group(1)), room_dir.name, room_dir))
    if not rooms:
        raise DataError(f"{root}: no rooms found (expected Area_N/<room>/Annotations/*.txt)")
    return rooms


def room_sources(room_dir: Path) -> list[Any]:
    """Name and :func:`file_identity` (less the path) of each of a room's annotation files: a prepared room
    whose record differs (a file renamed to another class, a malformed line mended, an object
    added) is prepared again."""
    return [[Path(p).name, *file_identity(p)[1:]] for p in sorted((room_dir / "Annotations").glob("*.txt"))]


def prepare_room(room_dir: Path, out: Path, malformed: str) -> dict[str, Any]:
    """Convert one room's annotation files into ``coord/colour/label.npy`` in ``out`` (replaced whole)."""
    sources = room_sources(room_dir)
    files = sorted((room_dir / "Annotations").glob("*.txt"))
    if not files:
        raise DataError(f"{room_dir / 'Annotations'}: no annotation files (<class>_<i>.txt)")
    coords, colours, labels = [], [], []
    skipped: dict[str, list[int]] = {}
    for path in files:
        cls = annotation_class(path)
        table, bad = parse_text_table(path, 6, delimiter=None, malformed=malformed)  # (n, 6)
        if bad:
            skipped[path.name] = bad
            warnings.warn(f"{path}: skipped {len(bad)} malformed line(s) (first: line {bad[0]})", stacklevel=2)
        big = np.abs(table[:, :3]).max(axis=1) > np.finfo(np.float32).max  # (n,) 1e300 would become inf in float32
        if big.any():
            raise DataError(f"{path}: coordinates beyond float32 (e.g. {table[big][0, :3].tolist()}); expected metres")
        coords.append(table[:, :3].astype(np.float32))
        colours.append(np.clip(np.round(table[:, 3:6]), 0, 255).astype(np.uint8))
        labels.append(np.full(len(table), cls, dtype=np.uint8))
    arrays = {"coord": np.concatenate(coords), "colour": np.concatenate(colours), "label": np.concatenate(labels)}
    meta = {"points": int(len(arrays["label"])), "skipped_lines": skipped, "files": len(files), "sources": sources}
    save_arrays_atomic(out, arrays, meta, replace=True)
    return meta


def prepare_s3dis(root: Path, cache_root: Path, malformed: str) -> list[dict[str, Any]]:
    """Convert every room once (resumable; a room whose annotation files changed since is
    converted again); returns room records with their cache folders."""
    rooms = [(a, r, d, cache_root / f"Area_{a}" / r) for a, r, d in find_rooms(root)]
    metas = {folder: _prepared(folder, d) for _, _, d, folder in rooms}  # one listing and one read per room
    for _, _, room_dir, folder in progress([room for room in rooms if metas[room[3]] is None], "S3DIS rooms"):
        metas[folder] = prepare_room(room_dir, folder, malformed)  # records the files as listed before reading them
    return [{"area": a, "room": r, "folder": folder, **metas[folder]} for a, r, _, folder in rooms]


def _prepared(folder: Path, room_dir: Path) -> dict[str, Any] | None:
    """The record of ``folder`` if it holds ``room_dir`` as its annotation files are now, else None."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("sources") == room_sources(room_dir) else None


def load_room(folder: Path) -> Sample:
    """A prepared room: coord (n, 3) float32 with z from the room's lowest point,
    colour (n, 3) float32 in [0, 1], label (n,) int64."""
    arrays = load_arrays(folder, ["coord", "colour", "label"])
    if len(arrays) != 3:
        raise DataError(f"{folder}: incomplete prepared room (delete the folder to prepare it again)")
    coord = np.array(arrays["coord"], dtype=np.float32)  # (n, 3)
    coord[:, 2] -= coord[:, 2].min()
    return {
        "coord": coord,
        "colour": np.asarray(arrays["colour"], dtype=np.float32) / 255.0,  # (n, 3)
        "label": np.asarray(arrays["label"], dtype=np.int64),  # (n,)
    }


# --------------------------------------------------------------------------- datasets


class S3DISRooms(SceneSource):
    """Prepared rooms as whole scenes (evaluation on every original point)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def name(self, index: int) -> str:
        r = self.records[index]
        return f"Area_{r['area']}_{r['room']}"

    def key(self, index: int) -> str:
        r = self.records[index]
        return f"{r['folder']}:{r['points']}"

    def load(self, index: int) -> Sample:
        return load_room(self.records[index]["folder"])


def box_crop(sample: Sample, size: float, n: int, rng: np.random.Generator, tries: int = 10) -> Sample:
    """A random ``size`` x ``size`` xy column around a random point, resampled to ``n`` points."""
    coord = sample["coord"]  # (m, 3)
    best = np.zeros(0, dtype=np.int64)
    for _ in range(tries):
        centre = coord[rng.integers(len(coord)), :2]
        inside = np.flatnonzero(np.all(np.abs(coord[:, :2] - centre) <= size / 2, axis=1))
        if len(inside) > len(best):
            best = inside
        if len(best) >= n:
            break
    pick = rng.choice(best, n, replace=len(best) < n)  # (n,)
    return index_points(sample, pick)


class S3DISTrainDataset(SceneCrops):
    """Training crops of grid-sampled rooms (a new crop each time an item is drawn)."""

    def __init__(self, records: list[dict[str, Any]], cfg: S3DISConfig, transform: Compose, seed: int) -> None:
        super().__init__(len(records), cfg.loop, cfg.grid_size, "keep", cfg.features, transform, seed)
        self.records = records
        self.cfg = cfg
        self._sphere = SphereCrop(cfg.crop_points, mode="random")

    def describe_item(self, index: int) -> str:
        r = self.records[index % len(self.records)]
        return f"Area_{r['area']}/{r['room']}"

    def load(self, index: int, rng: np.random.Generator) -> Sample:
        sample = self.grid(load_room(self.records[index % len(self.records)]["folder"]), rng)
        if self.cfg.crop == "sphere":
            sample = self._sphere(sample, rng)
        elif self.cfg.crop == "box":
            sample = box_crop(sample, self.cfg.box_size, self.cfg.crop_points, rng)
        return self.shift(sample)


def _split_rooms(records: list[dict[str, Any]], cfg: S3DISConfig, root: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """Rooms of each split; the test and validation areas must be among the areas found."""
    found = sorted({r["area"] for r in records})
    where = f" under {root}" if root is not None else ""
    listing = ", ".join(map(str, found))
    if cfg.val_area is not None and cfg.val_area == cfg.test_area:
        raise ConfigError(f"data.val_area: {cfg.val_area} is the test area; validation must not use test data")
    for key, area in (("test_area", cfg.test_area), ("val_area", cfg.val_area)):
        if area is not None and area not in found:
            null = " or null (no test area; then evaluate with evaluation.split=val)" if key == "test_area" else " or null (a val_fraction of the training rooms)"
            raise ConfigError(f"data.{key}: Area_{area} has no rooms{where} (areas found: {listing}); "
                              f"set data.{key} to one of {listing}{null}")
    test = [r for r in records if r["area"] == cfg.test_area]
    rest = [r for r in records if r["area"] != cfg.test_area]
    if cfg.val_area is not None:
        val = [r for r in rest if r["area"] == cfg.val_area]
        train = [r for r in rest if r["area"] != cfg.val_area]
    else:
        order = np.random.default_rng(cfg.split_seed).permutation(len(rest))
        k = int(round(cfg.val_fraction * len(rest)))
        if cfg.val_fraction > 0 and len(rest) > 1:
            k = min(max(k, 1), len(rest) - 1)
        held = set(order[:k].tolist())
        val = [r for i, r in enumerate(rest) if i in held]
        train = [r for i, r in enumerate(rest) if i not in held]
    if not train:
        raise DataError(f"no training rooms left{where} after holding out the test and validation rooms (areas found: "
                        f"{listing}); use data.test_area=null or another data.val_area")
    return {"train": train, "val": val, "test": test}


@DATASETS.register("s3dis", config=S3DISConfig, predictor=predict_s3dis_file)
def build_s3dis(cfg: S3DISConfig, ctx: BuildContext) -> SceneSegmentationTask:
    """S3DIS indoor semantic segmentation (13 classes, Area 5 held out by default)."""
    root = ctx.resolve(cfg.root) if cfg.root else default_data_root() / "Stanford3dDataset_v1.2_Aligned_Version"
    if not root.is_dir():
        raise DataError(f"{root}: S3DIS folder not found (set data.root; see datasets/s3dis/README.md)")
    cache_root = ctx.cache_dir / "s3dis" / cache_key("s3dis-v1", str(root.resolve()), cfg.malformed_lines)
    records = prepare_s3dis(root, cache_root, cfg.malformed_lines)
    rooms = _split_rooms(records, cfg, root)
    splits, transforms = scene_datasets(
        cfg, DEFAULT_TRAIN_TRANSFORMS, lambda tf: S3DISTrainDataset(rooms["train"], cfg, tf, ctx.seed),
        lambda split: S3DISRooms(rooms[split]), features=cfg.features, part_z="keep", seed=ctx.seed,
        cache_dir=cache_root,
    )

    skipped = sum(len(v) for r in records for v in r["skipped_lines"].values())
    info = DataInfo(
        num_classes=len(S3DIS_CLASSES),
        class_names=list(S3DIS_CLASSES),
        in_channels=feature_channels(cfg.features),
        task="segmentation",
        features=list(cfg.features),
    )
    protocol = {
        "dataset": "s3dis",
        "root": str(root),
        "test": (f"Area {cfg.test_area}, every original point (export); items are grid-sampled rooms"
                 if cfg.test_area is not None else "none (data.test_area: null)"),
        "areas": sorted({r["area"] for r in records}),
        "val": (f"Area {cfg.val_area}" if cfg.val_area is not None
                else f"{cfg.val_fraction:g} of training rooms, seed {cfg.split_seed}"),
        "rooms": {k: len(v) for k, v in rooms.items()},
        "grid_size": cfg.grid_size,
        "crop": cfg.crop if cfg.crop == "none" else f"{cfg.crop} of {cfg.crop_points} points",
        "malformed_lines": f"{cfg.malformed_lines} ({skipped} skipped)",
        **transforms,
    }
    state = {
        "features": list(cfg.features),
        "grid_size": cfg.grid_size,
        "eval_max_points": cfg.eval_max_points,
        "class_aliases": dict(CLASS_ALIASES),
    }
    return SceneSegmentationTask(info, splits, protocol=protocol, state=state)
