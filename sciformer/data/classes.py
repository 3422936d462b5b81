"""Dataset classes for plain Python: ``ModelNet(root)``, ``S3DIS(root)``, ``ShapeNetPart(root)``,
``LasTiles(root)``, ``HyperspectralScene(source)``.

Each is a thin wrapper over the registered dataset builder an experiment's ``data:``
section names (same parameters, same reading, splits and transforms), indexable and
iterable over one split. Samples:

- point datasets: a dict with ``coord`` (n, 3) float32 (centred / scaled as in training),
  ``feat`` (n, C) float32 (the ``features`` in channel order), ``label`` (a shape's class
  id, or (n,) per-point ids, -1 = unlabelled) and ``category`` (ShapeNetPart);
- ``HyperspectralScene``: a dict with ``patch`` (B, p, p) float32 (normalised on training
  pixels) and ``target`` (class id, 0-based).

Example::

    from sciformer import ModelNet
    train = ModelNet("data/modelnet10_hdf5_1024", split="train", num_points=1024)
    sample = train[0]                  # {"coord": (1024, 3), "feat": (1024, 3), "label": ()}
    print(train.class_names, len(train))
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sciformer.contracts import SPLITS, BuildContext, DataInfo, TaskData
from sciformer.errors import ConfigError
from sciformer.registry import DATASETS


class RegisteredDataset:
    """One split of a registered dataset, built by its builder from keyword parameters.

    ``params`` are the dataset's ``data:`` keys (``sciformer config --list NAME`` lists
    them); relative paths resolve against the working folder. ``split``: ``train``,
    ``val`` or ``test``. ``seed``: the run seed the builder gets (random splits, crops).
    """

    name: str = ""
    path_key: str = "root"
    renamed: dict[str, str] = {}  # noqa: RUF012 - keyword -> config key, where a key clashes with ``split``

    def __init__(self, path: str | os.PathLike[str] | None = None, split: str = "train", *, seed: int = 0,
                 **params: Any) -> None:
        if split not in SPLITS:
            raise ConfigError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
        entry = DATASETS.get(self.name)
        if path is not None:
            params[self.path_key] = os.fspath(path)
        params = {self.renamed.get(k, k): v for k, v in params.items()}
        try:
            self.config = entry.config(**params)
        except Exception as exc:  # pydantic's ValidationError: one line naming the key
            errors = getattr(exc, "errors", None)
            if callable(errors):
                first = errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                raise ConfigError(f"{type(self).__name__}({where}=...): {first.get('msg')}") from None
            raise
        self.split = split
        self.task: TaskData = entry.builder(self.config, BuildContext(base_dir=Path.cwd(), seed=seed))
        self._data = self.task.dataset(split)

    @property
    def info(self) -> DataInfo:
        """Class names, input channels and task of the data."""
        return self.task.info

    @property
    def class_names(self) -> list[str]:
        return list(self.task.info.class_names)

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._data[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    def set_epoch(self, epoch: int) -> None:
        """Training augmentation and crops of ``epoch`` (they depend only on seed, epoch and index)."""
        if hasattr(self._data, "set_epoch"):
            self._data.set_epoch(epoch)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Items -> the batch dict the models take (packed points, or stacked patches)."""
        return self.task.collate(items)

    def as_torch(self) -> Any:
        """The underlying ``torch.utils.data.Dataset`` (for a DataLoader with :meth:`collate`)."""
        return self._data

    def to_pyg(self) -> Any:
        """The split as a dataset of ``torch_geometric.data.Data`` (point datasets; a hyperspectral scene refuses)."""
        from sciformer.geometry.pyg import PyGDataset

        return PyGDataset(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(split={self.split!r}, samples={len(self)}, classes={len(self.class_names)})"


class ModelNet(RegisteredDataset):
    """ModelNet10/40 shape classification (HDF5, normal-resampled text or OFF meshes); ``data.name: modelnet``."""

    name = "modelnet"


class S3DIS(RegisteredDataset):
    """S3DIS indoor rooms, semantic segmentation (crops of rooms); ``data.name: s3dis``."""

    name = "s3dis"


class ShapeNetPart(RegisteredDataset):
    """ShapeNetPart part segmentation (``category`` in every sample); ``data.name: shapenetpart``."""

    name = "shapenetpart"


class LasTiles(RegisteredDataset):
    """Airborne LiDAR tiles (.las/.laz), per-point classification; ``data.name: las_tiles``."""

    name = "las_tiles"


class HyperspectralScene(RegisteredDataset):
    """A hyperspectral scene split into patches (``source``: a file or ``indian_pines``); ``data.name: hsi_scene``.

    The split protocol (``data.split`` of an experiment) is the keyword ``protocol``, e.g.
    ``protocol={"kind": "blocks", "block_size": 12}``; ``split`` picks train, val or test.
    """

    name = "hsi_scene"
    path_key = "source"
    renamed = {"protocol": "split"}  # noqa: RUF012

    def to_pyg(self) -> Any:
        """Refused in one line: the samples are spectral patches, not the point clouds PyG's ``Data`` holds."""
        raise ConfigError("HyperspectralScene.to_pyg(): a hyperspectral scene's samples are (B, p, p) patches, not point clouds; "
                          "to_pyg() is for ModelNet, S3DIS, ShapeNetPart and LasTiles (batch patches with .collate(items))")


__all__ = ["S3DIS", "HyperspectralScene", "LasTiles", "ModelNet", "RegisteredDataset", "ShapeNetPart"]
