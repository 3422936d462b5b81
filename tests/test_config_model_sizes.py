"""Absurd model sizes are one-line ConfigErrors at load time: an MLP hidden width (width x
model.mlp_ratio) and neighbour counts too, never a raw allocator error when the model is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer import config
from sciformer.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.mark.parametrize(("experiment", "override", "needle"), [
    ("indian_pines_demo.yaml", "model.mlp_ratio=1e12", r"model\.mlp_ratio: 1e\+12 makes an MLP hidden width"),
    ("modelnet10_v3.yaml", "model.mlp_ratio=1e6", r"model\.mlp_ratio: 1e\+06 makes an MLP hidden width"),
    ("s3dis_area5.yaml", "model.k=1000000000", r"model\.k: 1000000000 is beyond"),
    ("modelnet10_v3.yaml", "model.cpe_k=100000", r"model\.cpe_k: 100000 is beyond"),
    ("lidar_tiles_v3.yaml", "model.decoder_channels=[16384,64,128] model.mlp_ratio=64", r"model\.mlp_ratio: 64 makes .* \(16384 x 64\)"),
])
def test_an_absurd_size_is_refused_naming_the_key(experiment: str, override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config.load(EXPERIMENTS / experiment, override.split())


def test_usual_sizes_pass() -> None:
    config.load(EXPERIMENTS / "indian_pines_demo.yaml", ["model.mlp_ratio=8", "model.dim=1024"])
    config.load(EXPERIMENTS / "modelnet10_v3.yaml", ["model.mlp_ratio=4", "model.cpe_k=32"])
    config.load(EXPERIMENTS / "s3dis_area5.yaml", ["model.k=32"])
