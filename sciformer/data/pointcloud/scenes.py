"""Whole scenes (rooms, tiles): evaluation and prediction on every original point.

A scene is grid-sampled (the inverse index kept) and split into compact parts of at
most ``max_points`` points; each part is a dataset item. Predictions on the parts are
gathered per scene and mapped back through the inverse to every original point, where
predictions are written (.npy, .ply) and handed, with the labels, to the engine's scorer.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import AfterValidator

from sciformer.contracts import Batch, PredictFn, PredictOptions, ScoreFn
from sciformer.data.pointcloud.cache import cache_key
from sciformer.data.pointcloud.chunking import (
    check_finite_scores,
    grid_parts,
    partition_points,
    predict_chunked,
    tta_views,
)
from sciformer.data.pointcloud.dataset import PointDataset, PointTask
from sciformer.data.pointcloud.file_rows import file_rows, loaded_file_rows
from sciformer.data.pointcloud.io import write_ply
from sciformer.data.pointcloud.sample import (
    assemble_features,
    split_by_offset,
)
from sciformer.data.pointcloud.scene_labels import check_labelled
from sciformer.data.transforms import (
    CenterShift,
    Compose,
    Sample,
    build_transforms,
    index_points,
    point_values,
)
from sciformer.errors import DataError
from sciformer.utils.atomic import atomic_write_text, atomic_write_with


def check_eval_transform_specs(specs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Pydantic ``AfterValidator`` for scene evaluation transforms: valid and keeping every point.

    Scene predictions are mapped back to every original point, so evaluation
    transforms may move points (rotate, scale) but not drop or reorder them.
    """
    for i, t in enumerate(build_transforms(specs, key="").transforms):
        if not t.keeps_points:
            raise ValueError(f"[{i}] {t!r} drops or reorders points; scene evaluation maps predictions "
                             "back to every original point, so eval transforms must keep all points in order")
    return specs


# A config field holding scene evaluation transforms (points kept in order), checked when the config loads.
EvalTransformList = Annotated[list[dict[str, Any]] | None, AfterValidator(check_eval_transform_specs)]


class SceneSource(ABC):
    """Whole scenes (rooms, tiles) at full resolution, for evaluation on every point."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def name(self, index: int) -> str:
        """A file-name-safe scene name (e.g. ``Area_5_office_1``)."""

    @abstractmethod
    def key(self, index: int) -> str:
        """A stable identity of the scene's content (for caches)."""

    @abstractmethod
    def load(self, index: int) -> Sample:
        """coord (n, 3) float64, label (n,) int64 and optional colour/intensity/normal."""

    def unlabelled_hint(self) -> str:
        """Why the scenes read so far hold no labelled point (e.g. the raw ids no class takes), or ""."""
        return ""

    def left_out_rows(self, index: int) -> tuple[np.ndarray, int] | None:
        """Rows of the scene's file that :meth:`load` left out (points without finite
        coordinates or features) and the file's row count; None when every row is loaded."""
        return None


