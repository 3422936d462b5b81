"""Synthetic data shared by the tests (importable as ``synthetic``: tests/ is on sys.path).

One builder per kind of input, so every test that needs "a small labelled scene" draws it
the same way and a change to the generator is made once.
"""

from __future__ import annotations

import numpy as np


def make_hsi_scene(h: int = 30, w: int = 26, bands: int = 8, classes: int = 4, seed: int = 0,
                   block: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A blocky labelled hyperspectral scene: cube (H, W, B) float32, gt (H, W) int64, wavelengths (B,).

    gt is a mosaic of ``block`` x ``block`` rectangles of random classes, 0 (unlabelled)
    included, with every class 1..classes present; each class has its own mean spectrum
    (N(100, 30) per band) plus N(0, 5) noise, so classes are separable.
    """
    rng = np.random.default_rng(seed)
    gt = np.zeros((h, w), dtype=np.int64)
    for i in range(0, h, block):
        for j in range(0, w, block):
            gt[i : i + block, j : j + block] = rng.integers(0, classes + 1)
    for k in range(1, classes + 1):  # every class present
        if not np.any(gt == k):
            gt[(k * 3) % h, (k * 7) % w] = k
    means = rng.normal(100.0, 30.0, size=(classes + 1, bands))  # (K+1, B)
    cube = (means[gt] + rng.normal(0.0, 5.0, size=(h, w, bands))).astype(np.float32)  # (H, W, B)
    wavelengths = np.linspace(400.0, 1000.0, bands)
    return cube, gt, wavelengths
