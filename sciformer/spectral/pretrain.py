"""Masked-band modelling: self-supervised pre-training of ``spectral_spatial`` on unlabelled pixels.

Every pixel of a patch loses the same random band groups (set to 0, the training mean
after standard normalisation), and optionally a share of the pixels loses its whole
spectrum; the encoder sees the rest, and a band-agnostic decoder predicts every hidden
value from its pixel's token::

    hidden = bands(groups of g neighbours, a fraction r) | pixels(a fraction q)   # (n, B, p, p)
    z = Encoder(x * ~hidden)                                                      # (n, 1 + p*p [+ Lb], D)
    w_b, c_b = MLP(PE(pos_b))                                                     # weight row per band
    x_hat[k, b] = <LN(z_pixel k), w_b> + c_b                                      # (n, p*p, B)
    loss = mean over hidden (k, b) of (x_hat[k, b] - x[b, k])^2

The decoder's weights are generated from band positions, as the pixel embedding's are,
so the objective runs on any band count. Only the encoder's weights are kept
(``sciformer pretrain`` writes them; ``sciformer train --init-from`` starts from them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from sciformer.attention.layers import Mlp
from sciformer.attention.positional import SinusoidalPositionalEncoding
from sciformer.errors import ConfigError
from sciformer.spectral.models import SpectralSpatialTransformer


def hidden_groups(num_bands: int, group_size: int, ratio: float) -> tuple[int, int]:
    """``(G, h)``: the ``G = ceil(B / g)`` band groups and the ``h = round(ratio * G)`` of them hidden,
    at least one hidden and one kept when ``G >= 2``."""
    groups = -(-num_bands // group_size)
    return groups, min(max(round(ratio * groups), 1), max(groups - 1, 1))


def hidden_pixels(patch_size: int, ratio: float) -> int:
    """Pixels of a p x p patch hiding their whole spectrum: ``round(ratio * p * p)``, at most all but one."""
    return min(round(ratio * patch_size * patch_size), patch_size * patch_size - 1)


def band_group_mask(num_samples: int, num_bands: int, group_size: int, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Which bands each sample hides: ``round(ratio * G)`` of its ``G`` groups of ``group_size``
    neighbouring bands (at least one group hidden and one kept when ``G >= 2``).

    Shapes:
        output: (num_samples, num_bands) bool, True = hidden
    """
    groups, hidden = hidden_groups(num_bands, group_size, ratio)
    order = torch.rand(num_samples, groups, generator=generator).argsort(dim=1)  # (n, G)
    group_hidden = torch.zeros(num_samples, groups, dtype=torch.bool)
    group_hidden.scatter_(1, order[:, :hidden], True)  # (n, G)
    return group_hidden[:, torch.arange(num_bands) // group_size]  # (n, B)


def pixel_mask(num_samples: int, patch_size: int, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Which pixels of each patch hide their whole spectrum: ``round(ratio * p * p)`` of them
    (none when ``ratio`` is 0), so the encoder must fill them in from their neighbours.

    Shapes:
        output: (num_samples, p, p) bool, True = hidden
    """
    count = patch_size * patch_size
    hidden = hidden_pixels(patch_size, ratio)
    order = torch.rand(num_samples, count, generator=generator).argsort(dim=1)  # (n, p*p)
    out = torch.zeros(num_samples, count, dtype=torch.bool)
    out.scatter_(1, order[:, :hidden], True)  # (n, p*p)
    return out.reshape(num_samples, patch_size, patch_size)


class BandDecoder(nn.Module):
    """Predicts every band of a pixel from its token; weights generated from band positions.

    Shapes:
        tokens: (n, K, D), positions: (B,) -> (n, K, B)
    """

    def __init__(self, dim: int, pos_dim: int = 32, hidden_dim: int = 128) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.encode = SinusoidalPositionalEncoding(pos_dim)
        self.weight_mlp = Mlp(pos_dim, hidden_dim, dim + 1)  # weight row and bias of each band

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        params = self.weight_mlp(self.encode(positions.to(tokens.dtype)))  # (B, D + 1)
        weight, bias = params[:, :-1], params[:, -1]  # (B, D), (B,)
        return torch.einsum("nkd,bd->nkb", self.norm(tokens), weight) + bias  # (n, K, B)


class MaskedBandModelling(nn.Module):
    """The pre-training objective around a ``spectral_spatial`` model (see the module docstring).

    ``hidden``: (n, B) bands hidden in every pixel, or (n, B, p, p) values hidden one by one
    (band groups or'ed with whole pixels, :func:`pixel_mask`).

    Shapes:
        batch["patch"]: (n, B, p, p), hidden: (n, B) or (n, B, p, p) bool -> loss ()
    """

    def __init__(self, model: nn.Module, mask_ratio: float, group_size: int, pixel_ratio: float = 0.0) -> None:
        super().__init__()
        if not isinstance(model, SpectralSpatialTransformer):
            raise ConfigError(f"pretrain: masked-band pre-training needs model 'spectral_spatial', not {type(model).__name__}")
        if not 0.0 < mask_ratio < 1.0:
            raise ConfigError(f"pretrain --mask-ratio: expected a fraction in (0, 1), got {mask_ratio}")
        if group_size < 1:
            raise ConfigError(f"pretrain --band-group: expected a positive band count, got {group_size}")
        if not 0.0 <= pixel_ratio < 1.0:
            raise ConfigError(f"pretrain --pixel-ratio: expected a fraction in [0, 1), got {pixel_ratio}")
        self.model = model
        self.mask_ratio, self.group_size, self.pixel_ratio = float(mask_ratio), int(group_size), float(pixel_ratio)
        self.decoder = BandDecoder(model.cfg.dim, hidden_dim=model.cfg.spectral_hidden)

    def draw_hidden(self, num_samples: int, num_bands: int, patch_size: int, generator: torch.Generator) -> torch.Tensor:
        """This objective's hidden values for a batch: band groups in every pixel, or'ed with whole pixels.

        Shapes:
            output: (n, B) bool, or (n, B, p, p) when ``pixel_ratio`` > 0
        """
        hidden = band_group_mask(num_samples, num_bands, self.group_size, self.mask_ratio, generator)  # (n, B)
        if not self.pixel_ratio:
            return hidden
        return hidden[:, :, None, None] | pixel_mask(num_samples, patch_size, self.pixel_ratio, generator)[:, None]  # (n, B, p, p)

    def forward(self, batch: dict[str, Any], hidden: torch.Tensor) -> torch.Tensor:
        x = batch["patch"]  # (n, B, p, p)
        n, num_bands, p, _ = x.shape
        hidden = hidden.to(x.device)
        if hidden.ndim == 2:
            hidden = hidden[:, :, None, None].expand(-1, -1, p, p)  # (n, B, p, p): the same bands in every pixel
        z = self.model.encode({**batch, "patch": x.masked_fill(hidden, 0.0)})  # (n, T, D)
        band_pos = self.model.positions(batch, num_bands, x.device)  # (B,)
        recon = self.decoder(z[:, 1 : 1 + p * p], band_pos)  # (n, p*p, B)
        target = x.flatten(2).transpose(1, 2)  # (n, p*p, B)
        weight = hidden.flatten(2).transpose(1, 2).to(recon.dtype)  # (n, p*p, B)
        return ((recon - target).pow(2) * weight).sum() / weight.sum().clamp(min=1.0)
