"""Hyperspectral patch classifiers, registered in :data:`sciformer.registry.MODELS`.

Both models take the collated batch dict (``batch["patch"]`` (n, B, p, p) float32,
optionally ``batch["wavelength"]`` (B,) in nm) and return logits (n, num_classes). No
parameter depends on the band count B: one model runs on 200 raw bands, 103 bands or
30 PCA components.

- ``spectralformer``: band-sequence Transformer (SpectralFormer-style group-wise
  embedding, cls token, sinusoidal band positions, optional relative bias, cross-layer
  fusion without band-sized parameters).
- ``spectral_spatial``: spatial-token Transformer over the p x p pixels of the patch
  (band-agnostic per-pixel spectral embedding, light conv stem) plus a few band tokens
  of the centre window.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from sciformer.attention.positional import (
    RelativePositionBias,
    SinusoidalPositionalEncoding,
)
from sciformer.attention.transformer import TransformerEncoder
from sciformer.contracts import DataInfo
from sciformer.errors import ConfigError, DataError
from sciformer.registry import MODELS
from sciformer.spectral.tokenizer import SpectralPixelEmbedding, SpectralTokenizer

PositionSource = Literal["auto", "index", "wavelength"]


# --------------------------------------------------------------------------- helpers
class BandPositions(nn.Module):
    """Chooses the position of each band: its index or its wavelength.

    ``source="auto"`` uses wavelengths when the batch carries them (or when they were
    given at build time and the band count matches), else band indices (0, 1, ...).
    PCA components have no wavelength: their index is used.

    Shapes:
        batch["patch"]: (n, B, p, p), batch["wavelength"]: (B,) or (n, B) -> (B,)
    """

    def __init__(self, source: PositionSource = "auto", wavelengths: Any = None) -> None:
        super().__init__()
        self.source = source
        default = None if wavelengths is None else torch.as_tensor(wavelengths, dtype=torch.float32).flatten()
        self.register_buffer("default_wavelengths", default, persistent=False)

    def forward(self, batch: dict[str, Any], num_bands: int, device: torch.device) -> torch.Tensor:
        wl = batch.get("wavelength") if self.source != "index" else None
        if wl is not None:
            wl = torch.as_tensor(wl, dtype=torch.float32, device=device)
            wl = wl[0] if wl.ndim == 2 else wl  # (B,)  one sensor per batch
            if tuple(wl.shape) != (num_bands,):
                raise DataError(f"batch['wavelength']: expected shape ({num_bands},), got {tuple(wl.shape)}")
            return wl
        default = self.default_wavelengths
        if self.source != "index" and default is not None and default.numel() == num_bands:
            return default.to(device)  # (B,)
        if self.source == "wavelength":
            raise DataError("batch['wavelength']: position_source='wavelength' needs band wavelengths, none were given")
        return torch.arange(num_bands, dtype=torch.float32, device=device)  # (B,)


def _patch(batch: dict[str, Any], patch_size: int) -> torch.Tensor:
    x = batch.get("patch") if isinstance(batch, dict) else None
    if x is None:
        raise DataError("batch: expected a dict with key 'patch' (n, B, p, p)")
    if x.ndim != 4 or tuple(x.shape[-2:]) != (patch_size, patch_size):
        raise DataError(f"batch['patch']: expected shape (n, B, {patch_size}, {patch_size}), got {tuple(x.shape)}")
    return x


def _check_positions(cfg: SpectralFormerConfig | SpectralSpatialConfig, info: DataInfo) -> None:
    """``position_source=wavelength`` needs the data's band centres: refused when the model is
    built (before a run folder is written), not at the first batch."""
    if cfg.position_source == "wavelength" and info.wavelengths is None:
        raise ConfigError("model.position_source=wavelength: the data gives no band centres: the scene has none "
                          "(give data.wavelengths or data.wavelength_key) or data.pca_components is set (PCA "
                          "components are placed by index); use model.position_source=auto or index")


def _patch_size(info: DataInfo) -> int:
    if info.patch_size is None:  # DataInfo checks that a given patch size is odd and positive
        raise ConfigError("data: the model needs pixel patches, but the data gives no DataInfo.patch_size")
    return info.patch_size


def _cls_bias(bias: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Pad a (H, L, L) bias with zeros for ``num_prefix`` leading tokens (cls)."""
    return F.pad(bias, (num_prefix, 0, num_prefix, 0))  # (H, P + L, P + L)


