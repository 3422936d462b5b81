"""Train / validation / test splits of a labelled scene, with a leakage check.

A split is three label maps (H, W) of int64 with the scene's class ids (1..K, 0 = not in
the set); they never overlap. Three protocols:

``fixed_split``
    Given train and test label maps (e.g. the standard Indian Pines ``TR``/``TE`` maps);
    their labels are used as they are.
``stratified_split``
    Random pixels per class. ``train_per_class`` is an ``int`` count or a ``float``
    fraction in (0, 1). Small-class rule: a class never gives more than half of its
    pixels to a count request (``n = min(count, n_class // 2)``), a fraction takes
    ``round(f * n_class)`` clamped to ``[1, n_class - 1]``, and a class with a single
    pixel goes to test only. Classes whose request was cut are listed in the protocol.
``block_split``
    Spatially disjoint: the image is tiled into ``block_size`` squares and whole blocks go
    to train or test. Classes found in at least two blocks get at least one training and
    one test block where the blocks allow (rarest classes first); the remaining blocks are visited in a seeded
    random order and each goes to train while that brings every class's training share
    closer to ``train_fraction`` (default 0.5). A class found in one block only goes to
    train. Test pixels within ``margin`` pixels (Chebyshev distance) of a training or
    validation pixel are dropped, so with ``margin >= patch_size // 2`` no test pixel
    lies inside a training patch window and no training window contains a test pixel.

Validation is always carved from the training pixels. In fixed and stratified splits it
takes pixels per class (``val_fraction`` or ``val_per_class``), keeping at least one
training pixel per class. In a block split with ``val_fraction`` it takes whole training
blocks (chosen like the test blocks, about ``val_fraction`` of each class), and validation
pixels within ``margin`` of a training pixel are dropped: validation is then spatially
disjoint from training like the test set, so model selection follows the test protocol
instead of rewarding memorisation. ``val_per_class`` in a block split carves pixels.

Every split reports a leakage check: the number (and fraction) of test pixels whose
``patch_size x patch_size`` window contains a training pixel, and how many of those
contain a training pixel of their own class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import ndimage

from sciformer.contracts import check_patch_size
from sciformer.errors import DataError


@dataclass
class Split:
    """Three disjoint label maps (H, W) int64 (class ids 1..K, 0 = not in the set)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    protocol: dict[str, Any] = field(default_factory=dict)

    def maps(self) -> dict[str, np.ndarray]:
        return {"train": self.train, "val": self.val, "test": self.test}

    def counts(self) -> dict[str, int]:
        return {k: int(np.count_nonzero(v)) for k, v in self.maps().items()}

    def __repr__(self) -> str:
        c = self.counts()
        return f"Split(kind={self.protocol.get('kind')!r}, train={c['train']}, val={c['val']}, test={c['test']})"


# ----------------------------------------------------------------------------- helpers


def _check_gt(gt: np.ndarray, name: str = "gt") -> np.ndarray:
    gt = np.asarray(gt)
    if gt.ndim != 2:
        raise DataError(f"{name}: expected a 2-D (H, W) label map, got shape {gt.shape}")
    if gt.dtype.kind not in "uib":
        raise DataError(f"{name}: expected an integer label map, got dtype {gt.dtype}")
    gt = np.ascontiguousarray(gt, dtype=np.int64)  # (H, W), C order: ravel() below is a view
    if gt.size and gt.min() < 0:
        raise DataError(f"{name}: negative labels found; expected 0 = unlabelled, classes 1..K")
    if not np.any(gt):
        raise DataError(f"{name}: no labelled pixels (all zero)")
    return gt


def _per_class(label_map: np.ndarray, num_classes: int) -> list[int]:
    counts = np.bincount(label_map.ravel(), minlength=num_classes + 1)  # (K+1,)
    return [int(c) for c in counts[1 : num_classes + 1]]


def window_contains(mask: np.ndarray, patch_size: int) -> np.ndarray:
    """(H, W) bool: True where the ``patch_size`` window centred there contains a True of ``mask``."""
    p = check_patch_size(patch_size)
    if p == 1:
        return mask.astype(bool)
    return ndimage.maximum_filter(mask.astype(np.uint8), size=p, mode="constant", cval=0).astype(bool)


