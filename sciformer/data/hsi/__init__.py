"""Hyperspectral scenes: readers, built-in Indian Pines, splits, normalisation, lazy patches, maps.

Importing :mod:`sciformer.data.hsi.task` registers the ``hsi_scene`` dataset.
"""

from sciformer.data.hsi.builtin import (
    INDIAN_PINES_CLASSES,
    is_builtin,
    load_builtin,
    load_indian_pines,
)
from sciformer.data.hsi.export import (
    class_colors,
    save_map_envi,
    save_map_npy,
    save_map_png,
)
from sciformer.data.hsi.normalize import Normalizer
from sciformer.data.hsi.patches import (
    PatchDataset,
    iter_scene_batches,
    pad_cube,
    predict_scene,
)
from sciformer.data.hsi.readers import Scene, list_arrays, read_labels, read_scene
from sciformer.data.hsi.splits import (
    Split,
    block_split,
    carve_validation,
    fixed_split,
    leakage_report,
    stratified_split,
)

__all__ = [
    "INDIAN_PINES_CLASSES",
    "Normalizer",
    "PatchDataset",
    "Scene",
    "Split",
    "block_split",
    "carve_validation",
    "class_colors",
    "fixed_split",
    "is_builtin",
    "iter_scene_batches",
    "leakage_report",
    "list_arrays",
    "load_builtin",
    "load_indian_pines",
    "pad_cube",
    "predict_scene",
    "read_labels",
    "read_scene",
    "save_map_envi",
    "save_map_npy",
    "save_map_png",
    "stratified_split",
]
