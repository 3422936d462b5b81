"""Point Transformer models: ``layers`` (transition down/up, grid pooling, heads) and
``models`` (``point_transformer_cls`` / ``point_transformer_seg``, registered in
:data:`sciformer.registry.MODELS`).

Data transforms, whole-scene chunking and rendering live in :mod:`sciformer.data`.
"""

from sciformer.pointcloud.layers import GridPoolDown, TransitionDown, TransitionUp
from sciformer.pointcloud.models import (
    PointTransformerClassifier,
    PointTransformerEncoder,
    PointTransformerSegmenter,
)

__all__ = [
    "GridPoolDown",
    "PointTransformerClassifier",
    "PointTransformerEncoder",
    "PointTransformerSegmenter",
    "TransitionDown",
    "TransitionUp",
]