class _EncoderConfig(BaseModel):
    """Parameters shared by the spectral models (Transformer encoder and band positions)."""

    model_config = ConfigDict(extra="forbid")

    dim: int = Field(64, gt=0, description="token width")
    depth: int = Field(3, gt=0, description="number of Transformer blocks")
    num_heads: int = Field(4, gt=0, description="attention heads (divide dim)")
    mlp_ratio: float = Field(2.0, gt=0, description="MLP hidden width / dim")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout after attention, MLP and embeddings")
    attn_drop: float = Field(0.0, ge=0, lt=1, description="dropout on attention weights")
    drop_path: float = Field(0.1, ge=0, lt=1, description="stochastic depth rate of the last block")
    relative_bias: bool = Field(False, description="add a relative position bias (MLP on position offsets)")
    position_source: PositionSource = Field(
        "auto", description="band positions: wavelength if known ('auto'), index, wavelength"
    )

    @model_validator(mode="after")
    def _check_heads(self) -> _EncoderConfig:  # checked when the config loads, before any data is read
        if self.dim % self.num_heads:
            raise ValueError(f"model.num_heads: expected a divisor of dim={self.dim}, got {self.num_heads}")
        return self


# ------------------------------------------------------------------ spectralformer
class SpectralFormerConfig(_EncoderConfig):
    """Parameters of ``spectralformer``."""

    group_size: int = Field(3, gt=0, description="neighbouring bands per token")
    stride: int = Field(1, gt=0, description="band step between tokens (<= group_size)")
    pad_mode: Literal["replicate", "zeros"] = Field("replicate", description="padding of the spectral ends")
    fusion: Literal["none", "linear", "gate"] = Field("linear", description="cross-layer fusion (skip over two blocks)")
    pool: Literal["cls", "mean"] = Field("cls", description="classify from the cls token or the token mean")

    @model_validator(mode="after")
    def _check_spectralformer(self) -> SpectralFormerConfig:
        if self.stride > self.group_size:
            raise ValueError(f"model.stride: expected at most group_size={self.group_size}, got {self.stride}")
        if self.dim % 2:
            raise ValueError(f"model.dim: expected an even width, got {self.dim}")
        return self


class SpectralFormer(nn.Module):
    """Band-sequence Transformer classifier (SpectralFormer-style, any band count).

    ::

        t_1..t_L, pos = SpectralTokenizer(x)               # group-wise spectral embedding
        z = [cls ; t + PE(pos)]                            # sinusoidal band positions
        z = Encoder(z, bias = [0 ; RPB(pos)])              # cross-layer fusion optional
        logits = Linear(z_cls)   (or mean of the band tokens)

    Shapes:
        batch["patch"]: (n, B, p, p), batch["wavelength"]: (B,) optional
        output: (n, num_classes)
    """

    def __init__(self, cfg: SpectralFormerConfig, num_classes: int, patch_size: int, wavelengths: Any = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_size = patch_size
        self.positions = BandPositions(cfg.position_source, wavelengths)
        self.tokenizer = SpectralTokenizer(cfg.group_size, cfg.stride, patch_size, cfg.dim, cfg.pad_mode)
        self.pos_encoding = SinusoidalPositionalEncoding(cfg.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.embed_drop = nn.Dropout(cfg.dropout)
        self.rel_bias = RelativePositionBias(cfg.num_heads) if cfg.relative_bias else None
        self.encoder = TransformerEncoder(
            cfg.dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio, cfg.dropout, cfg.attn_drop, cfg.drop_path,
            fusion=cfg.fusion,
        )
        self.head = nn.Linear(cfg.dim, num_classes)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        x = _patch(batch, self.patch_size)  # (n, B, p, p)
        band_pos = self.positions(batch, x.shape[1], x.device)  # (B,)
        tokens, pos = self.tokenizer(x, band_pos)  # (n, L, D), (L,)
        tokens = tokens + self.pos_encoding(pos).to(tokens.dtype)  # (n, L, D)
        z = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), tokens), dim=1)  # (n, 1 + L, D)
        z = self.embed_drop(z)
        bias = None if self.rel_bias is None else _cls_bias(self.rel_bias(pos), 1)  # (H, 1 + L, 1 + L)
        z = self.encoder(z, attn_bias=bias)  # (n, 1 + L, D)
        feat = z[:, 0] if self.cfg.pool == "cls" else z[:, 1:].mean(dim=1)  # (n, D)
        return self.head(feat)  # (n, C)


