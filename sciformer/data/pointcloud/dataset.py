"""Point-cloud datasets and tasks: the base dataset, seeding, splits, the TaskData.

See :mod:`sciformer.data.pointcloud.sample` for the sample and packed-batch layout.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from sciformer.contracts import SPLITS, Batch, DataInfo, TaskData
from sciformer.data.pointcloud.sample import assemble_features, collate_points
from sciformer.data.transforms import Compose, Sample
from sciformer.errors import DataError


def read_list_file(path: Path, what: str) -> list[str]:
    """Non-empty stripped lines of a list file (class names, split lists)."""
    if not path.is_file():
        raise DataError(f"{path}: missing {what}")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        raise DataError(f"{path}: empty {what}")
    return lines


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into (keep, held out): ``fraction`` of each class, seeded.

    Every class with at least two members gives at least one to the held-out part
    when ``fraction > 0``. Both index arrays are sorted.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    if fraction > 0:
        for c in np.unique(labels):
            members = np.flatnonzero(labels == c)
            k = int(round(fraction * len(members)))
            if len(members) >= 2:
                k = min(max(k, 1), len(members) - 1)
            else:
                k = 0
            held.append(rng.permutation(members)[:k])
    out = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    keep = np.setdiff1d(np.arange(len(labels)), out)
    return keep, out


class PointDataset(Dataset):
    """Base of the point datasets: ``load(i, rng)`` -> transforms -> feature assembly.

    Training datasets seed a generator per (seed, epoch set by :meth:`set_epoch`, item
    index); evaluation datasets per item index, so both are deterministic whatever the
    workers, the process (distributed training) or an interruption.
    """

    def __init__(self, transform: Compose | None, features: Sequence[str], *, train: bool, seed: int) -> None:
        self.transform = transform or Compose([])
        self.features = list(features)
        self.train = train
        self.seed = int(seed)
        self.epoch = 0  # training draws: set by set_epoch

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def load(self, index: int, rng: np.random.Generator) -> Sample:
        """The raw sample ``index`` (before the configured transforms)."""

    def set_epoch(self, epoch: int) -> None:
        """Tie training randomness to ``epoch`` (0 until set), so each epoch draws new crops and a
        resumed run draws what an uninterrupted one would; optional for callers."""
        self.epoch = int(epoch)

    def describe_item(self, index: int) -> str:
        """Name of item ``index`` for error messages."""
        return f"item {index}"

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        # training draws are decided by (seed, epoch, sample): alike in any worker, rank or resumed run
        rng = np.random.default_rng([self.seed, self.epoch, index, _TRAIN_STREAM]) if self.train else np.random.default_rng([self.seed, index])
        sample = self.load(index, rng)
        sample = self.transform(sample, rng)
        return assemble_features(sample, self.features, self.describe_item(index))


class VotingDataset(Dataset):
    """Test-time voting view of a :class:`PointDataset`: item i is ``votes`` augmented copies.

    Copy v of item i is ``load(i)`` passed through ``transform`` with a generator
    seeded by (seed, i, v), so votes are reproducible whatever the workers.
    """

    def __init__(self, dataset: PointDataset, transform: Compose, votes: int) -> None:
        if votes < 1:
            raise ValueError(f"votes must be at least 1, got {votes}")
        self.dataset = dataset
        self.transform = transform
        self.votes = int(votes)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> list[Sample]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        where = self.dataset.describe_item(index)
        copies = []
        for vote in range(self.votes):
            rng = np.random.default_rng([self.dataset.seed, index, vote, _VOTE_STREAM])
            sample = self.transform(self.dataset.load(index, rng), rng)
            copies.append(assemble_features(sample, self.dataset.features, where))
        return copies


_TRAIN_STREAM = 0x74726E  # keeps training draws apart from evaluation draws
_VOTE_STREAM = 0x766F7465  # keeps vote draws apart from the single-pass evaluation draws


class PointTask(TaskData):
    """A point-cloud TaskData: lazily built split datasets and packed collation."""

    def __init__(
        self,
        info: DataInfo,
        factories: dict[str, Callable[[], Dataset]],
        *,
        protocol: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        late_state: dict[str, Callable[[], Any]] | None = None,
        vote_transform: Compose | None = None,
    ) -> None:
        """``late_state``: state records worth computing only when a checkpoint is written (e.g. a
        pass over the training files), each made once, on the first :meth:`state` call."""
        self.info = info
        self._vote_transform = vote_transform  # classification tasks only (one prediction per sample)
        self._factories = factories
        self._datasets: dict[str, Dataset] = {}
        self._protocol = dict(protocol or {})
        self._state = dict(state or {})
        self._late_state = dict(late_state or {})

    def dataset(self, split: str) -> Dataset:
        if split not in SPLITS:
            raise DataError(f"unknown split '{split}'; expected one of {', '.join(SPLITS)}")
        if split not in self._datasets:
            self._datasets[split] = self._factories[split]()
        return self._datasets[split]

    def voting_dataset(self, split: str, votes: int) -> Dataset:
        if self._vote_transform is None:
            return super().voting_dataset(split, votes)
        dataset = self.dataset(split)
        if not isinstance(dataset, PointDataset):  # pragma: no cover - factories build PointDatasets
            raise DataError(f"split '{split}' is not a point dataset; cannot vote")
        return VotingDataset(dataset, self._vote_transform, votes)

    def collate(self, items: list[Any]) -> Batch:
        if items and isinstance(items[0], list):  # voting: copies of each item stay adjacent
            votes = len(items[0])
            if any(len(copies) != votes for copies in items):
                raise DataError("collate: voting items hold different numbers of copies")
            batch = collate_points([copy for copies in items for copy in copies])
            batch["votes"] = votes
            return batch
        return collate_points(items)

    def describe(self) -> dict[str, Any]:
        facts = dict(self._protocol)
        facts["sizes"] = {split: len(self.dataset(split)) for split in SPLITS}  # type: ignore[arg-type]
        return facts

    def state(self) -> dict[str, Any]:
        for key, make in list(self._late_state.items()):
            self._state[key] = make()
            del self._late_state[key]
        return {"class_names": list(self.info.class_names), "in_channels": self.info.in_channels, **self._state}

