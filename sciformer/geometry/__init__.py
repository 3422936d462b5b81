"""Neighbourhoods for point clouds: packed batches, kNN, radius, FPS, grid pooling, interpolation.

Everything takes and returns torch tensors on the input's device, on packed batches
(clouds concatenated, described by ``offset``: cumulative cloud ends, int64 (B,)). Indices
carry no autograd; pooled and interpolated features are differentiable. Fast CPU backends
are used when present: the compiled grid kNN (built by ``pip install`` where a C++ compiler
is found), pykdtree and fpsample (``pip install 'sciformer[geometry]'``); scipy and
numpy/torch fallbacks are always there.

Point Transformer building blocks::

    idx, _ = knn(coord, None, 16, offset)                        # (N, 16), includes self
    down = fps(coord, offset, ratio=0.25)                        # transition down: sample ...
    idx, _ = knn(coord[down.index], coord, 16, down.offset, offset)  # ... and group
    up = interpolate(coarse, feat, fine, coarse_offset, fine_offset)  # transition up: 3-NN
"""

from sciformer.geometry.batch import (
    PackedPoints,
    batch_to_offset,
    from_pyg,
    offset_to_batch,
    offset_to_sizes,
    pack,
    sizes_to_offset,
    to_pyg,
    unpack,
)
from sciformer.geometry.fps import Sampled, fps
from sciformer.geometry.grid import GridPooled, grid_pool, grid_unpool, segment_mean
from sciformer.geometry.interpolate import interpolate, interpolation_weights
from sciformer.geometry.knn import Neighbours, available_backends, knn
from sciformer.geometry.radius import radius
from sciformer.geometry.serialization import (
    grid_coordinates,
    serialization_order,
    serialize,
)

__all__ = [
    "GridPooled",
    "Neighbours",
    "PackedPoints",
    "Sampled",
    "available_backends",
    "batch_to_offset",
    "fps",
    "from_pyg",
    "grid_coordinates",
    "grid_pool",
    "grid_unpool",
    "interpolate",
    "interpolation_weights",
    "knn",
    "offset_to_batch",
    "offset_to_sizes",
    "pack",
    "radius",
    "segment_mean",
    "serialization_order",
    "serialize",
    "sizes_to_offset",
    "to_pyg",
    "unpack",
]
