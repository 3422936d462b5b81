"""Class colours shared by hyperspectral maps and rendered point clouds."""

from __future__ import annotations

import numpy as np


def class_colors(num_classes: int) -> np.ndarray:
    """(K + 1, 3) uint8 colours; row 0 (unclassified) is black."""
    import matplotlib

    if num_classes <= 20:
        cmap = matplotlib.colormaps["tab20"]
        rgb = [cmap(i)[:3] for i in range(num_classes)]
    else:
        cmap = matplotlib.colormaps["hsv"]
        rgb = [cmap(i / num_classes)[:3] for i in range(num_classes)]
    colors = np.zeros((num_classes + 1, 3), dtype=np.uint8)
    if num_classes:
        colors[1:] = np.round(np.asarray(rgb) * 255).astype(np.uint8)
    return colors
