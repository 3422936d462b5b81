"""sciformer: Transformers for 3D point clouds and hyperspectral image cubes.

``import sciformer`` stays cheap (no torch); the Python API loads on first use:
:func:`load` (a trained run -> a predictor of arrays and files), :func:`train` (an
experiment -> a run folder and its metrics), :func:`pretrain` (masked-band pre-training
of a hyperspectral model -> a run folder to ``train(..., init_from=...)`` from), and the dataset classes ``ModelNet``,
``S3DIS``, ``ShapeNetPart``, ``LasTiles`` and ``HyperspectralScene``. Every bad input (a
config key, a file, an argument) raises a :class:`SciformerError`: a :class:`ConfigError`,
:class:`DataError` or :class:`CheckpointError`, or :class:`TrainingDiverged` when the loss
becomes NaN or infinite.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names -> the module that defines them, imported on first access (PEP 562).
_LAZY = {
    "load": "sciformer.api", "train": "sciformer.api", "Predictor": "sciformer.api", "Prediction": "sciformer.api",
    "TrainResult": "sciformer.api", "pretrain": "sciformer.api",
    "ModelNet": "sciformer.data.classes", "S3DIS": "sciformer.data.classes", "ShapeNetPart": "sciformer.data.classes",
    "LasTiles": "sciformer.data.classes", "HyperspectralScene": "sciformer.data.classes",
    # the errors a caller catches: every bad input is a SciformerError
    "SciformerError": "sciformer.errors", "ConfigError": "sciformer.errors", "DataError": "sciformer.errors",
    "CheckpointError": "sciformer.errors", "TrainingDiverged": "sciformer.engine.loops",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sciformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
