"""Hyperspectral patch models: group-wise spectral tokens and band-sequence Transformers."""

from sciformer.spectral.models import (
    BandPositions,
    SpectralFormer,
    SpectralFormerConfig,
    SpectralSpatialConfig,
    SpectralSpatialTransformer,
    build_spectral_spatial,
    build_spectralformer,
)
from sciformer.spectral.tokenizer import (
    SpectralPixelEmbedding,
    SpectralTokenizer,
    band_groups,
)

__all__ = [
    "BandPositions",
    "SpectralFormer",
    "SpectralFormerConfig",
    "SpectralPixelEmbedding",
    "SpectralSpatialConfig",
    "SpectralSpatialTransformer",
    "SpectralTokenizer",
    "band_groups",
    "build_spectral_spatial",
    "build_spectralformer",
]
