"""The shared attention core: dense (token sequence) and neighbourhood (point) forms."""

from sciformer.attention.blocks import DropPath, Mlp, drop_path
from sciformer.attention.dense import (
    MultiHeadAttention,
    OutputProjection,
    QKVProjection,
    build_attention_bias,
    merge_heads,
    split_heads,
)
from sciformer.attention.grouped import GroupedVectorAttention

# --- neighbourhood (point) form ------------------------------------------------------
from sciformer.attention.neighborhood import (
    PointTransformerBlock,
    PointTransformerLayer,
    check_neighbor_index,
)
from sciformer.attention.positional import (
    PositionMLP,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from sciformer.attention.transformer import (
    CrossLayerFusion,
    TransformerBlock,
    TransformerEncoder,
)

__all__ = [
    # blocks
    "DropPath",
    "Mlp",
    "drop_path",
    # dense form
    "MultiHeadAttention",
    "OutputProjection",
    "QKVProjection",
    "build_attention_bias",
    "merge_heads",
    "split_heads",
    # positions
    "PositionMLP",
    "RelativePositionBias",
    "SinusoidalPositionalEncoding",
    "sinusoidal_encoding",
    # residual blocks and encoders
    "CrossLayerFusion",
    "TransformerBlock",
    "TransformerEncoder",
    # neighbourhood form
    "GroupedVectorAttention",
    "PointTransformerBlock",
    "PointTransformerLayer",
    "check_neighbor_index",
]
