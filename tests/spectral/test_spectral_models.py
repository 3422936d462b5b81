"""Registered hyperspectral models: registry, configs, band-count independence, gradients."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import torch

import sciformer.registry as registry
from sciformer.contracts import DataInfo
from sciformer.errors import ConfigError, DataError
from sciformer.registry import MODELS
from sciformer.spectral import models as spectral_models
from sciformer.spectral.models import SpectralFormerConfig, SpectralSpatialConfig

SPECTRAL = ("spectralformer", "spectral_spatial")
TINY: dict[str, dict[str, Any]] = {  # small widths keep every test fast
    "spectralformer": {"dim": 16, "depth": 3, "num_heads": 2},
    "spectral_spatial": {"dim": 16, "depth": 2, "num_heads": 2, "spectral_hidden": 16, "band_group_size": 4},
}


def spectral_names() -> list[str]:
    return sorted(e.name for e in MODELS.entries() if e.builder.__module__ == spectral_models.__name__)


def build(
    name: str, patch_size: int = 5, num_classes: int = 4, wavelengths: Any = None, **overrides: Any
) -> torch.nn.Module:
    entry = MODELS.get(name)
    cfg = entry.config(**{**TINY[name], **overrides})
    info = DataInfo(num_classes, [f"c{i}" for i in range(num_classes)], 30, patch_size=patch_size, wavelengths=wavelengths)
    torch.manual_seed(0)
    return entry.builder(cfg, info)


def batch(n: int = 3, bands: int = 30, patch_size: int = 5, **extra: Any) -> dict[str, Any]:
    return {"patch": torch.randn(n, bands, patch_size, patch_size), "target": torch.zeros(n, dtype=torch.long), **extra}


@pytest.fixture(autouse=True)
def _only_spectral_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load only this package's built-ins, independent of the other registered modules."""
    monkeypatch.setattr(registry, "_BUILTIN_MODULES", (spectral_models.__name__,))
    monkeypatch.setattr(registry, "_loaded", False)


def test_registry_lists_spectral_models() -> None:
    names = MODELS.names()
    for name in SPECTRAL:
        assert name in names
        assert MODELS.get(name).summary
    assert set(spectral_names()) == set(SPECTRAL)
    with pytest.raises(ConfigError, match="did you mean|valid"):
        MODELS.get("spectral_former")


@pytest.mark.parametrize("name", SPECTRAL)
def test_forward_backward(name: str) -> None:
    model = build(name).train()
    logits = model(batch())
    assert logits.shape == (3, 4)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 3])).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", SPECTRAL)
def test_one_model_any_band_count(name: str) -> None:
    model = build(name).eval()
    outputs = {bands: model(batch(2, bands)) for bands in (30, 103, 144, 200)}
    assert all(out.shape == (2, 4) and torch.isfinite(out).all() for out in outputs.values())
    # the weights of a model built for one band count load into one built for another, and predict the same
    other = build(name, wavelengths=torch.linspace(400, 2500, 200))
    other.load_state_dict(model.state_dict())
    torch.manual_seed(0)
    b = batch(2, 30)  # 30 bands: the 200 build-time wavelengths do not apply, both use band indices
    torch.testing.assert_close(other.eval()(b), model(b))


