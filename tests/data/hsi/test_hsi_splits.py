"""Splits: disjointness, per-class counts, validation from train, leakage, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io

from sciformer.contracts import default_data_root
from sciformer.data.hsi.splits import (
    block_ids,
    block_split,
    carve_validation,
    fixed_split,
    leakage_report,
    stratified_split,
)
from sciformer.errors import DataError


def brute_force_leaks(train: np.ndarray, test: np.ndarray, p: int, same_class: bool = False) -> int:
    """Oracle: count test pixels whose p x p window (clipped to the image) holds a training pixel."""
    r = p // 2
    h, w = train.shape
    n = 0
    for i, j in zip(*np.nonzero(test)):
        win = train[max(0, i - r) : min(h, i + r + 1), max(0, j - r) : min(w, j + r + 1)]
        n += bool(np.any(win == test[i, j])) if same_class else bool(np.any(win > 0))
    return n


def assert_valid_split(split, gt=None):
    tr, va, te = split.train > 0, split.val > 0, split.test > 0
    assert not np.any(tr & va) and not np.any(tr & te) and not np.any(va & te)
    if gt is not None:
        for m in split.maps().values():
            np.testing.assert_array_equal(m[m > 0], gt[m > 0])  # labels are the gt's
    c = split.protocol["counts"]
    assert c == split.counts()
    for part in ("train", "val", "test"):
        assert sum(split.protocol["per_class"][part]) == c[part]


@pytest.fixture
def big_gt(scene_factory):
    return scene_factory(h=80, w=70, bands=3, classes=5, seed=3)[1]


# ----------------------------------------------------------------------------- leakage


@pytest.mark.parametrize("p", [1, 3, 5, 7])
def test_leakage_report_matches_brute_force(p):
    rng = np.random.default_rng(p)
    train = rng.integers(0, 4, size=(23, 19)) * (rng.random((23, 19)) < 0.1)
    test = np.where(train > 0, 0, rng.integers(0, 4, size=(23, 19)))
    rep = leakage_report(train, test, p)
    assert rep["test_with_train_in_window"] == brute_force_leaks(train, test, p)
    assert rep["test_with_same_class_train_in_window"] == brute_force_leaks(train, test, p, same_class=True)
    assert rep["fraction"] == pytest.approx(rep["test_with_train_in_window"] / np.count_nonzero(test))


def test_leakage_rejects_even_patch():
    with pytest.raises(DataError, match="patch_size"):
        leakage_report(np.ones((3, 3), int), np.zeros((3, 3), int), 4)


# ----------------------------------------------------------------------------- stratified


def test_stratified_counts_and_small_class_rule():
    gt = np.zeros((20, 20), dtype=np.int64)
    gt[:10] = 1  # 200 pixels
    gt[10:12, :3] = 2  # 6 pixels: a count of 5 is cut to 6 // 2 = 3
    gt[15, 15] = 3  # single pixel: test only
    s = stratified_split(gt, 5, seed=0)
    assert_valid_split(s, gt)
    assert s.protocol["per_class"]["train"] == [5, 3, 0]
    assert s.protocol["per_class"]["test"] == [195, 3, 1]
    assert s.protocol["capped_classes"] == [2, 3]
    np.testing.assert_array_equal((s.train + s.val + s.test), gt)  # every labelled pixel used


@pytest.mark.parametrize("order", ["C", "F"])
def test_any_memory_order(big_gt, order):
    gt = np.asarray(big_gt, order=order)  # .mat files load in Fortran order
    splits = (
        stratified_split(gt, 10, val_fraction=0.2),
        block_split(gt, 8, val_fraction=0.2),
        fixed_split(gt * (big_gt % 2 == 0), gt * (big_gt % 2 == 1), val_fraction=0.5),
    )
    for s in splits:
        assert_valid_split(s, gt)
        assert s.counts()["train"] > 0 and s.counts()["val"] > 0 and s.counts()["test"] > 0


def test_stratified_fraction():
    gt = np.repeat(np.arange(1, 5), 50).reshape(20, 10)  # 4 classes x 50
    s = stratified_split(gt, 0.2, seed=1)
    assert s.protocol["per_class"]["train"] == [10, 10, 10, 10]


@pytest.mark.parametrize("bad", [0, -3, 1.0, 1.5, 0.0, True])
def test_stratified_rejects_bad_request(bad):
    gt = np.ones((5, 5), dtype=np.int64)
    with pytest.raises(DataError, match="train_per_class"):
        stratified_split(gt, bad)


def test_validation_comes_from_training_pixels(big_gt):
    plain = stratified_split(big_gt, 40, seed=7)
    with_val = stratified_split(big_gt, 40, seed=7, val_fraction=0.25)
    assert_valid_split(with_val, big_gt)
    np.testing.assert_array_equal(with_val.train + with_val.val, plain.train)  # val carved from train
    np.testing.assert_array_equal(with_val.test, plain.test)
    assert with_val.protocol["per_class"]["val"] == [10] * 5
    by_count = stratified_split(big_gt, 40, seed=7, val_per_class=4)
    assert by_count.protocol["per_class"]["val"] == [4] * 5


def test_carve_validation_keeps_one_training_pixel():
    train = np.array([[1, 0, 2, 2]])
    tr, va = carve_validation(train, val_per_class=5, rng=np.random.default_rng(0))
    assert np.count_nonzero(tr == 1) == 1 and np.count_nonzero(va == 1) == 0
    assert np.count_nonzero(tr == 2) == 1 and np.count_nonzero(va == 2) == 1
    with pytest.raises(DataError, match="not both"):
        carve_validation(train, val_fraction=0.1, val_per_class=1, rng=np.random.default_rng(0))


def test_stratified_is_deterministic(big_gt):
    a = stratified_split(big_gt, 0.1, seed=5, val_fraction=0.2)
    b = stratified_split(big_gt, 0.1, seed=5, val_fraction=0.2)
    c = stratified_split(big_gt, 0.1, seed=6, val_fraction=0.2)
    for m in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(a, m), getattr(b, m))
    assert not np.array_equal(a.train, c.train)


# ----------------------------------------------------------------------------- blocks


def test_block_ids():
    ids, n = block_ids((5, 7), 3)
    assert n == 2 * 3
    assert ids[0, 0] == 0 and ids[0, 6] == 2 and ids[4, 0] == 3 and ids[4, 6] == 5


@pytest.mark.parametrize("block_size", [6, 10, 16])
def test_blocks_are_whole_and_cover_classes(big_gt, block_size):
    s = block_split(big_gt, block_size, seed=0, val_fraction=0.1)
    assert_valid_split(s, big_gt)
    ids, _ = block_ids(big_gt.shape, block_size)
    train_blocks = set(ids[(s.train > 0) | (s.val > 0)].tolist())
    test_blocks = set(ids[s.test > 0].tolist())
    assert not train_blocks & test_blocks  # no block is shared
    np.testing.assert_array_equal(s.train + s.val + s.test, big_gt)  # margin 0: nothing dropped
    for k in range(1, 6):  # every class found in >= 2 blocks is in train and in test
        if len(set(ids[big_gt == k].tolist())) >= 2:
            assert np.any(s.train == k) and np.any(s.test == k)


def test_blocks_train_share_near_target(big_gt):
    s = block_split(big_gt, 8, seed=2, train_fraction=0.5)
    share = np.array(s.protocol["per_class"]["train"]) / np.bincount(big_gt.ravel())[1:]
    assert np.all(np.abs(share - 0.5) < 0.2), share


@pytest.mark.parametrize("p", [3, 5, 7])
def test_blocks_with_margin_have_no_leakage(big_gt, p):
    r = p // 2
    s = block_split(big_gt, 10, seed=1, margin=r, patch_size=p, val_fraction=0.1)
    assert_valid_split(s, big_gt)
    assert s.protocol["leakage"]["test_with_train_in_window"] == 0
    assert brute_force_leaks(s.train + s.val, s.test, p) == 0  # val pixels are kept clear too
    no_margin = block_split(big_gt, 10, seed=1, margin=0, patch_size=p, val_fraction=0.1)
    assert no_margin.protocol["leakage"]["test_with_train_in_window"] > 0
    dropped = no_margin.counts()["test"] - s.counts()["test"]
    assert dropped == s.protocol["excluded_by_margin"] > 0


@pytest.mark.parametrize("p", [3, 5])
def test_block_validation_is_whole_blocks_clear_of_training(big_gt, p):
    r = p // 2
    s = block_split(big_gt, 8, seed=3, margin=r, patch_size=p, val_fraction=0.2)
    assert s.protocol["val_mode"] == "blocks" and s.counts()["val"] > 0
    ids, _ = block_ids(big_gt.shape, 8)
    assert not set(ids[s.val > 0].tolist()) & set(ids[s.train > 0].tolist())  # no shared block
    assert brute_force_leaks(s.train, s.val, p) == 0  # no validation window holds a training pixel
    pixels = block_split(big_gt, 8, seed=3, margin=r, patch_size=p, val_per_class=5)
    assert pixels.protocol["val_mode"] == "pixels"
    assert np.all(np.array(pixels.protocol["per_class"]["val"]) == 5)


def test_blocks_deterministic_by_seed(big_gt):
    a = block_split(big_gt, 8, seed=11, margin=2)
    b = block_split(big_gt, 8, seed=11, margin=2)
    c = block_split(big_gt, 8, seed=12, margin=2)
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.test, b.test)
    assert not np.array_equal(a.train, c.train)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"block_size": 0}, "block_size"), ({"train_fraction": 1.0}, "train_fraction"), ({"margin": -1}, "margin")],
)
def test_blocks_bad_arguments(big_gt, kwargs, key):
    with pytest.raises(DataError, match=key):
        block_split(big_gt, **kwargs)


def test_unlabelled_gt_rejected():
    with pytest.raises(DataError, match="no labelled pixels"):
        block_split(np.zeros((8, 8), dtype=np.int64))
    with pytest.raises(DataError, match="integer"):
        stratified_split(np.ones((8, 8)) * 0.5, 2)


# ----------------------------------------------------------------------------- fixed


def test_fixed_split_uses_given_labels_and_checks_overlap():
    tr = np.zeros((6, 6), dtype=np.uint8)
    te = np.zeros((6, 6), dtype=np.uint8)
    tr[0, :3] = [1, 2, 2]
    te[3:, :] = 2
    te[5, 5] = 1
    s = fixed_split(tr, te, seed=0)
    assert_valid_split(s)
    np.testing.assert_array_equal(s.train, tr)
    np.testing.assert_array_equal(s.test, te)
    te[0, 0] = 1
    with pytest.raises(DataError, match="overlap at 1 pixels"):
        fixed_split(tr, te)
    with pytest.raises(DataError, match="same size"):
        fixed_split(tr, te[:5])


SPLIT_FILE = default_data_root() / "indian_pines_splits" / "spectralformer_TR_TE.mat"


@pytest.mark.skipif(not SPLIT_FILE.is_file(), reason=f"real data not found: {SPLIT_FILE} (set SCIFORMER_DATA)")
def test_indian_pines_fixed_split_from_shared_data():
    m = scipy.io.loadmat(SPLIT_FILE)
    s = fixed_split(m["TR"], m["TE"], patch_size=7)
    assert s.counts() == {"train": 695, "val": 0, "test": 9671}
    assert s.protocol["per_class"]["train"] == [15, 50, 50, 50, 50, 50, 15, 50, 15, 50, 50, 50, 50, 50, 50, 50]
    test_counts = [39, 1384, 784, 184, 447, 697, 11, 439, 5, 918, 2418, 564, 162, 1244, 330, 45]
    assert s.protocol["per_class"]["test"] == test_counts
    leak = s.protocol["leakage"]
    assert leak["same_class_fraction"] == pytest.approx(0.76, abs=0.01)  # "about 76%" (data README)
    assert leak["fraction"] >= leak["same_class_fraction"]
    with_val = fixed_split(m["TR"], m["TE"], val_fraction=0.1, seed=0)
    assert with_val.counts()["train"] + with_val.counts()["val"] == 695
    np.testing.assert_array_equal(with_val.train + with_val.val, m["TR"])
