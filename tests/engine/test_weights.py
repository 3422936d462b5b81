"""Weights from checkpoints: partial loading for fine-tuning (--init-from) and one-line strict mismatches.

The oracle for "loaded" is bit equality with the source state dict; for "re-initialised"
it is bit equality with the target model's own fresh initialisation.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from sciformer.contracts import DataInfo
from sciformer.engine.checkpoint import save_checkpoint
from sciformer.engine.weights import init_from_checkpoint, load_strict
from sciformer.errors import CheckpointError
from sciformer.registry import MODELS

SPECTRAL = ["spectralformer", "spectral_spatial"]
SMALL = {"dim": 16, "depth": 1, "num_heads": 2}


def _hsi_info(bands: int, classes: int, patch: int = 5) -> DataInfo:
    return DataInfo(classes, [f"c{i}" for i in range(classes)], bands, patch_size=patch,
                    wavelengths=np.linspace(400.0, 2500.0, bands).tolist())


def _build(name: str, info: DataInfo, seed: int, **params) -> tuple[torch.nn.Module, dict]:
    entry = MODELS.get(name)
    cfg = entry.config(**params)
    torch.manual_seed(seed)
    model = entry.builder(cfg, info).eval()
    return model, {"model": {"name": name, **cfg.model_dump(mode="json")}}


def _save(path: Path, name: str, model: torch.nn.Module, exp_dict: dict, info: DataInfo) -> Path:
    save_checkpoint(path, {"config": exp_dict, "config_dir": str(path.parent), "data_info": dataclasses.asdict(info),
                           "model": model.state_dict(), "epoch": 3})
    return path


@pytest.mark.parametrize("name", SPECTRAL)
def test_spectral_model_of_200_bands_16_classes_fine_tunes_on_100_bands_3_classes(name: str, tmp_path: Path) -> None:
    src_info, dst_info = _hsi_info(200, 16), _hsi_info(100, 3)
    src, exp_src = _build(name, src_info, seed=1, **SMALL)
    ckpt = _save(tmp_path / "src.pt", name, src, exp_src, src_info)
    dst, exp_dst = _build(name, dst_info, seed=2, **SMALL)
    fresh = {k: v.clone() for k, v in dst.state_dict().items()}
    line, record = init_from_checkpoint(dst, ckpt, exp_dst, dataclasses.asdict(dst_info))

    n = len(fresh)
    assert line == (f"init-from {ckpt}: loaded {n - 2} of {n} tensors; "
                    "re-initialised head.weight, head.bias (shape differs: 16 -> 3 classes)")
    assert record["loaded"] == n - 2 and record["reinitialised"] == ["head.weight", "head.bias"]
    source = src.state_dict()
    for key, value in dst.state_dict().items():
        expected = fresh[key] if key.startswith("head.") else source[key]
        assert torch.equal(value, expected), key
    logits = dst({"patch": torch.randn(2, 100, 5, 5)})  # a band count the source never saw
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", SPECTRAL)
def test_equal_bands_and_classes_load_every_tensor_and_predict_as_the_source(name: str, tmp_path: Path) -> None:
    info = _hsi_info(30, 4)
    src, exp = _build(name, info, seed=1, **SMALL)
    ckpt = _save(tmp_path / "src.pt", name, src, exp, info)
    dst, _ = _build(name, info, seed=2, **SMALL)
    line, _ = init_from_checkpoint(dst, ckpt, exp, dataclasses.asdict(info))
    n = len(src.state_dict())
    assert line == f"init-from {ckpt}: loaded {n} of {n} tensors"
    batch = {"patch": torch.randn(3, 30, 5, 5)}
    with torch.no_grad():
        assert torch.equal(dst(batch), src(batch))


def test_a_weight_sized_by_the_patch_is_reinitialised_and_listed(tmp_path: Path) -> None:
    src_info, dst_info = _hsi_info(50, 4, patch=7), _hsi_info(50, 4, patch=5)
    src, exp = _build("spectralformer", src_info, seed=1, **SMALL)
    ckpt = _save(tmp_path / "src.pt", "spectralformer", src, exp, src_info)
    dst, _ = _build("spectralformer", dst_info, seed=2, **SMALL)
    line, record = init_from_checkpoint(dst, ckpt, exp, dataclasses.asdict(dst_info))
    differs = [k for k, v in dst.state_dict().items() if tuple(v.shape) != tuple(src.state_dict()[k].shape)]
    assert differs and record["reinitialised"] == differs  # exactly the tensors whose shape depends on p
    assert re.search(r"; re-initialised .*\(shape differs: patch 7 -> 5\)$", line), line


def test_a_point_checkpoint_into_a_spectral_model_is_one_line(tmp_path: Path) -> None:
    point_info = DataInfo(4, ["a", "b", "c", "d"], 3, task="classification")
    point, exp_point = _build("point_transformer_cls", point_info, seed=0)
    ckpt = _save(tmp_path / "point.pt", "point_transformer_cls", point, exp_point, point_info)
    dst_info = _hsi_info(20, 4)
    dst, exp_dst = _build("spectral_spatial", dst_info, seed=0, **SMALL)
    with pytest.raises(CheckpointError, match="same model family") as err:
        init_from_checkpoint(dst, ckpt, exp_dst, dataclasses.asdict(dst_info))
    assert "\n" not in str(err.value) and "'point_transformer_cls'" in str(err.value)


def test_no_matching_tensor_is_refused(tmp_path: Path) -> None:
    info = _hsi_info(20, 4)
    dst, exp = _build("spectral_spatial", info, seed=0, **SMALL)
    ckpt = tmp_path / "other.pt"
    save_checkpoint(ckpt, {"config": exp, "config_dir": str(tmp_path), "data_info": dataclasses.asdict(info),
                           "model": {"renamed.weight": torch.zeros(2, 2)}})
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"none of its 1 tensors .* matches model 'spectral_spatial'"):
        init_from_checkpoint(dst, ckpt, exp, dataclasses.asdict(info))
    assert all(torch.equal(v, before[k]) for k, v in dst.state_dict().items())  # nothing half-loaded


@pytest.mark.parametrize("content", [None, b"not a checkpoint", b"PK\x03\x04 truncated zip"])
def test_missing_or_corrupt_file_is_one_line(content: bytes | None, tmp_path: Path) -> None:
    info = _hsi_info(20, 4)
    dst, exp = _build("spectral_spatial", info, seed=0, **SMALL)
    path = tmp_path / "x.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        init_from_checkpoint(dst, path, exp, dataclasses.asdict(info))
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_strict_load_names_the_tensor_and_the_class_counts(tmp_path: Path) -> None:
    src_info, dst_info = _hsi_info(20, 16), _hsi_info(20, 3)
    src, exp = _build("spectral_spatial", src_info, seed=0, dim=64, depth=1, num_heads=2, pool="cls")
    state = {"config": exp, "data_info": dataclasses.asdict(src_info), "model": src.state_dict()}
    dst, _ = _build("spectral_spatial", dst_info, seed=0, dim=64, depth=1, num_heads=2, pool="cls")
    with pytest.raises(CheckpointError) as err:
        load_strict(dst, state, "runs/x/last.pt", exp, dataclasses.asdict(dst_info))
    assert str(err.value) == ("checkpoint 'runs/x/last.pt': head.weight has shape (16, 64), the model wants (3, 64): "
                              "the checkpoint was trained for 16 classes, this experiment has 3; "
                              "to fine-tune it on this data, train a new run with --init-from runs/x/last.pt")


def test_strict_load_names_a_changed_model_parameter() -> None:
    info = _hsi_info(20, 3)
    src, exp_src = _build("spectral_spatial", info, seed=0, **SMALL)
    dst, exp_dst = _build("spectral_spatial", info, seed=0, dim=16, depth=2, num_heads=2)
    state = {"config": exp_src, "data_info": dataclasses.asdict(info), "model": src.state_dict()}
    with pytest.raises(CheckpointError, match=r"^checkpoint 'c.pt' lacks encoder\.\S+ \(and \d+ more\), which model "
                                              r"'spectral_spatial' needs: model\.depth is 1 in the checkpoint, 2 here$"):
        load_strict(dst, state, "c.pt", exp_dst, dataclasses.asdict(info))


def test_a_non_string_tensor_name_is_listed_not_a_traceback(tmp_path: Path) -> None:
    info = _hsi_info(20, 4)
    src, exp = _build("spectral_spatial", info, seed=1, **SMALL)
    state = src.state_dict()
    state[5] = torch.zeros(1)  # an altered file: weights_only loading allows int keys
    ckpt = tmp_path / "odd.pt"
    save_checkpoint(ckpt, {"config": exp, "config_dir": str(tmp_path), "data_info": dataclasses.asdict(info), "model": state})
    dst, _ = _build("spectral_spatial", info, seed=2, **SMALL)
    line, record = init_from_checkpoint(dst, ckpt, exp, dataclasses.asdict(info))
    assert line.endswith("; ignored 1 checkpoint tensors the model lacks (5)") and record["loaded"] == len(src.state_dict())


def test_strict_load_of_a_non_tensor_value_says_so() -> None:
    info = _hsi_info(20, 3)
    src, exp = _build("spectral_spatial", info, seed=0, **SMALL)
    weights = src.state_dict()
    weights["head.bias"] = 3  # an altered file
    with pytest.raises(CheckpointError, match=r"^checkpoint 'c.pt': head\.bias is not a tensor \(int\), the model wants shape \(3,\)"):
        load_strict(src, {"config": exp, "data_info": dataclasses.asdict(info), "model": weights}, "c.pt", exp, dataclasses.asdict(info))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_weights_of_another_kind_of_number_are_refused_not_converted(dtype: torch.dtype, tmp_path: Path) -> None:
    """load_state_dict would copy integer / bool / complex values into float weights silently."""
    info = _hsi_info(20, 3)
    src, exp = _build("spectral_spatial", info, seed=0, **SMALL)
    weights = src.state_dict()
    weights["head.weight"] = weights["head.weight"].round().to(dtype)  # an altered file, same shape
    state = {"config": exp, "data_info": dataclasses.asdict(info), "model": weights}
    kind = str(dtype).removeprefix("torch.")
    with pytest.raises(CheckpointError, match=rf"^checkpoint 'c.pt': head\.weight holds {kind} values, the model wants float32; "):
        load_strict(src, state, "c.pt", exp, dataclasses.asdict(info))
    ckpt = tmp_path / "odd.pt"
    save_checkpoint(ckpt, {"config": exp, "config_dir": str(tmp_path), **state})
    with pytest.raises(CheckpointError, match=rf"^--init-from '.*odd\.pt': head\.weight holds {kind} values"):
        init_from_checkpoint(src, ckpt, exp, dataclasses.asdict(info))
    weights["head.weight"] = weights["head.weight"].real.to(torch.float64) if dtype.is_complex else weights["head.weight"].double()
    load_strict(src, state, "c.pt", exp, dataclasses.asdict(info))  # another float width loads, as torch converts it exactly


def test_a_dropout_change_is_no_reason_for_a_shape() -> None:
    from sciformer.engine.weights import context, reason

    state = {"config": {"model": {"name": "m", "dim": 32, "dropout": 0.0, "attn_drop": 0.0}}, "data_info": {}}
    ctx = context(state, {"model": {"name": "m", "dim": 16, "dropout": 0.1, "attn_drop": 0.2}}, {})
    assert reason(ctx, (32,), (16,))[1] == "model.dim 32 -> 16"  # dropout rates size no tensor
