"""File predictors of the S3DIS and ShapeNetPart datasets (``sciformer predict``).

They need only the checkpoint's data state and the dataset config's eval transforms,
so they live apart from the dataset builders: every input point gets one output row
(:mod:`sciformer.data.pointcloud.export`), NaN/Inf points as no data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sciformer.contracts import PredictFn, PredictOptions
from sciformer.data.pointcloud.chunking import check_finite_scores, detached_points
from sciformer.data.pointcloud.export import (
    POINT_OUTPUTS,
    PointPrediction,
    write_point_predictions,
)
from sciformer.data.pointcloud.predict_file import (
    predict_cloud,
    read_cloud,
    require_features,
    valid_points,
)
from sciformer.data.pointcloud.sample import assemble_features, collate_points
from sciformer.data.pointcloud.shape_input import check_degenerate, place_in_frame
from sciformer.data.predicting import start_prediction, state_value
from sciformer.data.transforms import Sample, build_transforms, index_points
from sciformer.errors import DataError
from sciformer.frontend import option


def predict_s3dis_file(
    cfg: Any,
    state: dict[str, Any],
    predict: PredictFn,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    *,
    options: PredictOptions | None = None,
) -> Path:
    """Segment every point of a room file (e.g. ``<room>.txt`` lines 'x y z r g b', .ply, .npy).

    Uses the checkpoint's features and grid size; z is measured from the room's
    lowest point as in training. Output by suffix (:mod:`sciformer.data.pointcloud.export`):
    ``.npy``, ``.npz``, ``.ply`` (class names in the header) or ``.las``/``.laz`` for a
    LAS input; one row per input point, NaN points as no data. ``options`` sets the
    chunk overlap, the test-time views and whether class probabilities are written.
    """
    options, input_path, output_path = start_prediction(
        "s3dis", options, input_path, output_path, POINT_OUTPUTS, refuse=("votes", "category", "labels"))
    features = list(state_value(state, "features", "s3dis"))
    class_names = list(state_value(state, "class_names", "s3dis"))
    data = read_cloud(input_path, options.columns)
    require_features(input_path, data, features)
    coord = np.asarray(data["coord"], dtype=np.float64)  # (n, 3)
    z = coord[:, 2][np.isfinite(coord[:, 2])]
    sample: Sample = {"coord": coord - np.array([0.0, 0.0, z.min() if len(z) else 0.0])}
    if "colour" in data:
        sample["colour"] = data["colour"]
    prediction = predict_cloud(
        predict, sample, class_names=class_names, features=features, grid_size=state.get("grid_size"),
        max_points=cfg.eval_max_points, part_z="keep",
        transform=build_transforms(cfg.eval_transforms, "data.eval_transforms"), batch_size=batch_size,
        options=options, desc=input_path.name,
    )
    out: Sample = {"coord": coord}
    for key in ("colour", "label"):
        if key in data:
            out[key] = data[key]
    return write_point_predictions(output_path, out, prediction, source=input_path, probabilities=options.probabilities)


predict_s3dis_file.suffixes = POINT_OUTPUTS  # type: ignore[attr-defined]  # checked before the model loads


# The synset ids of the release's folders (synsetoffset2category.txt), for telling a shape's category from its path.
CATEGORY_SYNSETS = {
    "02691156": "Airplane", "02773838": "Bag", "02954340": "Cap", "02958343": "Car", "03001627": "Chair",
    "03261776": "Earphone", "03467517": "Guitar", "03624134": "Knife", "03636649": "Lamp", "03642806": "Laptop",
    "03790512": "Motorbike", "03797390": "Mug", "03948459": "Pistol", "04099429": "Rocket", "04225987": "Skateboard",
    "04379243": "Table",
}


def shape_category(input_path: Path, category: str | None, names: Sequence[str]) -> int:
    """Category index of a shape: ``--category`` (any case), else its synset folder, else an error."""
    if category is not None:
        match = [i for i, n in enumerate(names) if n.lower() == category.lower()]
        if not match:
            raise DataError(f"{option('--category', category, quoted=True)}: unknown; expected one of {', '.join(names)}")
        return match[0]
    name = CATEGORY_SYNSETS.get(input_path.parent.name)
    if name is None or name not in names:
        raise DataError(f"{input_path}: cannot tell the shape's category from its folder; pass {option('--category')} "
                        f"(one of {', '.join(names)})")
    return list(names).index(name)


def predict_shapenetpart_file(
    cfg: Any,
    state: dict[str, Any],
    predict: PredictFn,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    *,
    options: PredictOptions | None = None,
) -> Path:
    """Segment a shape file into its category's parts (every point; ``x y z nx ny nz [label]``
    text as released, or PLY / PCD / NPY with normals when the model uses them).

    The category comes from ``options.category`` or the synset folder the file lies in;
    predictions are restricted to its parts (the standard protocol). The model sees the
    coordinates as training did (not centred or scaled): a shape whose centre or radius lies
    far outside its category's training frame (``state['shape_frame']``) is a warning, or
    with ``options.match_frame`` is centred and scaled into it; a shape whose points all
    coincide is refused, one with few distinct points a warning
    (:mod:`sciformer.data.pointcloud.shape_input`). Output by suffix:
    ``.npy`` (n,) global part ids (-1 = no data), ``.npz`` or ``.ply`` (part names in the header).
    """
    options, input_path, output_path = start_prediction(
        "shapenetpart", options, input_path, output_path, PART_OUTPUTS,
        refuse=("overlap", "rotations", "flip", "votes", "labels"), accept=("match_frame",))
    features = list(state_value(state, "features", "shapenetpart"))
    names = [str(n) for n in state_value(state, "category_names", "shapenetpart")]
    parts = {str(k): [int(p) for p in v] for k, v in state_value(state, "category_parts", "shapenetpart").items()}
    cat = shape_category(input_path, options.category, names)
    data = read_cloud(input_path, options.columns)
    require_features(input_path, data, features)
    sample: Sample = {"coord": np.asarray(data["coord"], dtype=np.float64)}
    if "normal" in data:
        sample["normal"] = data["normal"]
    valid = valid_points(sample, features)
    num_classes = sum(len(v) for v in parts.values())
    probs = np.zeros((len(valid), num_classes), dtype=np.float32)  # (n, 50)
    rows = np.flatnonzero(valid)  # (m,)
    transform = build_transforms(cfg.eval_transforms, "data.eval_transforms")
    own = np.asarray(parts[names[cat]])
    clouds = _shape_and_outliers(sample["coord"][rows])  # gross outliers apart: they move no other point
    if clouds:  # the shape itself first
        check_degenerate(sample["coord"][rows[clouds[0]]], cfg.num_points, str(input_path))
        sample["coord"] = place_in_frame(state.get("shape_frame"), names[cat], sample["coord"], rows[clouds[0]],
                                         str(input_path), match=options.match_frame)  # (n, 3)
    for cloud in clouds:
        item = transform(index_points(sample, rows[cloud]), np.random.default_rng([0, 0]))
        batch = collate_points([{**assemble_features(item, features, str(input_path)), "category": np.int64(cat)}])
        with torch.no_grad():
            logits = predict(batch).detach().float().cpu()  # (k, 50)
        restricted = torch.full_like(logits, float("-inf"))
        restricted[:, own] = logits[:, own]
        scores = torch.softmax(restricted, dim=1).numpy()  # (k, 50)
        check_finite_scores(scores, rows[cloud], None)
        probs[rows[cloud]] = scores
    class_names = [f"{c.lower()}_{i}" for c, ps in parts.items() for i in range(len(ps))]
    prediction = PointPrediction(probs, valid, class_names)
    out: Sample = {"coord": np.asarray(data["coord"], dtype=np.float64)}  # as given, even when placed in the frame
    if "label" in data:
        out["label"] = data["label"]
    return write_point_predictions(output_path, out, prediction, source=input_path, probabilities=options.probabilities)


def _shape_and_outliers(coord: np.ndarray) -> list[np.ndarray]:
    """Row sets predicted as clouds of their own: the shape, then each group of gross outliers
    (:func:`~sciformer.data.pointcloud.chunking.detached_points`, e.g. a no-data point at 1e6).

    Shapes: coord (m, 3) -> index arrays covering 0..m-1 once (empty when m = 0).
    """
    groups = detached_points(coord) if len(coord) else []
    rest = np.setdiff1d(np.arange(len(coord)), np.concatenate(groups)) if groups else np.arange(len(coord))
    return [part for part in (rest, *groups) if len(part)]


PART_OUTPUTS = (".npy", ".npz", ".ply")
predict_shapenetpart_file.suffixes = PART_OUTPUTS  # type: ignore[attr-defined]  # checked before the model loads