class SceneEvalDataset(PointDataset):
    """Every point of whole scenes, for validation and test.

    Each scene is grid-sampled (the point nearest each voxel's centre, chosen by value, ``inverse`` kept) and split
    into compact parts of at most ``max_points`` points, which are the items;
    part coordinates are recentred (x, y by the bbox centre, z by ``part_z``). The
    engine's metrics on items are computed on the grid-sampled points;
    :func:`scene_predictions` maps predictions back to every original point.
    """

    def __init__(
        self,
        source: SceneSource,
        *,
        grid_size: float | None,
        max_points: int | None,
        part_z: str,
        transform: Compose | None,
        features: Sequence[str],
        seed: int,
        cache_dir: Path | None = None,
    ) -> None:
        super().__init__(transform, features, train=False, seed=seed)
        self.source = source
        self.grid_size = grid_size
        self.max_points = max_points
        self._shift = CenterShift(z=part_z)  # type: ignore[arg-type]
        self._cache: OrderedDict[int, tuple[Sample, np.ndarray, np.ndarray, list[np.ndarray], list[slice]]] = OrderedDict()
        counts = self._part_counts(cache_dir)
        self.items = [(s, p) for s, c in enumerate(counts) for p in range(c)]

    def _part_counts(self, cache_dir: Path | None) -> list[int]:
        params = [self.grid_size, self.max_points, "parts-v3"]  # v3: gross outliers are parts of their own
        index_file = None
        known: dict[str, int] = {}
        if cache_dir is not None:
            index_file = cache_dir / "scene_parts" / f"{cache_key(params)}.json"
            if index_file.is_file():
                known = json.loads(index_file.read_text())
        counts = []
        changed = False
        for s in range(len(self.source)):
            key = self.source.key(s)
            if key not in known:
                known[key] = len(self._scene(s)[3])
                changed = True
            counts.append(known[key])
        if index_file is not None and changed:
            atomic_write_text(index_file, json.dumps(known))
        return counts

    def _scene(self, s: int) -> tuple[Sample, np.ndarray, np.ndarray, list[np.ndarray], list[slice]]:
        """(full scene, keep (m,), inverse (n,), parts as index arrays into keep, one slice of
        keep per cloud predicted apart: the scene, then each group of gross outliers)."""
        if s in self._cache:
            self._cache.move_to_end(s)
            return self._cache[s]
        full = self.source.load(s)
        coord = full["coord"]  # (n, 3)
        if coord.shape[0] == 0:
            raise DataError(f"scene {self.source.name(s)}: empty point cloud (0 points)")
        keep, inverse, clouds = grid_parts(coord, self.grid_size, point_values(full, self.features))
        parts = [part.start + p for part in clouds for p in partition_points(coord[keep[part]], self.max_points)]
        entry = (full, keep, inverse, parts, clouds)
        self._cache[s] = entry
        while len(self._cache) > 2:
            self._cache.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self.items)

    def describe_item(self, index: int) -> str:
        s, p = self.items[index]
        return f"scene {self.source.name(s)} part {p}"

    def positions(self, index: int) -> tuple[int, np.ndarray]:
        """(scene index, positions of the item's points among the scene's sampled points)."""
        s, p = self.items[index]
        return s, self._scene(s)[3][p]

    def __getitem__(self, index: int) -> Sample:
        sample = super().__getitem__(index)
        expected = len(self.positions(index)[1])
        if sample["coord"].shape[0] != expected:
            raise DataError(f"{self.describe_item(index)}: eval transforms changed {expected} points into "
                            f"{sample['coord'].shape[0]}; they must keep every point in order")
        return sample

    def prepare(self, sample: Sample) -> Sample:
        """Any part of a scene (raw arrays, e.g. an overlapping chunk) -> a model-ready item,
        made exactly as the items are (recentring, eval transforms, features)."""
        sample = self.transform(self._shift(sample), np.random.default_rng([self.seed, 0]))
        return assemble_features(sample, self.features, "scene chunk")

    def load(self, index: int, rng: np.random.Generator) -> Sample:
        s, p = self.items[index]
        full, keep, _, parts, _ = self._scene(s)
        sample = index_points(full, keep[parts[p]])
        sample.pop("inverse", None)
        return self._shift(sample)


def _flag(export: Any, name: str, default: bool) -> bool:
    if export is None:
        return default
    if isinstance(export, dict):
        return bool(export.get(name, default))
    return bool(getattr(export, name, default))