@MODELS.register("spectralformer", config=SpectralFormerConfig)
def build_spectralformer(cfg: SpectralFormerConfig, info: DataInfo) -> nn.Module:
    """Band-sequence Transformer (SpectralFormer-style group-wise embedding, any band count)."""
    _check_positions(cfg, info)
    return SpectralFormer(cfg, info.num_classes, _patch_size(info), info.wavelengths)


# ---------------------------------------------------------------- spectral_spatial
class SpectralSpatialConfig(_EncoderConfig):
    """Parameters of ``spectral_spatial``."""

    depth: int = Field(2, gt=0, description="number of Transformer blocks")
    spectral_hidden: int = Field(128, gt=0, description="hidden width of the band-weight generator")
    conv_stem: bool = Field(True, description="3x3 convolution over the pixel embeddings before attention")
    band_tokens: bool = Field(True, description="add band tokens of the centre window to the sequence")
    band_group_size: int = Field(10, gt=0, description="bands per band token (non-overlapping groups)")
    band_window: int = Field(3, gt=0, description="odd centre window (pixels) seen by the band tokens")
    pool: Literal["cls", "centre", "cls_centre"] = Field(
        "cls_centre", description="classify from the cls token, the centre pixel token, or both"
    )

    @model_validator(mode="after")
    def _check_spectral_spatial(self) -> SpectralSpatialConfig:
        if self.dim % 4:
            raise ValueError(f"model.dim: expected a multiple of 4 (2D sinusoidal positions), got {self.dim}")
        if self.band_window % 2 == 0:
            raise ValueError(f"model.band_window: expected an odd window, got {self.band_window}")
        return self


