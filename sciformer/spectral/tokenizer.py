"""Group-wise spectral embedding: neighbouring bands of a patch become one token."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from sciformer.attention.layers import Mlp
from sciformer.attention.positional import SinusoidalPositionalEncoding
from sciformer.errors import ConfigError, DataError

PadMode = Literal["replicate", "zeros"]


def band_groups(
    num_bands: int, group_size: int, stride: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Band indices of every token's group, with the spectral ends padded.

    Windows of ``group_size`` bands start every ``stride`` bands, beginning
    ``pad = (group_size - stride) // 2`` bands before band 0 (so with stride 1 and an odd
    group, token ``t`` is centred on band ``t``), and continue until the last band is
    covered. Returns ``(index, valid)``: ``index`` (L, g) int64 clamped into
    ``[0, B)`` and ``valid`` (L, g) bool, ``False`` where the window lies in the padding.
    ``L = ceil((B + 2 pad - g) / stride) + 1`` (at least 1).
    """
    if num_bands <= 0:
        raise DataError(f"num_bands: expected a positive band count, got {num_bands}")
    pad = max(group_size - stride, 0) // 2
    length = max(math.ceil((num_bands + 2 * pad - group_size) / stride), 0) + 1
    start = torch.arange(length, device=device) * stride - pad  # (L,)
    index = start[:, None] + torch.arange(group_size, device=device)  # (L, g)
    valid = (index >= 0) & (index < num_bands)  # (L, g)
    return index.clamp(0, num_bands - 1), valid


class SpectralTokenizer(nn.Module):
    """SpectralFormer's group-wise spectral embedding, for any band count.

    A patch ``x`` (B bands, p x p pixels) is cut along the spectrum into overlapping
    groups of ``g`` neighbouring bands (see :func:`band_groups`); group ``t`` over the
    whole p x p window is flattened and embedded::

        token_t = W vec(x[G_t, :, :]) + b,    W: (D, g p p)

    Padding bands repeat the edge band (``pad_mode="replicate"``) or are zero. The
    weights never depend on ``B``, so one model accepts any band count (full spectra,
    PCA components, another sensor). The position of token ``t`` is the mean band index
    of the real bands in its group, or their mean wavelength when ``wavelengths`` is given.

    Shapes:
        x: (n, B, p, p)
        wavelengths: (B,) (optional, e.g. nm)
        output: tokens (n, L, D), positions (L,)
    """

    def __init__(
        self,
        group_size: int = 3,
        stride: int = 1,
        patch_size: int = 7,
        dim: int = 64,
        pad_mode: PadMode = "replicate",
        bias: bool = True,
    ) -> None:
        super().__init__()
        if group_size <= 0:
            raise ConfigError(f"group_size: expected a positive integer, got {group_size}")
        if not 0 < stride <= group_size:
            raise ConfigError(
                f"stride: expected an integer in [1, group_size={group_size}] so every band is covered, got {stride}"
            )
        if patch_size <= 0:
            raise ConfigError(f"patch_size: expected a positive integer, got {patch_size}")
        if pad_mode not in ("replicate", "zeros"):
            raise ConfigError(f"pad_mode: expected 'replicate' or 'zeros', got {pad_mode!r}")
        self.group_size = group_size
        self.stride = stride
        self.patch_size = patch_size
        self.dim = dim
        self.pad_mode = pad_mode
        self.proj = nn.Linear(group_size * patch_size * patch_size, dim, bias=bias)

    def num_tokens(self, num_bands: int) -> int:
        """Number of tokens ``L`` produced for ``num_bands`` bands."""
        return band_groups(num_bands, self.group_size, self.stride)[0].shape[0]

    def forward(self, x: torch.Tensor, wavelengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.patch_size
        if x.ndim != 4 or tuple(x.shape[-2:]) != (p, p):
            raise DataError(f"x: expected patches of shape (n, B, {p}, {p}), got {tuple(x.shape)}")
        num_bands = x.shape[1]
        if wavelengths is not None and tuple(wavelengths.shape) != (num_bands,):
            raise DataError(
                f"wavelengths: expected shape ({num_bands},) to match the bands of x, got {tuple(wavelengths.shape)}"
            )
        index, valid = band_groups(num_bands, self.group_size, self.stride, x.device)  # (L, g), (L, g)
        groups = x[:, index]  # (n, L, g, p, p)
        if self.pad_mode == "zeros" and not bool(valid.all()):
            groups = groups * valid[None, :, :, None, None].to(x.dtype)  # (n, L, g, p, p)
        tokens = self.proj(groups.flatten(2))  # (n, L, D)
        band_pos = index.to(x.dtype) if wavelengths is None else wavelengths.to(x.dtype)[index]  # (L, g)
        w = valid.to(x.dtype)  # (L, g)
        positions = (band_pos * w).sum(dim=1) / w.sum(dim=1)  # (L,)
        return tokens, positions

    def extra_repr(self) -> str:
        return (
            f"group_size={self.group_size}, stride={self.stride}, patch_size={self.patch_size}, "
            f"dim={self.dim}, pad_mode={self.pad_mode!r}"
        )


class SpectralPixelEmbedding(nn.Module):
    """Per-pixel spectral embedding whose weights are generated from band positions.

    A band-count-agnostic ``Linear(B, D)`` applied to every pixel's spectrum: the weight
    row of band ``b`` is produced by an MLP from the sinusoidal encoding of its position
    ``pos_b`` (band index or wavelength), in the spirit of wavelength-conditioned dynamic
    weight generators::

        w_b = MLP(PE(pos_b))                              # (D,)
        e[h, w] = (1 / B) sum_b x[b, h, w] w_b + c        # (D,)

    so the same parameters embed any number of bands (200 raw bands, 30 PCA components).

    Shapes:
        x: (n, B, p, p), positions: (B,) -> (n, p, p, D)
    """

    def __init__(self, dim: int, pos_dim: int = 32, hidden_dim: int = 128, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.encode = SinusoidalPositionalEncoding(pos_dim, base=base)
        self.weight_mlp = Mlp(pos_dim, hidden_dim, dim)  # Linear -> GELU -> Linear
        self.bias = nn.Parameter(torch.zeros(dim))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        old = {"weight_mlp.0.": "weight_mlp.fc1.", "weight_mlp.2.": "weight_mlp.fc2."}  # layout before 0.2
        for key in [k for k in state_dict if k.startswith(prefix)]:
            for a, b in old.items():
                if key.startswith(prefix + a):
                    state_dict[prefix + b + key[len(prefix + a) :]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4:
            raise DataError(f"x: expected patches of shape (n, B, p, p), got {tuple(x.shape)}")
        if tuple(positions.shape) != (x.shape[1],):
            raise DataError(
                f"positions: expected shape ({x.shape[1]},) to match the bands of x, got {tuple(positions.shape)}"
            )
        weight = self.weight_mlp(self.encode(positions.to(x.dtype)))  # (B, D)
        e = torch.einsum("nbhw,bd->nhwd", x, weight) / x.shape[1]  # (n, p, p, D)
        return e + self.bias  # (n, p, p, D)
