"""Point Transformer V3 models, registered in :data:`sciformer.registry.MODELS`.

Wu et al., "Point Transformer V3: Simpler, Faster, Stronger" (CVPR 2024), on the shared
attention core and without spconv:

- the input is put on a grid (``grid_size``) and serialized along space-filling curves
  (``orders``: Z-order, Hilbert and their transposed variants; shuffled per stage in
  training with ``shuffle_orders``); block ``b`` of a stage uses order ``b mod len(orders)``;
- each block is :class:`~sciformer.attention.transformer.PreNormBlock` with
  :class:`~sciformer.attention.serialized.SerializedAttention` (dense attention in patches
  of ``patch_size`` points, the last patch of a cloud padded and masked) and the
  :class:`~sciformer.attention.positional.ConditionalPositionalEncoding` (depthwise kNN
  convolution, ``cpe_k`` neighbours) in front;
- stages are joined by grid pooling by ``stride`` on the cells
  (:class:`~sciformer.pointcloud.serialized_layers.SerializedPooling`); the segmenter's
  decoder unpools through the kept cluster maps.

``point_transformer_v3_cls``: encoder, mean per cloud, MLP head -> (B, num_classes).
``point_transformer_v3_seg``: U-Net -> (N, num_classes), optional one-hot category.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from sciformer.attention import (
    ConditionalPositionalEncoding,
    PreNormBlock,
    SerializedAttention,
    SerializedContext,
)
from sciformer.contracts import DataInfo
from sciformer.geometry import grid_coordinates
from sciformer.geometry.pyg import as_packed_batch
from sciformer.geometry.serialization import ORDERS
from sciformer.pointcloud.layers import (
    ClassificationHead,
    SegmentationHead,
    segment_mean,
)
from sciformer.pointcloud.models import _check_task, category_count, input_channels, input_level
from sciformer.pointcloud.serialized_layers import (
    SerializedPooling,
    SerializedUnpooling,
    SerialLevel,
    linear_bn_gelu,
    stage_context,
)
from sciformer.registry import MODELS

__all__ = ["PointTransformerV3Classifier", "PointTransformerV3Config", "PointTransformerV3Segmenter"]


def _per_stage(value: int | list[int], n: int, name: str) -> list[int]:
    values = [value] * n if isinstance(value, int) else list(value)
    if len(values) != n or min(values) < 1:
        raise ValueError(f"{name}: expected a positive integer or one per stage ({n}), got {value}")
    return values


class PointTransformerV3Config(BaseModel):
    """Encoder parameters shared by ``point_transformer_v3_cls`` and ``_seg`` (PTv3 defaults)."""

    model_config = ConfigDict(extra="forbid")

    grid_size: float = Field(0.02, gt=0)  # voxel edge of the input grid (serialization, CPE scale)
    channels: list[int] = Field(default_factory=lambda: [32, 64, 128, 256, 512], min_length=1)
    depths: list[int] = Field(default_factory=lambda: [2, 2, 2, 6, 2], min_length=1)  # blocks per stage
    num_heads: int | list[int] = Field(default_factory=lambda: [2, 4, 8, 16, 32])
    patch_size: int | list[int] = 1024  # points per attention patch
    stride: int = Field(2, ge=2)  # grid pooling factor between stages
    orders: list[str] = Field(default_factory=lambda: list(ORDERS), min_length=1)
    shuffle_orders: bool = True  # shuffle the orders per stage in training
    shift_patch: bool = False  # odd blocks shift the patch grid by half a patch
    cpe_k: int = Field(8, ge=0)  # neighbours of the conditional positional encoding; 0: none
    mlp_ratio: float = Field(4.0, gt=0)
    qkv_bias: bool = True
    attn_drop: float = Field(0.0, ge=0.0, lt=1.0)
    proj_drop: float = Field(0.0, ge=0.0, lt=1.0)
    drop_path: float = Field(0.3, ge=0.0, lt=1.0)  # stochastic depth, linearly increasing
    use_coord_as_feature: bool = True  # append coord (3) to feat

    def stage_heads(self) -> list[int]:
        return _per_stage(self.num_heads, len(self.channels), "num_heads")

    def stage_patch(self) -> list[int]:
        return _per_stage(self.patch_size, len(self.channels), "patch_size")

    @model_validator(mode="after")
    def _check(self) -> PointTransformerV3Config:
        n = len(self.channels)
        if len(self.depths) != n or min(self.depths) < 0 or min(self.channels) < 1:
            raise ValueError(f"channels and depths need one entry per stage (channels >= 1, depths >= 0); got {self.channels}, {self.depths}")
        for c, h in zip(self.channels, self.stage_heads()):
            if c % h:
                raise ValueError(f"num_heads: {h} does not divide stage width {c}")
        self.stage_patch()
        bad = [o for o in self.orders if o not in ORDERS]
        if bad:
            raise ValueError(f"orders: expected entries of {ORDERS}, got {bad}")
        return self


class PointTransformerV3ClsConfig(PointTransformerV3Config):
    """``model:`` parameters of ``point_transformer_v3_cls``."""

    head_hidden: list[int] = Field(default_factory=lambda: [256, 128])
    dropout: float = Field(0.5, ge=0.0, lt=1.0)  # head dropout


class PointTransformerV3SegConfig(PointTransformerV3Config):
    """``model:`` parameters of ``point_transformer_v3_seg``."""

    decoder_channels: list[int] | None = None  # one per stage but the last (default: PTv3's 64/64/128/256 pattern)
    decoder_depths: int | list[int] = 2
    decoder_num_heads: int | list[int] | None = None  # default: width / 16
    use_category: bool | None = None  # one-hot category into the head; None: when the data has categories
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # head dropout

    def decoder(self) -> tuple[list[int], list[int], list[int]]:
        """Width, depth and heads of the decoder stage of every encoder stage but the last."""
        n = len(self.channels) - 1
        ch = self.decoder_channels or [max(c, 64) if s == 0 else c for s, c in enumerate(self.channels[:n])]
        if len(ch) != n:
            raise ValueError(f"decoder_channels: expected {n} widths (one per stage but the last), got {ch}")
        depths = [self.decoder_depths] * n if isinstance(self.decoder_depths, int) else list(self.decoder_depths)
        if len(depths) != n or (depths and min(depths) < 0):
            raise ValueError(f"decoder_depths: expected a non-negative integer or {n} of them, got {self.decoder_depths}")
        heads = [max(1, c // 16) for c in ch] if self.decoder_num_heads is None else _per_stage(self.decoder_num_heads, n, "decoder_num_heads")
        if any(c % h for c, h in zip(ch, heads)):
            raise ValueError(f"decoder_num_heads: {heads} must divide the decoder widths {ch}")
        return ch, depths, heads

    @model_validator(mode="after")
    def _check_decoder(self) -> PointTransformerV3SegConfig:
        self.decoder()
        return self


# --------------------------------------------------------------------------- stages
def serialized_block(cfg: PointTransformerV3Config, dim: int, heads: int, patch: int, index: int, drop_path: float) -> PreNormBlock:
    """One PTv3 block: CPE, then pre-norm serialized attention and MLP (order ``index``)."""
    attn = SerializedAttention(
        dim, heads, patch, order_index=index, shift_patch=cfg.shift_patch and index % 2 == 1,
        qkv_bias=cfg.qkv_bias, attn_drop=cfg.attn_drop, proj_drop=cfg.proj_drop,
    )
    cpe = ConditionalPositionalEncoding(dim) if cfg.cpe_k > 0 else None
    return PreNormBlock(dim, attn, mlp_ratio=cfg.mlp_ratio, drop=cfg.proj_drop, drop_path=drop_path, norm="layer", pos_encoding=cpe)


class SerializedStage(nn.Module):
    r"""Optional grid pooling, then ``depth`` serialized-attention blocks sharing one context.

    A stage without blocks builds no context (None): its points are only pooled.

    Shapes:
        level: SerialLevel (N points, in_channels)
        -> (SerialLevel (M points, out_channels), context over the M points or None, cluster (N,) or None)
    """

    def __init__(self, cfg: PointTransformerV3Config, in_channels: int, out_channels: int, *, depth: int, heads: int,
                 patch: int, pool: bool, cell: float, drop_path: list[float]) -> None:
        super().__init__()
        self.cfg_orders, self.shuffle, self.cpe_k, self.cell = list(cfg.orders), cfg.shuffle_orders, cfg.cpe_k, cell
        self.pool: nn.Module | None = SerializedPooling(in_channels, out_channels, cfg.stride) if pool else None
        self.blocks = nn.ModuleList(serialized_block(cfg, out_channels, heads, patch, i, drop_path[i]) for i in range(depth))

    def context(self, level: SerialLevel) -> SerializedContext:
        """Serialize the level (orders shuffled in training) and build the CPE basis."""
        orders = self.cfg_orders
        if self.training and self.shuffle and len(orders) > 1:
            orders = [orders[i] for i in torch.randperm(len(orders)).tolist()]
        return stage_context(level, orders, self.cpe_k, self.cell)

    def forward(self, level: SerialLevel) -> tuple[SerialLevel, SerializedContext | None, Tensor | None]:
        cluster = None
        if self.pool is not None:
            level, cluster = self.pool(level)
        if not self.blocks:
            return level, None, cluster
        ctx = self.context(level)
        x = level.feat  # (M, C)
        for block in self.blocks:
            x = block(x, ctx)  # (M, C)
        return level._replace(feat=x), ctx, cluster


class PointTransformerV3Encoder(nn.Module):
    """Input embedding and :class:`SerializedStage` s; returns every level, context and cluster map.

    Shapes:
        batch level: coord (N, 3), feat (N, C_in), offset (B,)
        -> S levels (finest first), S contexts (None for a stage without blocks), S cluster
        maps (None for the first stage)
    """

    def __init__(self, in_channels: int, cfg: PointTransformerV3Config) -> None:
        super().__init__()
        self.grid_size = cfg.grid_size
        self.embedding = linear_bn_gelu(in_channels, cfg.channels[0])
        total = sum(cfg.depths)
        rates = torch.linspace(0, cfg.drop_path, total).tolist() if total else []
        stages, width, used = [], cfg.channels[0], 0
        for s, (c, d, h, p) in enumerate(zip(cfg.channels, cfg.depths, cfg.stage_heads(), cfg.stage_patch())):
            cell = cfg.grid_size * cfg.stride**s
            stages.append(SerializedStage(cfg, width, c, depth=d, heads=h, patch=p, pool=s > 0, cell=cell, drop_path=rates[used : used + d]))
            width, used = c, used + d
        self.stages = nn.ModuleList(stages)

    def forward(self, coord: Tensor, feat: Tensor, offset: Tensor) -> tuple[list[SerialLevel], list[SerializedContext | None], list[Tensor | None]]:
        grid = grid_coordinates(coord, self.grid_size, offset)  # (N, 3)
        level = SerialLevel(coord, self.embedding(feat), offset, grid)
        levels, contexts, clusters = [], [], []
        for stage in self.stages:
            level, ctx, cluster = stage(level)
            levels.append(level)
            contexts.append(ctx)
            clusters.append(cluster)
        return levels, contexts, clusters


# --------------------------------------------------------------------------- models
class PointTransformerV3Classifier(nn.Module):
    """PTv3 classification: encoder, mean over the coarsest points of each cloud, MLP head.

    Shapes:
        batch: coord (N, 3), feat (N, in_channels), offset (B,) -> (B, num_classes)
    """

    def __init__(self, cfg: PointTransformerV3ClsConfig, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.in_channels, self.use_coord = in_channels, cfg.use_coord_as_feature
        self.encoder = PointTransformerV3Encoder(input_channels(in_channels, self.use_coord), cfg)
        self.norm = nn.LayerNorm(cfg.channels[-1])
        self.head = ClassificationHead(cfg.channels[-1], num_classes, tuple(cfg.head_hidden), cfg.dropout)

    def forward(self, batch: dict[str, Any]) -> Tensor:
        batch = as_packed_batch(batch)  # a PyG Data/Batch (pos, x, batch) works too
        level = input_level(batch, self.in_channels, self.use_coord)
        levels, _, _ = self.encoder(level.coord, level.feat, level.offset)
        pooled = segment_mean(self.norm(levels[-1].feat), levels[-1].offset)  # (B, C)
        return self.head(pooled)  # (B, num_classes)


class PointTransformerV3Segmenter(nn.Module):
    r"""PTv3 U-Net: encoder; per level from the coarsest, unpool (cluster map) + skip and
    ``decoder_depths`` serialized blocks (the encoder level's context); head.

    Shapes:
        batch: coord (N, 3), feat (N, in_channels), offset (B,), category (B,) when used
        -> (N, num_classes)
    """

    def __init__(self, cfg: PointTransformerV3SegConfig, in_channels: int, num_classes: int, num_categories: int = 0) -> None:
        super().__init__()
        self.in_channels, self.use_coord = in_channels, cfg.use_coord_as_feature
        self.encoder = PointTransformerV3Encoder(input_channels(in_channels, self.use_coord), cfg)
        dec_ch, dec_depths, dec_heads = cfg.decoder()
        patches = cfg.stage_patch()
        self.unpool = nn.ModuleList()
        self.decoders = nn.ModuleList()
        width = cfg.channels[-1]
        for s in range(len(cfg.channels) - 2, -1, -1):
            self.unpool.append(SerializedUnpooling(width, cfg.channels[s], dec_ch[s]))
            self.decoders.append(nn.ModuleList(
                serialized_block(cfg, dec_ch[s], dec_heads[s], patches[s], i, 0.0) for i in range(dec_depths[s])
            ))
            width = dec_ch[s]
        self.num_categories = num_categories
        self.head = SegmentationHead(width, num_classes, num_conditions=num_categories, dropout=cfg.dropout)

    def forward(self, batch: dict[str, Any]) -> Tensor:
        batch = as_packed_batch(batch)  # a PyG Data/Batch (pos, x, batch) works too
        level = input_level(batch, self.in_channels, self.use_coord)
        levels, contexts, clusters = self.encoder(level.coord, level.feat, level.offset)
        x = levels[-1]
        for j, (unpool, blocks) in enumerate(zip(self.unpool, self.decoders)):
            s = len(levels) - 2 - j
            x = unpool(x, levels[s], clusters[s + 1])  # (N_s, C)
            feat = x.feat
            ctx = contexts[s]
            if blocks and ctx is None:  # an encoder stage without blocks built none
                ctx = self.encoder.stages[s].context(levels[s])
            for block in blocks:
                feat = block(feat, ctx)  # (N_s, C)
            x = x._replace(feat=feat)
        return self.head(x.feat, x.offset, batch.get("category") if self.num_categories else None)  # (N, num_classes)


# --------------------------------------------------------------------------- builders
@MODELS.register("point_transformer_v3_cls", config=PointTransformerV3ClsConfig)
def build_point_transformer_v3_cls(cfg: PointTransformerV3ClsConfig, info: DataInfo) -> nn.Module:
    """Point Transformer V3 classifier: serialized attention encoder, mean per cloud, MLP head."""
    _check_task(info, "classification", "point_transformer_v3_cls")
    return PointTransformerV3Classifier(cfg, info.in_channels, info.num_classes)


@MODELS.register("point_transformer_v3_seg", config=PointTransformerV3SegConfig)
def build_point_transformer_v3_seg(cfg: PointTransformerV3SegConfig, info: DataInfo) -> nn.Module:
    """Point Transformer V3 U-Net segmenter (optional one-hot category for part segmentation)."""
    _check_task(info, "segmentation", "point_transformer_v3_seg")
    return PointTransformerV3Segmenter(cfg, info.in_channels, info.num_classes, num_categories=category_count(cfg.use_category, info))
