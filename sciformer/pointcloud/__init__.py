"""Point-cloud models, layers and transforms.

Modules: ``transforms`` (sample transforms), ``layers`` (transition down/up, pooling,
heads), ``models`` (``point_transformer_cls`` / ``point_transformer_seg``, registered in
:data:`sciformer.registry.MODELS`), ``predict`` (whole clouds in overlapping chunks with
test-time views), ``render`` (PNG pictures of labelled clouds).

The names below are imported on first access: the data layer imports
``sciformer.pointcloud.transforms`` and ``predict`` imports the data layer, so importing
everything here eagerly would be circular.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "PointTransformerClassifier": "models",
    "PointTransformerSegmenter": "models",
    "PointTransformerEncoder": "models",
    "TransitionDown": "layers",
    "TransitionUp": "layers",
    "GridPoolDown": "layers",
    "plan_chunks": "predict",
    "predict_chunked": "predict",
    "tta_views": "predict",
    "render_labels": "render",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"sciformer.pointcloud.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'sciformer.pointcloud' has no attribute '{name}'")