def predict_scene(
    dataset: SceneEvalDataset,
    scene: int,
    predict: PredictFn,
    collate: Callable[[list[Sample]], Batch],
    *,
    batch_size: int,
    num_classes: int,
    overlap: float = 0.0,
    views: Sequence[Any] = (None,),
) -> np.ndarray:
    """Predicted class of every original point of ``scene`` (items batched, mapped back).

    With ``overlap > 0`` or test-time ``views`` (see :mod:`sciformer.data.pointcloud.chunking`)
    the grid-sampled scene is predicted in overlapping chunks of at most the dataset's
    ``max_points``, with the softmax of every chunk and view summed per point. Non-finite
    scores (a diverged model) are a DataError naming the point, never class 0.

    Shapes: -> (n,) int64, n = the scene's full point count.
    """
    full, keep, inverse, _, clouds = dataset._scene(scene)
    rows = loaded_file_rows(dataset.source.left_out_rows(scene))  # (n,) or None: loaded point -> file row
    ids = keep if rows is None else rows[keep]  # (m,) the file rows errors name
    if overlap > 0 or tuple(views) != (None,):
        probs = np.zeros((len(keep), num_classes), dtype=np.float32)  # (m, C)
        for part in clouds:  # the scene, then each group of gross outliers, as predict does
            probs[part] = predict_chunked(predict, index_points(full, keep[part]), dataset.prepare, num_classes=num_classes,
                                          max_points=dataset.max_points, overlap=overlap, batch_size=batch_size,
                                          views=views, collate=collate, point_ids=ids[part])
        return probs.argmax(axis=1)[inverse].astype(np.int64)  # (n,)
    item_ids = [i for i, (s, _) in enumerate(dataset.items) if s == scene]
    logits_kept = np.zeros((len(keep), num_classes), dtype=np.float32)  # (m, C)
    step = max(1, batch_size)
    for start in range(0, len(item_ids), step):
        chunk = item_ids[start : start + step]
        batch = collate([dataset[i] for i in chunk])
        with torch.no_grad():
            logits = predict(batch).detach().float().cpu().numpy()  # (N, C)
        total = int(batch["offset"][-1])
        if logits.shape != (total, num_classes):
            raise DataError(f"predict returned logits of shape {logits.shape}, expected ({total}, {num_classes})")
        probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()  # (N, C) inf or NaN logits -> NaN
        check_finite_scores(probs, np.concatenate([dataset.positions(i)[1] for i in chunk]), ids)
        for i, part in zip(chunk, split_by_offset(logits, batch["offset"].numpy()), strict=True):
            logits_kept[dataset.positions(i)[1]] = part
    return logits_kept.argmax(axis=1)[inverse].astype(np.int64)  # (n,)


