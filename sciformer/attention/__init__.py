"""The shared attention core, used by the spectral and the point-cloud models alike.

- ``dense``: one multi-head dot-product attention (Q/K/V, SDPA, key-padding masks, bias);
- ``serialized``: that attention over patches of a point cloud serialized along
  space-filling curves (Point Transformer V3);
- ``neighborhood`` / ``grouped``: vector attention over a neighbour index (PTv1 / PTv2),
  one neighbour-index contract (``neighbor_index``: -1 = padding, masked);
- ``positional``: positional encodings behind one interface (band index / wavelength,
  relative xyz, relative bias, conditional);
- ``transformer``: the pre-norm residual block generic over its token mixer, encoders;
  ``point_block``: the PTv1/PTv2 residual block; ``layers``: norm factory, MLPs, DropPath.
"""

from sciformer.attention.dense import (
    MultiHeadAttention,
    OutputProjection,
    QKVProjection,
    build_attention_bias,
    merge_heads,
    split_heads,
)
from sciformer.attention.grouped import GroupedVectorAttention
from sciformer.attention.layers import (
    BatchNormLastDim,
    DropPath,
    EdgeMLP,
    Mlp,
    drop_path,
    norm_layer,
)
from sciformer.attention.neighbor_index import check_neighbor_index
from sciformer.attention.neighborhood import PointTransformerLayer
from sciformer.attention.point_block import PointTransformerBlock
from sciformer.attention.positional import (
    ConditionalPositionalEncoding,
    NeighborBasis,
    PositionalEncoding,
    PositionMLP,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from sciformer.attention.serialized import (
    PatchLayout,
    SerializedAttention,
    SerializedContext,
)
from sciformer.attention.transformer import (
    CrossLayerFusion,
    PreNormBlock,
    TransformerBlock,
    TransformerEncoder,
)

__all__ = [
    # layers
    "BatchNormLastDim",
    "DropPath",
    "EdgeMLP",
    "Mlp",
    "drop_path",
    "norm_layer",
    # dense form
    "MultiHeadAttention",
    "OutputProjection",
    "QKVProjection",
    "build_attention_bias",
    "merge_heads",
    "split_heads",
    # serialized form
    "PatchLayout",
    "SerializedAttention",
    "SerializedContext",
    # positions
    "ConditionalPositionalEncoding",
    "NeighborBasis",
    "PositionMLP",
    "PositionalEncoding",
    "RelativePositionBias",
    "SinusoidalPositionalEncoding",
    "sinusoidal_encoding",
    # residual blocks and encoders
    "CrossLayerFusion",
    "PreNormBlock",
    "TransformerBlock",
    "TransformerEncoder",
    # neighbourhood form
    "GroupedVectorAttention",
    "PointTransformerBlock",
    "PointTransformerLayer",
    "check_neighbor_index",
]
