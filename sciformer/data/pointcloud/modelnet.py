"""ModelNet shape classification (ModelNet10 / ModelNet40), in three layouts.

Get it from the Princeton ModelNet site (raw ``.off`` meshes) or the widely used
derived releases; see ``datasets/modelnet/README.md``. Layouts (``layout: auto``
detects them):

``h5`` (``modelnet40_ply_hdf5_2048``; the real ModelNet10 copy in
``$SCIFORMER_DATA/modelnet10_hdf5_1024`` uses it)::

    root/shape_names.txt              class names, line index = label
    root/train_files.txt, test_files.txt   h5 file names (a leading folder is ignored)
    root/ply_data_train0.h5 ...       'data' (n, P, 3) float32, 'label' (n, 1), optional 'normal'

``normal_resampled`` (``modelnet40_normal_resampled``)::

    root/modelnet40_shape_names.txt   (modelnet10_shape_names.txt for variant modelnet10)
    root/modelnet40_train.txt, modelnet40_test.txt   shape ids like 'airplane_0001'
    root/airplane/airplane_0001.txt   lines 'x,y,z,nx,ny,nz' (10,000 points)

``off`` (the original meshes)::

    root/<class>/train/<class>_0001.off, root/<class>/test/...

Each shape keeps its first ``num_points`` points (h5 and text files store points
in random order); meshes are sampled once (area-weighted, seeded) and scaled to
the unit sphere. Text and mesh layouts are converted once into ``ctx.cache_dir``
(never beside the raw data). Validation is a stratified, seeded fraction of the
training shapes; the test split is never used to choose anything. With
``evaluation.votes: V`` the final evaluation averages the class probabilities of
V copies of each shape drawn through ``vote_transforms`` (default: the training
transforms), as PointNet++ and Point Transformer do for their reported figures.

Samples: coord (num_points, 3), feat from ``features`` (``coord``, ``normal``),
label () int64.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sciformer.contracts import (
    SEED_MAX,
    BuildContext,
    DataInfo,
    PredictFn,
    PredictOptions,
    default_data_root,
)
from sciformer.data.pointcloud.dataset import (
    PointDataset,
    PointTask,
    stratified_holdout,
)
from sciformer.data.pointcloud.io import (
    read_point_file,
    sample_mesh_surface,
)
from sciformer.data.pointcloud.modelnet_layouts import (
    detect_layout,
    load_h5_layout,
    load_normal_resampled_layout,
    load_off_layout,
)
from sciformer.data.pointcloud.sample import (
    assemble_features,
    check_features,
    collate_points,
    feature_channels,
)
from sciformer.data.pointcloud.shape_input import check_degenerate
from sciformer.data.predicting import start_prediction, state_value
from sciformer.data.transforms import (
    Compose,
    FixedPoints,
    NormalizeScale,
    Sample,
    TransformList,
    build_transforms,
    index_points,
)
from sciformer.errors import DataError
from sciformer.registry import DATASETS
from sciformer.utils.atomic import atomic_write_bytes

DEFAULT_TRAIN_TRANSFORMS: list[dict[str, Any]] = [
    {"name": "random_scale", "scale": [0.8, 1.25], "anisotropic": True},
    {"name": "random_jitter", "sigma": 0.01, "clip": 0.05},
    {"name": "shuffle_points"},
]


class ModelNetConfig(BaseModel):
    """``data:`` parameters of the ``modelnet`` dataset."""

    model_config = ConfigDict(extra="forbid")

    root: str | None = None  # default: $SCIFORMER_DATA/modelnet10_hdf5_1024
    layout: Literal["auto", "h5", "normal_resampled", "off"] = "auto"
    variant: Literal["modelnet40", "modelnet10"] = "modelnet40"  # normal_resampled list files
    num_points: int = Field(1024, gt=0)
    features: Annotated[list[str], AfterValidator(lambda v: check_features(v, ["coord", "normal"]))] = ["coord"]
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0)  # of the training shapes, per class
    split_seed: int = Field(0, ge=0, le=SEED_MAX)
    sample_seed: int = Field(0, ge=0, le=SEED_MAX)  # mesh surface sampling (layout off)
    train_transforms: TransformList = None  # None: DEFAULT_TRAIN_TRANSFORMS; []: none
    eval_transforms: TransformList = None  # None: none
    vote_transforms: TransformList = None  # test-time voting (evaluation.votes > 1); None: the training transforms


def train_transforms(cfg: ModelNetConfig) -> Compose:
    """The training augmentation (``data.train_transforms``, default :data:`DEFAULT_TRAIN_TRANSFORMS`)."""
    specs = DEFAULT_TRAIN_TRANSFORMS if cfg.train_transforms is None else cfg.train_transforms
    return build_transforms(specs, "data.train_transforms")


def vote_transforms(cfg: ModelNetConfig) -> Compose:
    """What each test-time vote draws through (``data.vote_transforms``, default the training ones)."""
    if cfg.vote_transforms is None:
        return train_transforms(cfg)
    return build_transforms(cfg.vote_transforms, "data.vote_transforms")


# --------------------------------------------------------------------------- dataset


class ShapeDataset(PointDataset):
    """Shapes held in memory: the first ``num_points`` points of each, one class label."""

    def __init__(
        self,
        points: np.ndarray,
        normals: np.ndarray | None,
        labels: np.ndarray,
        index: np.ndarray,
        num_points: int,
        *,
        transform: Compose | None,
        features: list[str],
        train: bool,
        seed: int,
    ) -> None:
        super().__init__(transform, features, train=train, seed=seed)
        self.points = points  # (S, P, 3)
        self.normals = normals  # (S, P, 3) or None
        self.labels = labels  # (S,)
        self.index = np.asarray(index, dtype=np.int64)
        self.num_points = num_points

    def __len__(self) -> int:
        return len(self.index)

    def describe_item(self, index: int) -> str:
        return f"shape {int(self.index[index])}"

    def load(self, index: int, rng: np.random.Generator) -> Sample:
        j = int(self.index[index])
        sample: Sample = {
            "coord": np.array(self.points[j, : self.num_points], dtype=np.float32),  # (P, 3)
            "label": np.int64(self.labels[j]),
        }
        if self.normals is not None:
            sample["normal"] = np.array(self.normals[j, : self.num_points], dtype=np.float32)  # (P, 3)
        return sample


CLASS_OUTPUTS = (".json", ".npy")  # shape classification: the class and its probabilities


def shape_points(sample: Sample, n: int, seed: int = 0) -> Sample:
    """``n`` points of a shape file, as training draws them from its randomly ordered files: a
    seeded random subset (repeated cyclically below ``n``), taken from the points in
    lexicographic order so that the file's own order (scan lines, sorted by height) changes nothing.

    Shapes: per-point arrays (m, ...) -> (n, ...).
    """
    columns = np.hstack([np.asarray(sample[k], dtype=np.float64).reshape(len(sample["coord"]), -1)
                         for k in ("coord", "normal") if k in sample])  # (m, 3 or 6)
    canonical = np.lexsort(columns.T[::-1])  # (m,) by x, y, z, then the normal (a point repeated with other normals)
    return FixedPoints(n)(index_points(sample, canonical[np.random.default_rng(seed).permutation(len(canonical))]))


def predict_modelnet_file(
    cfg: ModelNetConfig,
    state: dict[str, Any],
    predict: PredictFn,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    *,
    options: PredictOptions | None = None,
) -> Path:
    """Classify one shape file (.off/.ply mesh: surface-sampled; point files: a seeded random
    subset of ``num_points`` points, the same whatever order the file lists them in).

    The shape is brought to the unit sphere as in training; one whose points all coincide is
    refused, one with few distinct points predicted with a warning
    (:func:`~sciformer.data.pointcloud.shape_input.check_degenerate`). ``options.votes > 1``
    averages the probabilities of that many copies drawn through the vote transforms
    (seeded, so repeatable). Output by suffix: ``.json`` (class name, index and
    per-class probabilities) or ``.npy`` (probabilities (num_classes,) float32).
    """
    options, input_path, output_path = start_prediction(
        "modelnet", options, input_path, output_path, CLASS_OUTPUTS,
        refuse=("overlap", "rotations", "flip", "category", "labels", "probabilities"))
    num_points = int(state_value(state, "num_points", "modelnet"))
    features = list(state_value(state, "features", "modelnet"))
    class_names = [str(n) for n in state_value(state, "class_names", "modelnet")]
    data = read_point_file(input_path, options.columns)
    if "faces" in data and len(data["faces"]):
        coord, normal = sample_mesh_surface(data["coord"], data["faces"], num_points, seed=0, return_normals=True,
                                            source=input_path)
        sample: Sample = {"coord": coord, "normal": normal}
    else:
        sample = shape_points({k: v for k, v in data.items() if k in ("coord", "normal")}, num_points)
    if "normal" in features and "normal" not in sample:
        raise DataError(f"{input_path}: the model uses normals but the file has none")
    # all at one location: refused; few distinct points: a warning (a mesh: its surface samples, not its vertices)
    check_degenerate(sample["coord"] if "faces" in data and len(data["faces"]) else data["coord"], num_points, str(input_path))
    sample = NormalizeScale()(sample)
    if options.votes == 1:
        transform = build_transforms(cfg.eval_transforms, "data.eval_transforms")
    else:
        transform = vote_transforms(cfg)
    items = [assemble_features(transform(dict(sample), np.random.default_rng([0, v])), features, str(input_path))
             for v in range(options.votes)]
    prob = np.zeros(len(class_names), dtype=np.float64)  # (C,)
    for start in range(0, len(items), max(1, batch_size)):
        batch = collate_points(items[start : start + max(1, batch_size)])
        with torch.no_grad():
            logits = predict(batch).detach().float().cpu()  # (b, C)
        if logits.shape != (len(batch["offset"]), len(class_names)):
            raise DataError(f"predict returned logits of shape {tuple(logits.shape)}, "
                            f"expected ({len(batch['offset'])}, {len(class_names)})")
        prob += torch.softmax(logits, dim=1).sum(dim=0).double().numpy()
    prob = (prob / options.votes).astype(np.float32)  # (C,)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    if output_path.suffix.lower() == ".npy":
        np.save(output_path, prob.astype(np.float32))
        return output_path
    best = int(prob.argmax())
    report = {"file": str(input_path), "class": class_names[best], "index": best,
              "probabilities": {name: round(float(p), 6) for name, p in zip(class_names, prob, strict=True)}}
    atomic_write_bytes(output_path, (json.dumps(report, indent=1) + "\n").encode())
    return output_path


predict_modelnet_file.suffixes = CLASS_OUTPUTS  # type: ignore[attr-defined]  # checked before the model loads


@DATASETS.register("modelnet", config=ModelNetConfig, predictor=predict_modelnet_file)
def build_modelnet(cfg: ModelNetConfig, ctx: BuildContext) -> PointTask:
    """ModelNet10/40 shape classification (h5, normal_resampled text or raw .off layouts)."""
    root = ctx.resolve(cfg.root) if cfg.root else default_data_root() / "modelnet10_hdf5_1024"
    if not root.is_dir():
        raise DataError(f"{root}: ModelNet folder not found (set data.root; see datasets/modelnet/README.md)")
    layout = detect_layout(root) if cfg.layout == "auto" else cfg.layout
    want_normals = "normal" in cfg.features
    if layout == "h5":
        names, splits = load_h5_layout(root, want_normals)
    elif layout == "normal_resampled":
        names, splits = load_normal_resampled_layout(root, cfg.variant, cfg.num_points, ctx.cache_dir)
    else:
        names, splits = load_off_layout(root, cfg.num_points, cfg.sample_seed, ctx.cache_dir)
    available = splits["train"]["points"].shape[1]
    if available < cfg.num_points:
        raise DataError(f"{root}: shapes have {available} points, fewer than num_points={cfg.num_points}")
    train_idx, val_idx = stratified_holdout(splits["train"]["labels"], cfg.val_fraction, cfg.split_seed)
    train_tf = train_transforms(cfg)
    eval_tf = build_transforms(cfg.eval_transforms, "data.eval_transforms")
    vote_tf = vote_transforms(cfg)
    normals = {s: (splits[s]["normals"] if want_normals else None) for s in splits}

    def make(split: str, index: np.ndarray, train: bool) -> Any:
        source = "train" if split != "test" else "test"
        arr = splits[source]
        return lambda: ShapeDataset(
            arr["points"], normals[source], arr["labels"], index, cfg.num_points,
            transform=train_tf if train else eval_tf, features=cfg.features, train=train, seed=ctx.seed,
        )

    test_idx = np.arange(len(splits["test"]["labels"]))
    info = DataInfo(
        num_classes=len(names),
        class_names=list(names),
        in_channels=feature_channels(cfg.features),
        task="classification",
        features=list(cfg.features),
    )
    protocol = {
        "dataset": "modelnet",
        "layout": layout,
        "root": str(root),
        "num_points": cfg.num_points,
        "features": list(cfg.features),
        "val": f"{cfg.val_fraction:g} of each training class, seed {cfg.split_seed}",
        "test": "official test split (never used for model selection)",
        "train_transforms": repr(train_tf),
        "eval_transforms": repr(eval_tf),
        "vote_transforms": repr(vote_tf),
    }
    state = {"num_points": cfg.num_points, "features": list(cfg.features), "layout": layout}
    return PointTask(
        info,
        {"train": make("train", train_idx, True), "val": make("val", val_idx, False), "test": make("test", test_idx, False)},
        protocol=protocol,
        state=state,
        vote_transform=vote_tf,
    )
