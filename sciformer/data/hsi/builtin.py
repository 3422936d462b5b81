"""Built-in scenes: Indian Pines from the ``tensorly==0.10.0`` wheel.

Indian Pines (AVIRIS, 145 x 145 pixels, 200 bands after removing the water-absorption
bands, 16 classes, 10,249 labelled pixels; CC BY 3.0, Purdue University) ships inside
the tensorly wheel as ``tensorly/datasets/data/Indian_pines_corrected.npy`` (uint16) and
``Indian_pines_gt.npy``; its band centres come from ``tensorly.datasets.load_indian_pines()``.
Nothing is downloaded. ``source: indian_pines`` in an experiment means this scene.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from sciformer.data.hsi.readers import Scene, validate_cube, validate_labels
from sciformer.errors import DataError

INDIAN_PINES_CLASSES: tuple[str, ...] = (
    "Alfalfa",
    "Corn-notill",
    "Corn-mintill",
    "Corn",
    "Grass-pasture",
    "Grass-trees",
    "Grass-pasture-mowed",
    "Hay-windrowed",
    "Oats",
    "Soybean-notill",
    "Soybean-mintill",
    "Soybean-clean",
    "Wheat",
    "Woods",
    "Buildings-Grass-Trees-Drives",
    "Stone-Steel-Towers",
)

_INSTALL_HINT = "pip install 'sciformer[hsi-data]' (brings tensorly==0.10.0, which ships the scene)"


def _tensorly_data_dir() -> Path:
    spec = importlib.util.find_spec("tensorly")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"source 'indian_pines' needs the tensorly package, which is not installed: {_INSTALL_HINT}")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "datasets" / "data"


@lru_cache(maxsize=1)
def _indian_pines_wavelengths() -> tuple[float, ...] | None:
    try:
        from tensorly.datasets import load_indian_pines as _load

        ticks = _load()["ticks"]  # [labels (H, W), wavelengths (B,)]
        return tuple(float(w) for w in ticks[1])
    except Exception:  # noqa: BLE001 - wavelengths are optional metadata
        return None


def load_indian_pines() -> Scene:
    """Indian Pines: cube (145, 145, 200) uint16, gt (145, 145) int64 with classes 1..16."""
    data = _tensorly_data_dir()
    cube_path = data / "Indian_pines_corrected.npy"
    gt_path = data / "Indian_pines_gt.npy"
    for p in (cube_path, gt_path):
        if not p.is_file():
            raise DataError(
                f"source 'indian_pines': {p} is missing from the installed tensorly; "
                f"install the exact version that ships it: {_INSTALL_HINT}"
            )
    cube = validate_cube(np.load(cube_path, allow_pickle=False), str(cube_path))  # (145, 145, 200) uint16
    gt = validate_labels(np.load(gt_path, allow_pickle=False), str(gt_path))  # (145, 145)
    wl = _indian_pines_wavelengths()
    wavelengths = np.asarray(wl, dtype=np.float64) if wl is not None and len(wl) == cube.shape[2] else None
    return Scene(
        cube=cube,
        gt=gt,
        wavelengths=wavelengths,
        class_names=list(INDIAN_PINES_CLASSES),
        source="indian_pines",
    )


BUILTIN_SCENES: dict[str, Callable[[], Scene]] = {"indian_pines": load_indian_pines}


def is_builtin(source: str) -> bool:
    """True when ``source`` names a built-in scene rather than a file."""
    return str(source) in BUILTIN_SCENES


def load_builtin(name: str) -> Scene:
    """Load a built-in scene by name."""
    if name not in BUILTIN_SCENES:
        raise DataError(f"unknown built-in scene '{name}'; built-in scenes: {', '.join(sorted(BUILTIN_SCENES))}")
    return BUILTIN_SCENES[name]()