class SpectralSpatialTransformer(nn.Module):
    """Spectral-spatial Transformer over the pixels of a patch (any band count).

    ::

        e = LN(SpectralPixelEmbedding(x, pos))               # (p, p, D) band-agnostic
        e = e + GELU(Conv3x3(e))                              # light spatial stem
        s = e + PE2d(offset to the centre pixel)              # p*p spatial tokens
        b = SpectralTokenizer(centre window) + PE(band pos)   # band tokens (optional)
        z = Encoder([cls ; s + type_s ; b + type_b])
        logits = Linear([z_cls ; z_centre])                   # or cls / centre alone

    Shapes:
        batch["patch"]: (n, B, p, p), batch["wavelength"]: (B,) optional
        output: (n, num_classes)
    """

    def __init__(self, cfg: SpectralSpatialConfig, num_classes: int, patch_size: int, wavelengths: Any = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_size = patch_size
        dim = cfg.dim
        self.positions = BandPositions(cfg.position_source, wavelengths)
        self.pixel_embed = SpectralPixelEmbedding(dim, hidden_dim=cfg.spectral_hidden)
        self.embed_norm = nn.LayerNorm(dim)
        self.conv = nn.Conv2d(dim, dim, 3, padding=1) if cfg.conv_stem else None
        self.spatial_pe = SinusoidalPositionalEncoding(dim, pos_dim=2, base=100.0)
        centre = (patch_size - 1) / 2
        grid = torch.stack(torch.meshgrid(torch.arange(patch_size), torch.arange(patch_size), indexing="ij"), -1)
        self.register_buffer("pixel_offsets", (grid.reshape(-1, 2).float() - centre), persistent=False)  # (p*p, 2)
        self.centre_index = (patch_size * patch_size) // 2
        self.type_embed = nn.Parameter(torch.zeros(2, dim))
        if cfg.band_tokens:
            self.band_window = min(cfg.band_window, patch_size)
            g = cfg.band_group_size
            self.band_tokenizer = SpectralTokenizer(g, g, self.band_window, dim)
            self.band_pe = SinusoidalPositionalEncoding(dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.embed_drop = nn.Dropout(cfg.dropout)
        self.rel_bias = RelativePositionBias(cfg.num_heads, pos_dim=2) if cfg.relative_bias else None
        self.encoder = TransformerEncoder(
            dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio, cfg.dropout, cfg.attn_drop, cfg.drop_path
        )
        head_in = 2 * dim if cfg.pool == "cls_centre" else dim
        self.head = nn.Linear(head_in, num_classes)

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encoded tokens: cls, the p*p pixels in row-major order, then the band tokens (if any).

        Shapes:
            batch["patch"]: (n, B, p, p) -> (n, 1 + p*p [+ Lb], D)
        """
        x = _patch(batch, self.patch_size)  # (n, B, p, p)
        n, num_bands, p, _ = x.shape
        band_pos = self.positions(batch, num_bands, x.device)  # (B,)
        e = self.embed_norm(self.pixel_embed(x, band_pos))  # (n, p, p, D)
        if self.conv is not None:
            e = e + F.gelu(self.conv(e.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)  # (n, p, p, D)
        pe = self.spatial_pe(self.pixel_offsets).to(e.dtype)  # (p*p, D)
        spatial = e.reshape(n, p * p, -1) + pe + self.type_embed[0]  # (n, p*p, D)
        parts = [self.cls_token.expand(n, -1, -1), spatial]
        if self.cfg.band_tokens:
            lo = (p - self.band_window) // 2
            window = x[:, :, lo : lo + self.band_window, lo : lo + self.band_window]  # (n, B, w, w)
            bands, pos = self.band_tokenizer(window, band_pos)  # (n, Lb, D), (Lb,)
            parts.append(bands + self.band_pe(pos).to(bands.dtype) + self.type_embed[1])  # (n, Lb, D)
        z = self.embed_drop(torch.cat(parts, dim=1))  # (n, 1 + p*p [+ Lb], D)
        bias = None
        if self.rel_bias is not None:
            b = self.rel_bias(self.pixel_offsets)  # (H, p*p, p*p)
            extra = z.shape[1] - 1 - p * p
            bias = F.pad(b, (1, extra, 1, extra))  # (H, 1 + p*p + Lb, same)
        return self.encoder(z, attn_bias=bias)  # (n, 1 + p*p [+ Lb], D)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        z = self.encode(batch)  # (n, 1 + p*p [+ Lb], D)
        centre = z[:, 1 + self.centre_index]  # (n, D)
        if self.cfg.pool == "cls":
            feat = z[:, 0]
        elif self.cfg.pool == "centre":
            feat = centre
        else:
            feat = torch.cat((z[:, 0], centre), dim=-1)  # (n, 2D)
        return self.head(feat)  # (n, C)


@MODELS.register("spectral_spatial", config=SpectralSpatialConfig)
def build_spectral_spatial(cfg: SpectralSpatialConfig, info: DataInfo) -> nn.Module:
    """Spectral-spatial Transformer over the pixels of a patch plus centre band tokens (any band count)."""
    _check_positions(cfg, info)
    return SpectralSpatialTransformer(cfg, info.num_classes, _patch_size(info), info.wavelengths)
