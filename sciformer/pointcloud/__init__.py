"""Point Transformer models: ``layers`` (transition down/up, grid pooling, heads),
``models`` (v1/v2: ``point_transformer_cls`` / ``point_transformer_seg``) and ``ptv3``
with ``serialized_layers`` (v3: ``point_transformer_v3_cls`` / ``_seg``), registered in
:data:`sciformer.registry.MODELS`.

Data transforms, whole-scene chunking and rendering live in :mod:`sciformer.data`.
"""

from sciformer.pointcloud.layers import GridPoolDown, TransitionDown, TransitionUp
from sciformer.pointcloud.models import (
    PointTransformerClassifier,
    PointTransformerEncoder,
    PointTransformerSegmenter,
)
from sciformer.pointcloud.ptv3 import (
    PointTransformerV3Classifier,
    PointTransformerV3Segmenter,
)

__all__ = [
    "GridPoolDown",
    "PointTransformerClassifier",
    "PointTransformerEncoder",
    "PointTransformerSegmenter",
    "PointTransformerV3Classifier",
    "PointTransformerV3Segmenter",
    "TransitionDown",
    "TransitionUp",
]
