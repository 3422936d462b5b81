"""ShapeNetPart part segmentation: 16 object categories, 50 parts.

Get ``shapenetcore_partanno_segmentation_benchmark_v0_normal`` (Yi et al. 2016, with
normals as released with PointNet++; research use); see
``datasets/shapenetpart/README.md``. Expected layout::

    root/synsetoffset2category.txt        lines 'Airplane<TAB>02691156' (16 categories)
    root/train_test_split/shuffled_{train,val,test}_file_list.json
                                          ["shape_data/02691156/1021a0914a7207aff927ed529ad90a11", ...]
    root/02691156/1021a0914a7207aff927ed529ad90a11.txt
                                          lines 'x y z nx ny nz part_label' (global part ids 0..49)

The official train/val/test lists are used as they are. Training samples draw
``num_points`` points at random; evaluation keeps every point. Coordinates are used as
they are (the release is centred and scaled per shape); the checkpoint records each
category's training frame (``shape_frame``), which ``predict`` checks new shapes against. The object category
travels with each sample (``category`` () int64 -> batch ``category`` (B,)); the
task declares each category's parts (``DataInfo.category_parts``), so the engine's
evaluation predicts only among the category's parts and scores instance mIoU (mean
over shapes) and category mIoU (mean over categories), the standard protocol
(``sciformer.engine.metrics.PartIoU``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sciformer.contracts import (
    BuildContext,
    DataInfo,
    default_data_root,
)
from sciformer.data.pointcloud.dataset import (
    PointDataset,
    PointTask,
    read_list_file,
)
from sciformer.data.pointcloud.fields import check_labels
from sciformer.data.pointcloud.file_predictors import predict_shapenetpart_file
from sciformer.data.pointcloud.io import parse_text_table
from sciformer.data.pointcloud.sample import (
    check_features,
    feature_channels,
)
from sciformer.data.pointcloud.shape_input import frame_record
from sciformer.data.pointcloud.split_files import check_disjoint_splits
from sciformer.data.transforms import (
    Compose,
    RandomSample,
    Sample,
    TransformList,
    build_transforms,
)
from sciformer.errors import DataError
from sciformer.registry import DATASETS

# Category -> number of parts, in the standard order; part ids are consecutive.
CATEGORY_PART_COUNTS: dict[str, int] = {
    "Airplane": 4, "Bag": 2, "Cap": 2, "Car": 4, "Chair": 4, "Earphone": 3, "Guitar": 3, "Knife": 2,
    "Lamp": 4, "Laptop": 2, "Motorbike": 6, "Mug": 2, "Pistol": 3, "Rocket": 3, "Skateboard": 3, "Table": 3,
}


def category_parts() -> dict[str, list[int]]:
    """Category -> its global part ids (Airplane: [0, 1, 2, 3], ..., Table: [47, 48, 49])."""
    out, start = {}, 0
    for name, count in CATEGORY_PART_COUNTS.items():
        out[name] = list(range(start, start + count))
        start += count
    return out


CATEGORY_PARTS = category_parts()
CATEGORY_NAMES = list(CATEGORY_PARTS)
PART_NAMES = [f"{cat.lower()}_{i}" for cat, parts in CATEGORY_PARTS.items() for i in range(len(parts))]

DEFAULT_TRAIN_TRANSFORMS: list[dict[str, Any]] = [
    {"name": "random_scale", "scale": [0.8, 1.25], "anisotropic": True},
    {"name": "random_jitter", "sigma": 0.01, "clip": 0.05},
]


# --------------------------------------------------------------------------- dataset


class ShapeNetPartConfig(BaseModel):
    """``data:`` parameters of the ``shapenetpart`` dataset."""

    model_config = ConfigDict(extra="forbid")

    root: str | None = None  # default: $SCIFORMER_DATA/shapenetcore_partanno_segmentation_benchmark_v0_normal
    num_points: int = Field(2048, gt=0)  # training points per shape (random, per epoch)
    eval_num_points: int | None = Field(None, gt=0)  # None: every point (standard)
    features: Annotated[list[str], AfterValidator(lambda v: check_features(v, ["coord", "normal"]))] = ["coord", "normal"]
    categories: list[str] | None = None  # a subset of the 16 (all when None)
    train_transforms: TransformList = None  # None: DEFAULT_TRAIN_TRANSFORMS; []: none
    eval_transforms: TransformList = None


def read_categories(root: Path) -> list[tuple[str, str]]:
    """(category name, synset id) pairs of ``synsetoffset2category.txt``, in file order."""
    path = root / "synsetoffset2category.txt"
    pairs = []
    for i, line in enumerate(read_list_file(path, "category file (synsetoffset2category.txt)")):
        words = line.split()
        if len(words) != 2:
            raise DataError(f"{path}:{i + 1}: expected 'Category<TAB>synset', got {line!r}")
        if words[0] not in CATEGORY_PARTS:
            raise DataError(f"{path}:{i + 1}: unknown category '{words[0]}'; expected one of {', '.join(CATEGORY_NAMES)}")
        pairs.append((words[0], words[1]))
    return pairs


def read_split(root: Path, split: str, synsets: dict[str, str]) -> list[tuple[Path, int]]:
    """(file, category index) of the shapes in the official ``split`` list."""
    path = root / "train_test_split" / f"shuffled_{split}_file_list.json"
    if not path.is_file():
        raise DataError(f"{path}: missing split file")
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(entries, list):
        raise DataError(f"{path}: expected a JSON list of 'shape_data/<synset>/<id>' strings")
    out = []
    for entry in entries:
        parts = str(entry).split("/")
        if len(parts) < 2:
            raise DataError(f"{path}: bad entry {entry!r}; expected 'shape_data/<synset>/<id>'")
        synset, shape_id = parts[-2], parts[-1]
        if synset not in synsets:
            raise DataError(f"{path}: entry {entry!r} has synset {synset} not in synsetoffset2category.txt")
        out.append((root / synset / f"{shape_id}.txt", CATEGORY_NAMES.index(synsets[synset])))
    return out


class PartDataset(PointDataset):
    """ShapeNetPart shapes read on access: coord, normal, part label, category."""

    def __init__(
        self,
        files: list[tuple[Path, int]],
        *,
        sample_points: int | None,
        transform: Compose | None,
        features: list[str],
        train: bool,
        seed: int,
    ) -> None:
        super().__init__(transform, features, train=train, seed=seed)
        self.files = files
        self._sample = RandomSample(sample_points) if sample_points else None

    def __len__(self) -> int:
        return len(self.files)

    def describe_item(self, index: int) -> str:
        return str(self.files[index][0])

    def load(self, index: int, rng: np.random.Generator) -> Sample:
        path, cat = self.files[index]
        if not path.is_file():
            raise DataError(f"{path}: missing shape file listed in the split")
        table, _ = parse_text_table(path, 7)  # (n, 7)
        label = check_labels(path, table[:, 6], "part label column")  # (n,) integer-valued, else refused
        parts = CATEGORY_PARTS[CATEGORY_NAMES[cat]]
        if label.min() < parts[0] or label.max() > parts[-1]:
            raise DataError(
                f"{path}: part labels {label.min()}..{label.max()} outside "
                f"{CATEGORY_NAMES[cat]} parts {parts[0]}..{parts[-1]}"
            )
        sample: Sample = {
            "coord": table[:, :3].astype(np.float32),  # (n, 3)
            "normal": table[:, 3:6].astype(np.float32),  # (n, 3)
            "label": label,
            "category": np.int64(cat),
        }
        return self._sample(sample, rng) if self._sample else sample


@DATASETS.register("shapenetpart", config=ShapeNetPartConfig, predictor=predict_shapenetpart_file)
def build_shapenetpart(cfg: ShapeNetPartConfig, ctx: BuildContext) -> PointTask:
    """ShapeNetPart part segmentation (16 categories, 50 parts, official splits)."""
    root = ctx.resolve(cfg.root) if cfg.root else default_data_root() / "shapenetcore_partanno_segmentation_benchmark_v0_normal"
    if not root.is_dir():
        raise DataError(f"{root}: ShapeNetPart folder not found (set data.root; see datasets/shapenetpart/README.md)")
    pairs = read_categories(root)
    synsets = {syn: name for name, syn in pairs}
    wanted = set(cfg.categories or CATEGORY_NAMES)
    unknown = wanted - set(CATEGORY_NAMES)
    if unknown:
        raise DataError(f"data.categories: unknown {sorted(unknown)}; expected among {', '.join(CATEGORY_NAMES)}")
    splits = {}
    for split in ("train", "val", "test"):
        files = read_split(root, split, synsets)
        splits[split] = [(p, c) for p, c in files if CATEGORY_NAMES[c] in wanted]
    check_disjoint_splits({s: [p for p, _ in files if p.is_file()] for s, files in splits.items()}, "shapes",  # missing: named when read
                          listed="train_test_split/shuffled_{}_file_list.json", copies=False)
    train_tf = build_transforms(DEFAULT_TRAIN_TRANSFORMS if cfg.train_transforms is None else cfg.train_transforms,
                                "data.train_transforms")
    eval_tf = build_transforms(cfg.eval_transforms, "data.eval_transforms")

    def make(split: str) -> Any:
        train = split == "train"
        return lambda: PartDataset(
            splits[split], sample_points=cfg.num_points if train else cfg.eval_num_points,
            transform=train_tf if train else eval_tf, features=cfg.features, train=train, seed=ctx.seed,
        )

    info = DataInfo(
        num_classes=len(PART_NAMES),
        class_names=list(PART_NAMES),
        in_channels=feature_channels(cfg.features),
        task="segmentation",
        features=list(cfg.features),
        category_names=list(CATEGORY_NAMES),
        category_parts={k: list(v) for k, v in CATEGORY_PARTS.items()},
    )
    protocol = {
        "dataset": "shapenetpart",
        "root": str(root),
        "splits": "official shuffled_{train,val,test}_file_list.json",
        "categories": sorted(wanted, key=CATEGORY_NAMES.index),
        "train_points": cfg.num_points,
        "eval_points": cfg.eval_num_points or "all",
        "metric": "instance and category mIoU over each category's parts (DataInfo.category_parts; train.monitor: instance_miou)",
        "train_transforms": repr(train_tf),
        "eval_transforms": repr(eval_tf),
    }
    state = {
        "features": list(cfg.features),
        "category_names": list(CATEGORY_NAMES),
        "category_parts": {k: list(v) for k, v in CATEGORY_PARTS.items()},
    }
    return PointTask(info, {s: make(s) for s in ("train", "val", "test")}, protocol=protocol, state=state,
                     late_state={"shape_frame": lambda: training_frame(splits["train"])})


def training_frame(files: list[tuple[Path, int]]) -> dict[str, dict[str, Any]]:
    """Each category's frame of the training shapes (:func:`~sciformer.data.pointcloud.shape_input.frame_record`:
    centre, spread and radii, every point of every shape), which ``predict`` checks a new shape against.
    One pass over the training files, made when the first checkpoint is written."""
    def shapes() -> Any:
        for path, cat in files:
            if not path.is_file():
                raise DataError(f"{path}: missing shape file listed in the split")
            yield CATEGORY_NAMES[cat], parse_text_table(path, 7)[0][:, :3]  # (n, 3)

    return frame_record(shapes())
