"""Spectral checkpoints written before the shared MLP / PositionMLP layout still load."""

from __future__ import annotations

import torch

from sciformer.contracts import DataInfo
from sciformer.registry import MODELS


def test_old_state_dict_keys_load_into_the_shared_layers() -> None:
    torch.manual_seed(0)
    entry = MODELS.get("spectral_spatial")
    info = DataInfo(4, list("abcd"), 20, patch_size=5)
    model = entry.builder(entry.config(relative_bias=True), info).eval()
    renames = {"pixel_embed.weight_mlp.fc1.": "pixel_embed.weight_mlp.0.",
               "pixel_embed.weight_mlp.fc2.": "pixel_embed.weight_mlp.2.",
               "rel_bias.mlp.": "rel_bias.mlp.net."}
    old = {}
    for key, value in model.state_dict().items():
        for new, prior in renames.items():
            if key.startswith(new):
                key = prior + key[len(new):]
                break
        old[key] = value
    assert any(".net." in k for k in old) and any("weight_mlp.0." in k for k in old)
    torch.manual_seed(1)
    fresh = entry.builder(entry.config(relative_bias=True), info).eval()
    fresh.load_state_dict(old, strict=True)
    batch = {"patch": torch.rand(3, 20, 5, 5)}
    with torch.no_grad():
        torch.testing.assert_close(fresh(batch), model(batch))
