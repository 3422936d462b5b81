"""Masked-band modelling (``sciformer.spectral.pretrain``) against a hand-written reference.

Oracles: counts of hidden groups; a loss recomputed with numpy from the encoder's tokens
and the decoder's generated weights; the encoder's tokens unchanged when only hidden
band values change (nothing hidden leaks into the input).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sciformer.errors import ConfigError
from sciformer.spectral.models import SpectralFormer, SpectralFormerConfig, SpectralSpatialConfig, SpectralSpatialTransformer
from sciformer.spectral.pretrain import MaskedBandModelling, band_group_mask, pixel_mask


def _model(bands: int = 12, patch: int = 3, **overrides: object) -> SpectralSpatialTransformer:
    params = {"dim": 16, "depth": 1, "num_heads": 2, "band_group_size": 3, "dropout": 0.0, "drop_path": 0.0, **overrides}
    return SpectralSpatialTransformer(SpectralSpatialConfig(**params), 3, patch)


@pytest.mark.parametrize("bands, group, ratio", [(200, 10, 0.5), (103, 10, 0.3), (9, 2, 0.5), (12, 4, 0.9), (7, 7, 0.5), (30, 1, 0.1)])
def test_band_group_mask_hides_whole_groups_in_the_asked_share(bands: int, group: int, ratio: float) -> None:
    gen = torch.Generator().manual_seed(3)
    hidden = band_group_mask(64, bands, group, ratio, gen)  # (64, B)
    assert hidden.shape == (64, bands) and hidden.dtype == torch.bool
    groups = -(-bands // group)
    expected = min(max(round(ratio * groups), 1), max(groups - 1, 1))
    group_of = np.arange(bands) // group
    for row in hidden.numpy():
        per_group = [set(row[group_of == g]) for g in range(groups)]
        assert all(len(s) == 1 for s in per_group)  # a group is hidden or kept as a whole
        assert sum(s == {True} for s in per_group) == expected
    if groups > 2:
        assert len({tuple(r) for r in hidden.numpy()}) > 1  # each sample draws its own groups


@pytest.mark.parametrize("pixel_ratio", [0.0, 0.3])
def test_the_loss_is_the_mean_squared_error_over_hidden_values(pixel_ratio: float) -> None:
    torch.manual_seed(0)
    model = _model(bands=12, patch=3).eval()
    objective = MaskedBandModelling(model, 0.5, 3).eval()
    x = torch.randn(5, 12, 3, 3)
    gen = torch.Generator().manual_seed(1)
    hidden = band_group_mask(5, 12, 3, 0.5, gen)[:, :, None, None] | pixel_mask(5, 3, pixel_ratio, gen)[:, None]  # (5, 12, 3, 3)
    assert int(pixel_mask(5, 3, pixel_ratio, gen).sum()) == 5 * round(pixel_ratio * 9)
    with torch.no_grad():
        loss = objective({"patch": x}, hidden)
        z = model.encode({"patch": x * ~hidden}).numpy()  # (5, 1 + 9, D)
        params = objective.decoder.weight_mlp(objective.decoder.encode(torch.arange(12, dtype=torch.float32))).numpy()  # (12, D + 1)
    ln = objective.decoder.norm
    errors = []
    for i in range(5):
        for k in range(9):  # pixels in row-major order
            t = z[i, 1 + k]
            t = (t - t.mean()) / np.sqrt(t.var() + ln.eps) * ln.weight.detach().numpy() + ln.bias.detach().numpy()
            for b in range(12):
                if hidden[i, b, k // 3, k % 3]:
                    pred = t @ params[b, :-1] + params[b, -1]
                    errors.append((pred - x[i, b, k // 3, k % 3].item()) ** 2)
    assert float(loss) == pytest.approx(float(np.mean(errors)), rel=1e-5)
    if pixel_ratio == 0:  # a (n, B) mask means the same bands in every pixel
        with torch.no_grad():
            assert float(objective({"patch": x}, hidden[:, :, 0, 0])) == pytest.approx(float(loss), rel=1e-6)


def test_hidden_band_values_never_reach_the_encoder() -> None:
    torch.manual_seed(0)
    model = _model(bands=20, patch=5, band_tokens=True, band_group_size=4).eval()
    objective = MaskedBandModelling(model, 0.4, 5)
    x = torch.randn(4, 20, 5, 5)
    hidden = band_group_mask(4, 20, 5, 0.4, torch.Generator().manual_seed(2))
    other = torch.where(hidden[:, :, None, None], torch.randn_like(x) * 100, x)  # only hidden values differ

    seen: list[torch.Tensor] = []
    hook = model.encoder.register_forward_hook(lambda m, args, out: seen.append(out.detach()))
    with torch.no_grad():
        a, b = objective({"patch": x}, hidden), objective({"patch": other}, hidden)
    hook.remove()
    assert torch.equal(seen[0], seen[1])  # the encoder saw the same input
    assert float(a) != float(b)  # the targets did change


def test_any_band_count_and_wavelengths_run_through_one_objective() -> None:
    model = _model(bands=12, patch=3)
    objective = MaskedBandModelling(model, 0.5, 3)
    for bands in (7, 12, 50):
        x = torch.randn(3, bands, 3, 3)
        batch = {"patch": x, "wavelength": torch.linspace(400, 2500, bands)}
        loss = objective(batch, band_group_mask(3, bands, 3, 0.5, torch.Generator().manual_seed(0)))
        loss.backward()
        assert torch.isfinite(loss) and model.pixel_embed.bias.grad is not None


def test_other_models_and_settings_are_one_line_errors() -> None:
    former = SpectralFormer(SpectralFormerConfig(dim=16, depth=1, num_heads=2), 3, 3)
    with pytest.raises(ConfigError, match="needs model 'spectral_spatial'"):
        MaskedBandModelling(former, 0.5, 3)
    for ratio in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match="mask-ratio"):
            MaskedBandModelling(_model(), ratio, 3)


def test_the_objective_draws_the_hidden_values_its_settings_ask_for() -> None:
    bands_only = MaskedBandModelling(_model(), 0.5, 3)
    both = MaskedBandModelling(_model(), 0.5, 3, pixel_ratio=0.4)
    drawn = bands_only.draw_hidden(6, 12, 3, torch.Generator().manual_seed(7))
    assert torch.equal(drawn, band_group_mask(6, 12, 3, 0.5, torch.Generator().manual_seed(7)))  # (n, B)
    gen = torch.Generator().manual_seed(7)
    expected = band_group_mask(6, 12, 3, 0.5, gen)[:, :, None, None] | pixel_mask(6, 3, 0.4, gen)[:, None]
    drawn = both.draw_hidden(6, 12, 3, torch.Generator().manual_seed(7))
    assert drawn.shape == (6, 12, 3, 3) and torch.equal(drawn, expected)
    whole = drawn.all(dim=1)  # pixels hiding every band: round(0.4 * 9) = 4 per patch, plus none by bands alone
    assert whole.flatten(1).sum(1).tolist() == [4] * 6
    with pytest.raises(ConfigError, match="pixel-ratio"):
        MaskedBandModelling(_model(), 0.5, 3, pixel_ratio=1.0)
