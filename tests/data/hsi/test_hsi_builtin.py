"""Built-in Indian Pines from the tensorly wheel."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from sciformer.data.hsi import builtin
from sciformer.errors import DataError

pytest.importorskip("tensorly", reason="Indian Pines ships in tensorly==0.10.0: pip install 'sciformer[hsi-data]'")

# Published pixel counts per class of Indian Pines (classes 1..16).
IP_COUNTS = [46, 1428, 830, 237, 483, 730, 28, 478, 20, 972, 2455, 593, 205, 1265, 386, 93]


def test_indian_pines_loads():
    s = builtin.load_builtin("indian_pines")
    assert s.cube.shape == (145, 145, 200)
    assert s.cube.dtype == np.uint16
    assert s.gt.shape == (145, 145) and s.gt.dtype == np.int64
    assert s.num_labelled == 10249
    assert np.bincount(s.gt.ravel(), minlength=17)[1:].tolist() == IP_COUNTS
    assert s.class_names == list(builtin.INDIAN_PINES_CLASSES) and len(s.class_names) == 16
    assert s.class_names[0] == "Alfalfa" and s.class_names[-1] == "Stone-Steel-Towers"
    assert s.wavelengths is not None and s.wavelengths.shape == (200,)
    assert 395 < s.wavelengths.min() < 410 and 2480 < s.wavelengths.max() < 2510  # AVIRIS, nm
    assert s.source == "indian_pines"


def test_wavelengths_match_tensorly():
    from tensorly.datasets import load_indian_pines

    ref = np.asarray(load_indian_pines()["ticks"][1], dtype=np.float64)
    np.testing.assert_allclose(builtin.load_indian_pines().wavelengths, ref)


def test_is_builtin_and_unknown_name():
    assert builtin.is_builtin("indian_pines")
    assert not builtin.is_builtin("scene.mat")
    with pytest.raises(DataError, match="built-in scenes: indian_pines"):
        builtin.load_builtin("pavia")


def test_missing_tensorly_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorly" else real(name, *a))
    with pytest.raises(DataError, match=r"sciformer\[hsi-data\]"):
        builtin.load_indian_pines()


def test_block_split_counts_quoted_in_the_data_readme():
    import re
    from pathlib import Path

    from sciformer.data.classes import HyperspectralScene

    text = (Path(__file__).resolve().parents[3] / "datasets" / "hyperspectral" / "README.md").read_text(encoding="utf-8")
    text = " ".join(text.split())
    quoted = re.search(r"\(block 12, margin 3, seed 0\): ([\d,]+) train / ([\d,]+) val / ([\d,]+) test pixels", text)
    assert quoted, "the data README lost its block-split counts"
    empty = re.search(r"in train; (.+?) — each one small field", text)
    assert empty
    counts = {}
    for split in ("train", "val", "test"):
        scene = HyperspectralScene("indian_pines", protocol={"kind": "blocks"}, split=split)  # block 12, margin 3, seed 0
        counts[split] = np.bincount(np.asarray(scene._data.targets), minlength=16)
    assert [int(q.replace(",", "")) for q in quoted.groups()] == [int(c.sum()) for c in counts.values()]
    assert (counts["train"] > 0).all()  # "every class in train"
    no_test = [builtin.INDIAN_PINES_CLASSES[i] for i in np.flatnonzero(counts["test"] == 0)]
    assert re.split(r", | and ", empty.group(1)) == no_test
