"""Small synthetic scenes and file writers for the hyperspectral data tests."""

from __future__ import annotations

import numpy as np
import pytest


def make_scene(h: int = 30, w: int = 26, bands: int = 8, classes: int = 4, seed: int = 0):
    """A blocky labelled scene: cube (H, W, B) float32, gt (H, W) int64, wavelengths (B,).

    Each class has its own mean spectrum plus noise; gt is a mosaic of rectangles with
    some unlabelled (0) pixels.
    """
    rng = np.random.default_rng(seed)
    gt = np.zeros((h, w), dtype=np.int64)
    step = 5
    for i in range(0, h, step):
        for j in range(0, w, step):
            gt[i : i + step, j : j + step] = rng.integers(0, classes + 1)
    for k in range(1, classes + 1):  # every class present
        if not np.any(gt == k):
            gt[(k * 3) % h, (k * 7) % w] = k
    means = rng.normal(100.0, 30.0, size=(classes + 1, bands))  # (K+1, B)
    cube = (means[gt] + rng.normal(0.0, 5.0, size=(h, w, bands))).astype(np.float32)  # (H, W, B)
    wavelengths = np.linspace(400.0, 1000.0, bands)
    return cube, gt, wavelengths


@pytest.fixture
def scene():
    return make_scene()


@pytest.fixture
def scene_factory():
    """The :func:`make_scene` generator, for tests that need other sizes."""
    return make_scene
