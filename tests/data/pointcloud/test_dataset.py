"""Point datasets: validation holdout and per-worker, per-epoch seeding."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from sciformer.data.pointcloud.dataset import PointDataset, stratified_holdout
from sciformer.data.pointcloud.sample import collate_points
from sciformer.data.transforms import Compose, RandomRotate


def test_stratified_holdout() -> None:
    labels = np.repeat([0, 1, 2], [10, 20, 1])
    keep, held = stratified_holdout(labels, 0.1, seed=0)
    assert np.bincount(labels[held], minlength=3).tolist() == [1, 2, 0]
    assert sorted(np.concatenate([keep, held]).tolist()) == list(range(31))
    np.testing.assert_array_equal(stratified_holdout(labels, 0.1, seed=0)[1], held)
    assert not np.array_equal(stratified_holdout(labels, 0.1, seed=1)[1], held)
    assert len(stratified_holdout(labels, 0.0, 0)[1]) == 0


class _RandomDataset(PointDataset):
    def __len__(self) -> int:
        return 6

    def load(self, index: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"coord": rng.normal(size=(4, 3)), "label": np.int64(index)}


def _draw(ds: PointDataset, workers: int) -> np.ndarray:
    loader = DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=collate_points)
    return torch.cat([b["coord"] for b in loader]).numpy()


def test_training_randomness_is_decided_by_seed_epoch_and_item() -> None:
    ds = _RandomDataset(Compose([]), [], train=True, seed=3)
    first = _draw(ds, 0)
    np.testing.assert_array_equal(_draw(ds, 2), first)  # workers draw what the main process draws
    items = [np.asarray(ds[i]["coord"]) for i in (4, 1, 3)]  # any order (another rank's share, a resumed epoch)
    for i, got in zip((4, 1, 3), items):
        np.testing.assert_array_equal(got, first[4 * i : 4 * i + 4])
    assert len(np.unique(first.round(6), axis=0)) == len(first)  # items do not repeat each other
    ds.set_epoch(1)
    second = _draw(ds, 0)
    assert not np.array_equal(first, second)  # new draws each epoch
    other = _RandomDataset(Compose([]), [], train=True, seed=4)
    assert not np.array_equal(_draw(other, 0), first)  # and each seed
    # evaluation datasets are deterministic per item whatever the workers
    ev = _RandomDataset(Compose([RandomRotate()]), [], train=False, seed=3)
    np.testing.assert_array_equal(_draw(ev, 0), _draw(ev, 2))