def leakage_report(train: np.ndarray, test: np.ndarray, patch_size: int) -> dict[str, Any]:
    """Test pixels whose ``patch_size`` window contains a training pixel (any class / same class)."""
    train = np.asarray(train)
    test = np.asarray(test)
    n_test = int(np.count_nonzero(test))
    near_any = window_contains(train > 0, patch_size) & (test > 0)  # (H, W)
    same = 0
    for k in np.unique(test[test > 0]):
        if np.any(train == k):
            same += int(np.count_nonzero(window_contains(train == k, patch_size) & (test == k)))
    n_any = int(np.count_nonzero(near_any))
    return {
        "patch_size": int(patch_size),
        "test_pixels": n_test,
        "test_with_train_in_window": n_any,
        "fraction": n_any / n_test if n_test else 0.0,
        "test_with_same_class_train_in_window": same,
        "same_class_fraction": same / n_test if n_test else 0.0,
    }


def carve_validation(
    train: np.ndarray,
    *,
    val_fraction: float | None = None,
    val_per_class: int | None = None,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Move some training pixels of every class into a validation map.

    Per class with ``n`` training pixels: ``val_per_class`` pixels or ``round(val_fraction * n)``,
    at most ``n - 1`` (a class keeps at least one training pixel).

    Returns:
        (train, val) label maps (H, W) int64, disjoint, union = the input ``train``.
    """
    if val_fraction is not None and val_per_class is not None:
        raise DataError("split: give val_fraction or val_per_class, not both")
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise DataError(f"split.val_fraction: expected a value in [0, 1), got {val_fraction}")
    if val_per_class is not None and val_per_class < 0:
        raise DataError(f"split.val_per_class: expected a count >= 0, got {val_per_class}")
    train = np.array(train, dtype=np.int64, order="C", copy=True)  # (H, W)
    val = np.zeros(train.shape, dtype=np.int64)  # (H, W)
    if not val_fraction and not val_per_class:
        return train, val
    flat_train = train.ravel()
    flat_val = val.ravel()
    for k in np.unique(flat_train[flat_train > 0]):
        idx = np.flatnonzero(flat_train == k)
        want = val_per_class if val_per_class is not None else int(round(float(val_fraction) * idx.size))
        n = min(int(want), idx.size - 1)
        if n <= 0:
            continue
        chosen = rng.choice(idx, size=n, replace=False)
        flat_val[chosen] = k
        flat_train[chosen] = 0
    return train, val


def _finish(
    kind: str,
    train: np.ndarray,
    val: np.ndarray,
    test: np.ndarray,
    num_classes: int,
    patch_size: int,
    extra: dict[str, Any],
) -> Split:
    assert not np.any((train > 0) & (test > 0)) and not np.any((val > 0) & (test > 0))
    assert not np.any((train > 0) & (val > 0))
    protocol: dict[str, Any] = {"kind": kind, **extra}
    protocol["counts"] = {
        "train": int(np.count_nonzero(train)),
        "val": int(np.count_nonzero(val)),
        "test": int(np.count_nonzero(test)),
    }
    protocol["per_class"] = {
        "train": _per_class(train, num_classes),
        "val": _per_class(val, num_classes),
        "test": _per_class(test, num_classes),
    }
    protocol["leakage"] = leakage_report(train, test, patch_size)
    return Split(train, val, test, protocol)


def _num_classes(*maps: np.ndarray) -> int:
    return int(max(int(m.max()) for m in maps))


# ----------------------------------------------------------------------------- protocols


def fixed_split(
    train_map: np.ndarray,
    test_map: np.ndarray,
    *,
    val_fraction: float | None = None,
    val_per_class: int | None = None,
    seed: int = 0,
    patch_size: int = 7,
    num_classes: int | None = None,
) -> Split:
    """Split from given train and test label maps (their labels are used, not a gt's)."""
    train = _check_gt(train_map, "split.train_path")
    test = _check_gt(test_map, "split.test_path")
    check_patch_size(patch_size)
    if train.shape != test.shape:
        raise DataError(f"split: train map is {train.shape} but test map is {test.shape}; expected the same size")
    overlap = int(np.count_nonzero((train > 0) & (test > 0)))
    if overlap:
        raise DataError(f"split: train and test maps overlap at {overlap} pixels; expected disjoint maps")
    rng = np.random.default_rng(seed)
    train, val = carve_validation(train, val_fraction=val_fraction, val_per_class=val_per_class, rng=rng)
    k = num_classes or _num_classes(train_map, test_map)
    extra = {"seed": int(seed), "val_fraction": val_fraction, "val_per_class": val_per_class}
    return _finish("fixed", train, val, test.copy(), k, patch_size, extra)


def _train_count(n: int, request: int | float) -> int:
    if n <= 1:
        return 0
    if isinstance(request, (int, np.integer)) and not isinstance(request, bool):
        return min(int(request), n // 2)
    return int(min(max(round(float(request) * n), 1), n - 1))


def stratified_split(
    gt: np.ndarray,
    train_per_class: int | float,
    *,
    val_fraction: float | None = None,
    val_per_class: int | None = None,
    seed: int = 0,
    patch_size: int = 7,
) -> Split:
    """Random pixels per class (see the module docstring for the small-class rule)."""
    gt = _check_gt(gt)
    check_patch_size(patch_size)
    if isinstance(train_per_class, bool):
        raise DataError("split.train_per_class: expected an int count or a float fraction in (0, 1), got a bool")
    if isinstance(train_per_class, (int, np.integer)):
        if train_per_class < 1:
            raise DataError(f"split.train_per_class: expected a count >= 1, got {train_per_class}")
    elif not 0.0 < float(train_per_class) < 1.0:
        raise DataError(
            f"split.train_per_class: a float is a fraction and must be in (0, 1), got {train_per_class}; "
            "use an int for a count"
        )
    rng = np.random.default_rng(seed)
    num_classes = _num_classes(gt)
    train = np.zeros(gt.shape, dtype=np.int64)  # (H, W), C order
    flat_gt = gt.ravel()
    flat_train = train.ravel()
    capped: list[int] = []
    for k in range(1, num_classes + 1):
        idx = np.flatnonzero(flat_gt == k)
        if idx.size == 0:
            continue
        n = _train_count(idx.size, train_per_class)
        requested = int(train_per_class) if isinstance(train_per_class, (int, np.integer)) else None
        if requested is not None and n < requested:
            capped.append(k)
        if n:
            flat_train[rng.choice(idx, size=n, replace=False)] = k
    test = np.where(train > 0, 0, gt)
    train, val = carve_validation(train, val_fraction=val_fraction, val_per_class=val_per_class, rng=rng)
    extra = {
        "seed": int(seed),
        "train_per_class": train_per_class,
        "capped_classes": capped,
        "val_fraction": val_fraction,
        "val_per_class": val_per_class,
    }
    return _finish("stratified", train, val, test, num_classes, patch_size, extra)


def block_ids(shape: tuple[int, int], block_size: int) -> tuple[np.ndarray, int]:
    """(H, W) map of block ids for square tiles of ``block_size`` (row-major) and the block count."""
    h, w = shape
    nbx = -(-w // block_size)
    nby = -(-h // block_size)
    rows = np.arange(h)[:, None] // block_size  # (H, 1)
    cols = np.arange(w)[None, :] // block_size  # (1, W)
    return (rows * nbx + cols).astype(np.int64), nby * nbx


def _assign_blocks(hist: np.ndarray, train_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Choose training blocks (1) and test blocks (0). hist: (n_blocks, K) labelled pixels."""
    n_blocks, k = hist.shape
    totals = hist.sum(axis=0).astype(np.float64)  # (K,)
    present = totals > 0
    side = np.full(n_blocks, -1, dtype=np.int64)  # -1 unassigned, 1 train, 0 test
    side[hist.sum(axis=1) == 0] = 0  # unlabelled blocks do not matter
    order = rng.permutation(n_blocks)
    rank = np.empty(n_blocks, dtype=np.int64)
    rank[order] = np.arange(n_blocks)

    # 1) coverage: rarest classes first, one training and one test block each
    n_blocks_with = (hist > 0).sum(axis=0)  # (K,)
    for c in sorted(np.flatnonzero(present), key=lambda c: (n_blocks_with[c], totals[c])):
        with_c = np.flatnonzero(hist[:, c] > 0)
        with_c = with_c[np.argsort(rank[with_c])]
        if not np.any(side[with_c] == 1):
            free = with_c[side[with_c] == -1]
            others_left = len(with_c) - 1
            if free.size and (others_left > 0 or not np.any(side[with_c] == 0)):
                side[free[0]] = 1
        if not np.any(side[with_c] == 0):
            free = with_c[side[with_c] == -1]
            if free.size:
                side[free[0]] = 0

    # 2) the rest, in random order: train while it brings class shares closer to the target
    target = train_fraction * totals  # (K,)
    weight = np.where(present, 1.0 / np.maximum(totals, 1.0), 0.0)  # (K,)
    train_counts = hist[side == 1].sum(axis=0).astype(np.float64)  # (K,)
    for b in order:
        if side[b] != -1:
            continue
        stay = np.sum((weight * (train_counts - target)) ** 2)
        move = np.sum((weight * (train_counts + hist[b] - target)) ** 2)
        if move < stay:
            side[b] = 1
            train_counts += hist[b]
        else:
            side[b] = 0
    return side


def block_split(
    gt: np.ndarray,
    block_size: int = 16,
    *,
    train_fraction: float = 0.5,
    margin: int = 0,
    val_fraction: float | None = None,
    val_per_class: int | None = None,
    seed: int = 0,
    patch_size: int = 7,
) -> Split:
    """Spatially disjoint split by square blocks (see the module docstring)."""
    gt = _check_gt(gt)
    check_patch_size(patch_size)
    if int(block_size) < 1:
        raise DataError(f"split.block_size: expected a positive integer, got {block_size}")
    if not 0.0 < train_fraction < 1.0:
        raise DataError(f"split.train_fraction: expected a value in (0, 1), got {train_fraction}")
    if int(margin) < 0:
        raise DataError(f"split.margin: expected an integer >= 0, got {margin}")
    rng = np.random.default_rng(seed)
    num_classes = _num_classes(gt)
    ids, n_blocks = block_ids(gt.shape, int(block_size))  # (H, W)
    flat = ids.ravel() * (num_classes + 1) + gt.ravel()
    hist = np.bincount(flat, minlength=n_blocks * (num_classes + 1)).reshape(n_blocks, num_classes + 1)
    hist = hist[:, 1:]  # (n_blocks, K) labelled pixels only
    side = _assign_blocks(hist, float(train_fraction), rng)
    in_train_block = side[ids] == 1  # (H, W)
    train = np.where(in_train_block, gt, 0)
    test = np.where(in_train_block, 0, gt)
    val_excluded = 0
    if val_fraction and val_per_class is None:
        # Validation takes whole training blocks, so it is as spatially disjoint from training
        # as the test set is: model selection then tracks the test protocol, not memorisation.
        train_blocks = np.flatnonzero(side == 1)
        keep = _assign_blocks(hist[train_blocks], 1.0 - float(val_fraction), rng)  # 1 train, 0 val
        in_val_block = np.isin(ids, train_blocks[keep == 0])  # (H, W)
        val = np.where(in_val_block, gt, 0)
        train = np.where(in_val_block, 0, train)
        if margin > 0:
            near_train = window_contains(train > 0, 2 * int(margin) + 1)  # (H, W)
            val_drop = near_train & (val > 0)
            val_excluded = int(np.count_nonzero(val_drop))
            val = np.where(val_drop, 0, val)
    else:
        train, val = carve_validation(train, val_fraction=val_fraction, val_per_class=val_per_class, rng=rng)
    labelled_blocks = hist.sum(axis=1) > 0  # (n_blocks,)
    excluded = 0
    if margin > 0:
        near = window_contains((train > 0) | (val > 0), 2 * int(margin) + 1)  # (H, W)
        drop = near & (test > 0)
        excluded = int(np.count_nonzero(drop))
        test = np.where(drop, 0, test)
    extra = {
        "seed": int(seed),
        "block_size": int(block_size),
        "train_fraction": float(train_fraction),
        "margin": int(margin),
        "blocks": {"labelled": int(np.sum(labelled_blocks)), "train": int(np.sum(side[labelled_blocks] == 1))},
        "excluded_by_margin": excluded,
        "val_excluded_by_margin": val_excluded,
        "val_mode": "blocks" if (val_fraction and val_per_class is None) else "pixels",
        "val_fraction": val_fraction,
        "val_per_class": val_per_class,
    }
    return _finish("blocks", train, val, test, num_classes, patch_size, extra)
