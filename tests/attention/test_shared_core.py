"""Every registered model takes its attention, blocks and positions from sciformer.attention.

Builds each model of the registry (the v1/v2 point models in both attention forms) and
checks that the spectral and point families share the same classes (identity, not
copies), and that no model file defines attention, MLP, norm or position helpers itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import sciformer
from sciformer import attention as core
from sciformer.contracts import DataInfo
from sciformer.registry import MODELS

SMALL = {
    "spectralformer": {"dim": 16, "depth": 2, "num_heads": 2, "relative_bias": True},
    "spectral_spatial": {"dim": 16, "depth": 1, "num_heads": 2},
    "point_transformer_cls": {"channels": [16, 32], "blocks": [1, 1], "strides": [1, 4], "head_hidden": [16]},
    "point_transformer_seg": {"channels": [16, 32], "blocks": [1, 1], "strides": [1, 4]},
    "point_transformer_v3_cls": {"channels": [16, 32], "depths": [1, 1], "num_heads": 2, "patch_size": 16, "head_hidden": [16]},
    "point_transformer_v3_seg": {"channels": [16, 32], "depths": [1, 1], "num_heads": 2, "patch_size": 16},
}
VARIANTS = [(name, {}) for name in SMALL] + [
    ("point_transformer_cls", {"attention": "ptv2"}),
    ("point_transformer_seg", {"attention": "ptv2"}),
]


def build(name: str, extra: dict) -> nn.Module:
    entry = MODELS.get(name)
    if name.startswith("spectral"):
        info = DataInfo(4, list("abcd"), 20, patch_size=5)
    else:
        task = "classification" if name.endswith("_cls") else "segmentation"
        info = DataInfo(4, list("abcd"), 3, task=task)
    return entry.builder(entry.config(**{**SMALL[name], **extra}), info)


def classes(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules()}


def test_every_registered_model_is_covered() -> None:
    builtin = {e.name for e in MODELS.entries() if e.builder.__module__.startswith("sciformer.")}
    assert builtin == set(SMALL)


@pytest.fixture(scope="module")
def built() -> dict[str, set[type]]:
    torch.manual_seed(0)
    return {f"{name}{extra}": classes(build(name, extra)) for name, extra in VARIANTS}


def family(built: dict[str, set[type]], prefix: str, exclude: str | None = None) -> list[set[type]]:
    out = [c for key, c in built.items() if key.startswith(prefix) and (exclude is None or exclude not in key)]
    assert out
    return out


def test_spectral_and_v3_share_one_dense_attention_and_block(built) -> None:
    for found in family(built, "spectral") + family(built, "point_transformer_v3"):
        assert core.MultiHeadAttention in found
        assert core.Mlp in found and core.DropPath in found
        assert any(issubclass(t, core.PreNormBlock) for t in found)
        assert any(issubclass(t, core.PositionalEncoding) for t in found)
    for found in family(built, "point_transformer_v3"):
        assert {core.SerializedAttention, core.ConditionalPositionalEncoding, core.PreNormBlock} <= found


def test_v1_v2_use_the_neighbourhood_ops_and_relative_xyz_encoding(built) -> None:
    v1 = [c for k, c in built.items() if k.startswith("point_transformer_") and "v3" not in k and "ptv2" not in k]
    v2 = [c for k, c in built.items() if "ptv2" in k]
    for found in v1:
        assert {core.PointTransformerBlock, core.PointTransformerLayer, core.PositionMLP, core.DropPath} <= found
    for found in v2:
        assert {core.PointTransformerBlock, core.GroupedVectorAttention, core.PositionMLP, core.EdgeMLP} <= found
    for found in v1 + v2:
        assert core.BatchNormLastDim in found  # the one norm factory


def test_attention_like_modules_all_come_from_the_core(built) -> None:
    words = ("Attention", "Positional", "PositionMLP", "PositionBias", "Block", "Mlp", "MLP", "DropPath", "Norm")
    for key, found in built.items():
        for t in found:
            if any(w in t.__name__ for w in words) and not t.__module__.startswith("torch."):
                assert t.__module__.startswith("sciformer.attention."), f"{key}: {t.__module__}.{t.__name__}"


MODEL_FILES = sorted(
    p for sub in ("pointcloud", "spectral") for p in (Path(sciformer.__file__).parent / sub).glob("*.py")
)


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_model_files_define_no_attention_helpers(path: Path) -> None:
    tree = ast.parse(path.read_text())
    names = [n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    banned = [n for n in names if any(w in n.lower() for w in ("attention", "mlp", "_norm", "positional", "droppath"))]
    assert not banned, f"{path.name} defines {banned}; they belong in sciformer.attention"
    source = path.read_text()
    assert "scaled_dot_product_attention" not in source and ".softmax(" not in source
