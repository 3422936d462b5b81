"""Group-wise spectral tokens and the band-agnostic pixel embedding."""

from __future__ import annotations

import pytest
import torch

from sciformer.errors import ConfigError, DataError
from sciformer.spectral.tokenizer import (
    SpectralPixelEmbedding,
    SpectralTokenizer,
    band_groups,
)


def test_band_groups_centred_with_stride_one() -> None:
    index, valid = band_groups(6, group_size=3, stride=1)
    assert index.tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 5]]
    assert valid[0].tolist() == [False, True, True] and valid[-1].tolist() == [True, True, False]
    assert bool(valid[1:-1].all())


def test_band_groups_non_overlapping() -> None:
    index, valid = band_groups(10, group_size=4, stride=4)
    assert index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 9, 9]]
    assert valid.sum().item() == 10


@pytest.mark.parametrize("num_bands", [1, 2, 5, 30, 103, 200])
@pytest.mark.parametrize(("group", "stride"), [(1, 1), (3, 1), (3, 2), (5, 2), (4, 4), (7, 3)])
def test_band_groups_cover_every_band(num_bands: int, group: int, stride: int) -> None:
    index, valid = band_groups(num_bands, group, stride)
    covered = torch.zeros(num_bands, dtype=torch.bool)
    covered[index[valid]] = True
    assert bool(covered.all())
    assert bool(valid.any(dim=1).all())  # no token made of padding only
    assert index.min() >= 0 and index.max() < num_bands


def test_one_tokenizer_any_band_count() -> None:
    tok = SpectralTokenizer(group_size=3, stride=1, patch_size=5, dim=16)
    n_params = sum(p.numel() for p in tok.parameters())
    assert n_params == 3 * 5 * 5 * 16 + 16
    for num_bands in (30, 103, 144, 200):
        tokens, pos = tok(torch.randn(2, num_bands, 5, 5))
        assert tokens.shape == (2, num_bands, 16) == (2, tok.num_tokens(num_bands), 16)
        assert pos.shape == (num_bands,)
    tok2 = SpectralTokenizer(group_size=4, stride=4, patch_size=5, dim=16)
    tokens, _ = tok2(torch.randn(2, 30, 5, 5))
    assert tokens.shape == (2, 8, 16)


def test_token_is_linear_map_of_its_group() -> None:
    torch.manual_seed(0)
    tok = SpectralTokenizer(group_size=3, stride=1, patch_size=3, dim=8)
    x = torch.randn(2, 10, 3, 3)
    tokens, _ = tok(x)
    for t in (1, 4, 8):
        expected = tok.proj(x[:, t - 1 : t + 2].reshape(2, -1))
        torch.testing.assert_close(tokens[:, t], expected)
    edge = torch.cat([x[:, :1], x[:, :2]], dim=1)  # replicate padding at the low end
    torch.testing.assert_close(tokens[:, 0], tok.proj(edge.reshape(2, -1)))


@pytest.mark.parametrize("pad_mode", ["replicate", "zeros"])
@pytest.mark.parametrize(("group", "stride"), [(3, 1), (5, 2), (4, 4)])
def test_token_depends_only_on_its_bands(pad_mode: str, group: int, stride: int) -> None:
    torch.manual_seed(0)
    tok = SpectralTokenizer(group, stride, patch_size=3, dim=8, pad_mode=pad_mode)
    num_bands = 13
    index, valid = band_groups(num_bands, group, stride)
    x = torch.randn(2, num_bands, 3, 3)
    base, _ = tok(x)
    for band in (0, 6, num_bands - 1):
        x2 = x.clone()
        x2[:, band] += 5.0
        changed = (tok(x2)[0] - base).abs().amax(dim=(0, 2)) > 1e-6  # (L,)
        members = index == band
        if pad_mode == "zeros":
            members &= valid
        assert changed.tolist() == members.any(dim=1).tolist()


def test_zero_padding_ignores_padded_slots() -> None:
    torch.manual_seed(0)
    tok = SpectralTokenizer(3, 1, patch_size=1, dim=4, pad_mode="zeros")
    x = torch.randn(1, 5, 1, 1)
    tokens, _ = tok(x)
    expected = tok.proj(torch.stack([torch.zeros(()), x[0, 0, 0, 0], x[0, 1, 0, 0]])[None])
    torch.testing.assert_close(tokens[:, 0], expected)


def test_positions_mean_index_or_wavelength() -> None:
    tok = SpectralTokenizer(3, 1, patch_size=1, dim=4)
    _, pos = tok(torch.randn(1, 5, 1, 1))
    torch.testing.assert_close(pos, torch.tensor([0.5, 1.0, 2.0, 3.0, 3.5]))
    wl = torch.tensor([400.0, 410.0, 430.0, 460.0, 500.0])
    _, pos = tok(torch.randn(1, 5, 1, 1), wl)
    torch.testing.assert_close(pos, torch.tensor([405.0, 413.3333, 433.3333, 463.3333, 480.0]))
    tok4 = SpectralTokenizer(4, 4, patch_size=1, dim=4)
    _, pos = tok4(torch.randn(1, 10, 1, 1))
    torch.testing.assert_close(pos, torch.tensor([1.5, 5.5, 8.5]))


def test_tokenizer_gradients() -> None:
    tok = SpectralTokenizer(3, 1, patch_size=3, dim=4).double()
    x = torch.randn(2, 6, 3, 3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: tok(a)[0], (x,))


def test_tokenizer_bad_input() -> None:
    with pytest.raises(ConfigError, match="stride"):
        SpectralTokenizer(3, 4)
    with pytest.raises(ConfigError, match="group_size"):
        SpectralTokenizer(0, 1)
    with pytest.raises(ConfigError, match="pad_mode"):
        SpectralTokenizer(3, 1, pad_mode="reflect")  # type: ignore[arg-type]
    tok = SpectralTokenizer(3, 1, patch_size=5, dim=4)
    with pytest.raises(DataError, match=r"x: expected patches of shape \(n, B, 5, 5\)"):
        tok(torch.randn(2, 10, 7, 7))
    with pytest.raises(DataError, match="wavelengths"):
        tok(torch.randn(2, 10, 5, 5), torch.arange(9.0))


def test_pixel_embedding_is_band_position_linear_map() -> None:
    torch.manual_seed(0)
    emb = SpectralPixelEmbedding(dim=8, pos_dim=16, hidden_dim=12)
    for num_bands in (30, 200):
        x = torch.randn(2, num_bands, 3, 3)
        pos = torch.arange(num_bands, dtype=torch.float32)
        out = emb(x, pos)
        assert out.shape == (2, 3, 3, 8)
        weight = emb.weight_mlp(emb.encode(pos))  # (B, D)
        expected = (x[:, :, 1, 2] @ weight) / num_bands + emb.bias
        torch.testing.assert_close(out[:, 1, 2], expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(DataError, match="positions"):
        emb(torch.randn(2, 5, 3, 3), torch.arange(4.0))