@pytest.mark.parametrize("name", SPECTRAL)
def test_eval_deterministic_and_per_sample(name: str) -> None:
    model = build(name).eval()
    b = batch(4)
    out = model(b)
    torch.testing.assert_close(out, model(b))
    single = model({"patch": b["patch"][2:3]})
    torch.testing.assert_close(out[2:3], single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", SPECTRAL)
def test_wavelength_positions(name: str) -> None:
    model = build(name).eval()
    b = batch(2, 30)
    wl = torch.linspace(400.0, 2500.0, 30)
    by_index = model(b)
    by_wavelength = model({**b, "wavelength": wl})
    assert not torch.allclose(by_index, by_wavelength)
    torch.testing.assert_close(model({**b, "wavelength": wl.expand(2, 30)}), by_wavelength)  # collated (n, B)
    with_default = build(name, wavelengths=wl.tolist()).eval()
    torch.testing.assert_close(with_default(b), by_wavelength)  # wavelengths given at build time
    with pytest.raises(ConfigError, match="model.position_source=wavelength"):
        build(name, position_source="wavelength")  # no centres: refused when built, not at the first batch
    strict = build(name, position_source="wavelength", wavelengths=wl.tolist()).eval()
    with pytest.raises(DataError, match="wavelength"):
        strict({**b, "patch": torch.zeros(2, 29, *b["patch"].shape[2:])})  # neither the batch nor the build gives 29 centres
    index_only = build(name, position_source="index").eval()
    torch.testing.assert_close(index_only({**b, "wavelength": wl}), by_index)
    with pytest.raises(DataError, match="wavelength"):
        model({**b, "wavelength": torch.arange(29.0)})


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("spectralformer", {"relative_bias": True}),
        ("spectralformer", {"fusion": "gate", "pool": "mean"}),
        ("spectralformer", {"fusion": "none", "group_size": 5, "stride": 2, "pad_mode": "zeros"}),
        ("spectral_spatial", {"relative_bias": True}),
        ("spectral_spatial", {"band_tokens": False, "conv_stem": False, "pool": "cls"}),
        ("spectral_spatial", {"pool": "centre", "band_window": 7}),
    ],
)
def test_variants(name: str, overrides: dict[str, Any]) -> None:
    model = build(name, **overrides)
    b = batch(3, 17)
    logits = model(b)
    assert logits.shape == (3, 4) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []  # every part of the variant is used
    model.eval()  # samples stay independent of each other in every variant
    torch.testing.assert_close(model(b)[1:2], model({"patch": b["patch"][1:2]}), rtol=1e-4, atol=1e-5)


def test_spectral_spatial_uses_spatial_context() -> None:
    model = build("spectral_spatial").eval()
    b = batch(1)
    x2 = b["patch"].clone()
    x2[:, :, 0, 0] += 3.0  # a corner pixel, outside the band-token window
    assert not torch.allclose(model(b), model({"patch": x2}))


@pytest.mark.parametrize("config", [SpectralFormerConfig, SpectralSpatialConfig])
def test_config_rejects_unknown_keys(config: type[pydantic.BaseModel]) -> None:
    config()  # defaults are valid
    with pytest.raises(pydantic.ValidationError, match="extra"):
        config(dimm=64)
    with pytest.raises(pydantic.ValidationError):
        config(depth=0)


def test_builder_errors() -> None:
    """Parameter constraints fail when the parameters are validated (config load), data ones at build."""
    with pytest.raises(ConfigError, match="patch_size"):
        MODELS.get("spectralformer").builder(SpectralFormerConfig(), DataInfo(3, ["a", "b", "c"], 30))
    with pytest.raises(pydantic.ValidationError, match="num_heads"):
        SpectralFormerConfig(dim=30, num_heads=4)
    with pytest.raises(pydantic.ValidationError, match="stride"):
        SpectralFormerConfig(group_size=3, stride=4)
    with pytest.raises(DataError, match="patch_size: expected a positive odd integer"):
        DataInfo(3, ["a", "b", "c"], 30, patch_size=6)
    with pytest.raises(pydantic.ValidationError, match="band_window"):
        SpectralSpatialConfig(band_window=2)


@pytest.mark.parametrize("name", SPECTRAL)
def test_bad_batch(name: str) -> None:
    model = build(name)
    with pytest.raises(DataError, match="'patch'"):
        model({"x": torch.randn(2, 30, 5, 5)})
    with pytest.raises(DataError, match=r"\(n, B, 5, 5\)"):
        model(batch(2, 30, patch_size=7))
