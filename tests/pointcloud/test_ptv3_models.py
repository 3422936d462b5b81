"""Point Transformer V3 models (serialized attention) and per-stage k of the v1/v2 models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sciformer.config import validate
from sciformer.contracts import DataInfo
from sciformer.errors import ConfigError
from sciformer.geometry import grid_coordinates, sizes_to_offset
from sciformer.pointcloud.serialized_layers import (
    SerializedPooling,
    SerializedUnpooling,
    SerialLevel,
)
from sciformer.registry import MODELS

V3 = {"channels": [16, 32, 32], "depths": [1, 2, 1], "num_heads": [2, 4, 4], "patch_size": 24, "grid_size": 0.01}


def make_batch(sizes: list[int], channels: int = 3, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    return {
        "coord": torch.rand(n, 3, generator=gen),
        "feat": torch.rand(n, channels, generator=gen),
        "offset": sizes_to_offset(sizes),
        "target": torch.randint(0, 5, (n,), generator=gen),
    }


def build(name: str, in_channels: int = 3, categories: list[str] | None = None, **params) -> torch.nn.Module:
    entry = MODELS.get(name)
    task = "classification" if name.endswith("_cls") else "segmentation"
    base = {**V3, "head_hidden": [16]} if name.endswith("_cls") else dict(V3)
    info = DataInfo(5, [f"c{i}" for i in range(5)], in_channels, task=task, category_names=categories)
    return entry.builder(entry.config(**{**base, **params}), info)


@pytest.mark.parametrize("name", ["point_transformer_v3_cls", "point_transformer_v3_seg"])
@pytest.mark.parametrize("params", [{}, {"shift_patch": True, "cpe_k": 0}, {"orders": ["hilbert"], "patch_size": [8, 16, 1024]},
                                    {"depths": [0, 2, 1]}])  # no blocks, no encoder context: the decoder builds its own
def test_forward_backward_on_unequal_clouds(name: str, params: dict) -> None:
    torch.manual_seed(0)
    model = build(name, **params)
    batch = make_batch([60, 13, 41])
    logits = model(batch)
    assert logits.shape == ((3, 5) if name.endswith("_cls") else (114, 5))
    logits.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing[:5]
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_segmenter_is_permutation_equivariant_up_to_serialization() -> None:
    # a fine grid puts every point in its own cell, so the serialization (hence the
    # patches) does not depend on the input order: outputs follow the permutation
    torch.manual_seed(1)
    model = build("point_transformer_v3_seg", grid_size=1e-4).eval()
    batch = make_batch([70, 50], seed=1)
    perm = torch.cat([torch.randperm(70), 70 + torch.randperm(50)])
    moved = {**batch, "coord": batch["coord"][perm], "feat": batch["feat"][perm]}
    with torch.no_grad():
        y, y_p = model(batch), model(moved)
    torch.testing.assert_close(y_p, y[perm], atol=1e-5, rtol=1e-4)
    cls = build("point_transformer_v3_cls", grid_size=1e-4).eval()
    with torch.no_grad():
        torch.testing.assert_close(cls(moved), cls(batch), atol=1e-5, rtol=1e-4)


def test_cloud_result_does_not_depend_on_the_batch() -> None:
    torch.manual_seed(2)
    model = build("point_transformer_v3_seg", shift_patch=True).eval()
    batch = make_batch([80, 30], seed=2)
    alone = {k: (v[:80] if k != "offset" else sizes_to_offset([80])) for k, v in batch.items()}
    with torch.no_grad():
        torch.testing.assert_close(model(batch)[:80], model(alone), atol=1e-5, rtol=1e-4)


def test_cloud_result_does_not_depend_on_a_larger_cloud_in_the_batch() -> None:
    torch.manual_seed(3)
    model = build("point_transformer_v3_cls", orders=["hilbert", "z"]).eval()
    batch = make_batch([80, 60], seed=3)
    batch["coord"][80:] *= 40  # 40x the extent: 6 more curve bits than the first cloud needs
    alone = {k: (v[:80] if k != "offset" else sizes_to_offset([80])) for k, v in batch.items()}
    with torch.no_grad():
        torch.testing.assert_close(model(batch)[:1], model(alone), atol=1e-5, rtol=1e-4)


def test_orders_are_shuffled_in_training_only() -> None:
    torch.manual_seed(3)
    model = build("point_transformer_v3_cls")
    stage = model.encoder.stages[1]
    batch = make_batch([90], seed=3)
    level = SerialLevel(batch["coord"], torch.zeros(90, 32), batch["offset"], grid_coordinates(batch["coord"], 0.02))
    seen = {tuple(t[:5].tolist()) for t in (stage.context(level).orders[0] for _ in range(12))}
    assert len(seen) > 1  # different first orders across training steps
    stage.eval()
    assert len({tuple(stage.context(level).orders[0][:5].tolist()) for _ in range(4)}) == 1


def test_pooling_keeps_the_cluster_map_for_unpooling() -> None:
    torch.manual_seed(4)
    batch = make_batch([40, 25], seed=4)
    grid = grid_coordinates(batch["coord"], 0.1, batch["offset"])
    level = SerialLevel(batch["coord"], torch.randn(65, 8), batch["offset"], grid)
    pooled, cluster = SerializedPooling(8, 16, stride=2)(level)
    assert cluster.shape == (65,) and int(cluster.max()) + 1 == pooled.coord.shape[0]
    for v in range(pooled.coord.shape[0]):
        members = (cluster == v).nonzero().flatten()
        assert len({tuple(g) for g in (grid[members] // 2).tolist()}) == 1  # one coarse cell
        assert torch.equal(pooled.grid[v], grid[members[0]] // 2)
        torch.testing.assert_close(pooled.coord[v], batch["coord"][members].mean(0))
        assert len({int(m >= 40) for m in members}) == 1  # never across clouds
    unpool = SerializedUnpooling(16, 8, 4).eval()
    out = unpool(pooled, level, cluster)
    torch.testing.assert_close(out.feat, unpool.proj(pooled.feat)[cluster] + unpool.proj_skip(level.feat))


def test_v3_configs_validate_with_one_line_errors() -> None:
    def load(model: dict) -> None:
        validate({"data": {"name": "modelnet"}, "model": {"name": "point_transformer_v3_cls", **model}}, base_dir=Path("."))

    load({"channels": [32, 64], "depths": [1, 1], "num_heads": [2, 4], "patch_size": [64, 32]})
    with pytest.raises(ConfigError, match="orders"):
        load({"orders": ["peano"]})
    with pytest.raises(ConfigError, match="num_heads"):
        load({"channels": [30], "depths": [1], "num_heads": 4})
    with pytest.raises(ConfigError, match="patch_size"):
        load({"channels": [32, 64], "depths": [1, 1], "num_heads": 2, "patch_size": [64]})


# ---------------------------------------------------------------- v1/v2: per-stage k
@pytest.mark.parametrize("attention", ["ptv1", "ptv2"])
def test_per_stage_k_is_accepted_and_changes_the_result(attention: str) -> None:
    entry = MODELS.get("point_transformer_seg")
    info = DataInfo(5, [f"c{i}" for i in range(5)], 3, task="segmentation")
    base = {"channels": [16, 32, 32], "blocks": [1, 1, 1], "strides": [1, 4, 2], "attention": attention}
    batch = make_batch([64, 48], seed=5)
    outputs = {}
    for key, k in (("int", 8), ("list", [8, 8, 8]), ("other", [4, 16, 8])):
        torch.manual_seed(0)
        model = entry.builder(entry.config(**base, k=k), info).eval()
        with torch.no_grad():
            outputs[key] = model(batch)
    assert torch.equal(outputs["int"], outputs["list"])  # one k for all == the same k per stage
    assert not torch.allclose(outputs["int"], outputs["other"])  # k changes the result
    with pytest.raises(ValueError, match="one per stage"):
        entry.config(**base, k=[8, 16])