def scene_predictions(
    dataset: SceneEvalDataset,
    predict: PredictFn,
    collate: Callable[[list[Sample]], Batch],
    *,
    batch_size: int,
    class_names: Sequence[str],
    out_dir: Path | None = None,
    write_npy: bool = True,
    write_ply_files: bool = True,
    write_png: bool = False,
    overlap: float = 0.0,
    views: Sequence[Any] = (None,),
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Predict every scene, map back to every original point, write its files, yield (label, pred).

    The caller scores the pairs (the engine's :func:`~sciformer.engine.metrics.label_scorer`);
    the data layer computes no metric. With ``out_dir``, writes per scene
    ``<name>_pred.npy`` int64 with one row per row of the scene's file (-1 on rows the
    source left out: :meth:`SceneSource.left_out_rows`), ``<name>.ply`` of the loaded points with x, y, z, colour, ``pred`` and
    ``label``, and ``<name>.png`` (top views of prediction and truth with a class legend),
    each switchable. ``overlap`` and ``views`` as in :func:`predict_scene`.

    Shapes: yields label (n,) int64 (ignored points kept), pred (n,) int64 per scene.
    """
    num_classes = len(class_names)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for s in sorted({s for s, _ in dataset.items}):
        pred = predict_scene(dataset, s, predict, collate, batch_size=batch_size, num_classes=num_classes,
                             overlap=overlap, views=views)
        full = dataset._scene(s)[0]
        label = np.asarray(full["label"], dtype=np.int64)  # (n,)
        if out_dir is not None:
            name = dataset.source.name(s)
            if write_npy:  # one row per row of the file, -1 where a point was left out
                rows = file_rows(pred, dataset.source.left_out_rows(s))
                atomic_write_with(out_dir / f"{name}_pred.npy", lambda tmp, rows=rows: np.save(tmp, rows))
            if write_ply_files:
                write_ply(out_dir / f"{name}.ply", np.asarray(full["coord"]), full.get("colour"),
                          pred=pred.astype(np.int32), label=label.astype(np.int32))
            if write_png:
                from sciformer.data.pointcloud.render import render_labels

                render_labels(out_dir / f"{name}.png", np.asarray(full["coord"]), {"prediction": pred, "truth": label},
                              class_names, max_points=100_000, title=name)
        yield label, pred


class ArrayScene(SceneSource):
    """One scene held in memory (a file given to a predictor)."""

    def __init__(self, sample: Sample, name: str) -> None:
        self.sample = sample
        self._name = name

    def __len__(self) -> int:
        return 1

    def name(self, index: int) -> str:
        return self._name

    def key(self, index: int) -> str:
        return self._name

    def load(self, index: int) -> Sample:
        return self.sample


class SceneSegmentationTask(PointTask):
    """Segmentation of whole scenes: test metrics on every original point."""

    def scene_names(self, split: str) -> list[str]:
        """Names of the whole scenes (rooms, tiles) of a validation or test split."""
        source = self._scene_source(split)
        return [source.name(i) for i in range(len(source))]

    def check_trainable(self) -> None:
        """Refuse training scenes with no labelled point (:func:`check_labelled`, with the source's hint)."""
        source = getattr(self.dataset("train"), "source", None)
        if isinstance(source, SceneSource):  # read until a scene holds a labelled point
            check_labelled((source.load(i)["label"] for i in range(len(source))), len(source), source.unlabelled_hint)

    def class_counts(self) -> list[int] | None:
        """Labelled points per class over every point of the whole training scenes (None when
        the training dataset does not expose them as a ``source``)."""
        source = getattr(self.dataset("train"), "source", None)
        if not isinstance(source, SceneSource):
            return None
        counts = np.zeros(self.info.num_classes, dtype=np.int64)  # (K,)
        for i in range(len(source)):
            label = np.asarray(source.load(i)["label"]).reshape(-1)  # (n,)
            counts += np.bincount(label[label >= 0], minlength=self.info.num_classes)[: self.info.num_classes]
        return [int(c) for c in counts]

    def scene(self, split: str, index: int) -> Sample:
        """Scene ``index`` of ``split`` at full resolution: coord (n, 3) float64, label (n,), ..."""
        return self._scene_source(split).load(index)

    def _scene_source(self, split: str) -> SceneSource:
        dataset = self.dataset(split)
        if not isinstance(dataset, SceneEvalDataset):
            raise DataError(f"split '{split}' is not made of whole scenes (only val and test are)")
        return dataset.source

    def check_test_views(self, views: PredictOptions) -> None:
        """Every view is accepted: turns about z, mirrors and chunk overlap (checked by PredictOptions)."""

    def export_predictions(self, predict: PredictFn, out_dir: Path, batch_size: int, export: Any, split: str = "test",
                           score: ScoreFn | None = None, views: PredictOptions | None = None) -> dict[str, Any]:
        """Predict every ``split`` scene, write per-point predictions, return ``score`` of every point.

        ``views``: the test-time views (turns about z, mirrors) and chunk overlap of every
        scene, softmax summed per point (None: each evaluation item once, no overlap).

        ``export.npy`` / ``export.ply`` / ``export.png`` (attributes or dict keys, default
        True) switch the ``<scene>_pred.npy``, ``<scene>.ply`` and ``<scene>.png`` files.
        With ``score`` the labels of every original point are scored into
        ``{"full_resolution": {...scores, "points", "scenes"}}``; without, only files are written.
        """
        dataset = self.dataset(split)
        if not isinstance(dataset, SceneEvalDataset):
            raise DataError(f"split '{split}' is not made of whole scenes (only val and test are)")
        pairs = scene_predictions(
            dataset,
            predict,
            self.collate,
            batch_size=batch_size,
            class_names=self.info.class_names,
            out_dir=Path(out_dir),
            write_npy=_flag(export, "npy", True),
            write_ply_files=_flag(export, "ply", True),
            write_png=_flag(export, "png", True),
            overlap=0.0 if views is None else views.overlap,
            views=(None,) if views is None else tta_views(views.rotations, views.flip),
        )
        ids = sorted({s for s, _ in dataset.items})
        if score is None:
            for _ in pairs:
                pass
            return {}
        full = {**score(pairs), "scenes": len(ids)}
        # points of the files the model could not see (non-finite coordinates): in no score
        left_out = sum(len(r[0]) for r in map(dataset.source.left_out_rows, ids) if r is not None)
        return {"full_resolution": {**full, "left_out_points": left_out} if left_out else full}
