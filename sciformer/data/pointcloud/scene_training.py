"""The training side of whole-scene datasets (S3DIS rooms, LiDAR tiles, your own scene files).

:class:`SceneCrops` is the base of their training datasets (a fresh crop each draw);
:func:`scene_datasets` builds the split factories every scene builder returns
(training crops; validation and test on every point through
:class:`~sciformer.data.pointcloud.scenes.SceneEvalDataset`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.pointcloud.dataset import PointDataset
from sciformer.data.pointcloud.scenes import SceneEvalDataset, SceneSource
from sciformer.data.transforms import CenterShift, Compose, GridSample, Sample, build_transforms


class SceneCrops(PointDataset):
    """Training crops cut afresh from ``num_scenes`` whole scenes, ``per_scene`` items per scene and epoch.

    Subclasses cut the crop in ``load``, with :meth:`grid` (training grid sampling, one
    random point per cell, when ``grid_size`` is set) and :attr:`shift` (x, y by the
    bbox centre, z by ``z``: ``min`` from the lowest point, ``keep`` as is).
    """

    def __init__(self, num_scenes: int, per_scene: int, grid_size: float | None, z: str, features: Sequence[str],
                 transform: Compose, seed: int) -> None:
        super().__init__(transform, features, train=True, seed=seed)
        self.num_scenes = num_scenes
        self.per_scene = per_scene
        self._grid = GridSample(grid_size, mode="train") if grid_size else None
        self.shift = CenterShift(z=z)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.num_scenes * self.per_scene

    def grid(self, sample: Sample, rng: np.random.Generator) -> Sample:
        """``sample`` grid-sampled (training mode, no ``inverse``); as is without ``grid_size``."""
        if self._grid is None:
            return sample
        sample = self._grid(sample, rng)
        sample.pop("inverse", None)
        return sample


def scene_datasets(
    cfg: Any,
    default_train: list[dict[str, Any]],
    make_train: Callable[[Compose], PointDataset],
    source: Callable[[str], SceneSource],
    *,
    features: Sequence[str],
    part_z: str,
    seed: int,
    cache_dir: Path | None = None,
) -> tuple[dict[str, Callable[[], PointDataset]], dict[str, str]]:
    """The split factories of a scene task and the protocol's transform entries.

    ``cfg`` holds ``train_transforms`` (None: ``default_train``), ``eval_transforms``,
    ``grid_size`` and ``eval_max_points``; ``make_train(transform)`` builds the training
    dataset, ``source(split)`` the whole scenes of ``val`` / ``test`` (every point).
    """
    train_tf = build_transforms(default_train if cfg.train_transforms is None else cfg.train_transforms,
                                "data.train_transforms")
    eval_tf = build_transforms(cfg.eval_transforms, "data.eval_transforms")

    def make_eval(split: str) -> Callable[[], PointDataset]:
        return lambda: SceneEvalDataset(source(split), grid_size=cfg.grid_size, max_points=cfg.eval_max_points,
                                        part_z=part_z, transform=eval_tf, features=features, seed=seed,
                                        cache_dir=cache_dir)

    splits = {"train": lambda: make_train(train_tf), "val": make_eval("val"), "test": make_eval("test")}
    return splits, {"train_transforms": repr(train_tf), "eval_transforms": repr(eval_tf)}
