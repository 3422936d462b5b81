"""Pre-norm residual blocks, encoders and cross-layer fusion."""

from __future__ import annotations

import pytest
import torch

from sciformer.attention.transformer import (
    CrossLayerFusion,
    TransformerBlock,
    TransformerEncoder,
)
from sciformer.errors import ConfigError


def test_block_is_prenorm_residual() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, mlp_ratio=2.0).train()  # no dropout: deterministic even in training
    x = torch.randn(3, 5, 16)
    h = x + block.attn(block.norm1(x))
    expected = h + block.mlp(block.norm2(h))
    torch.testing.assert_close(block(x), expected)
    assert block.mlp.fc1.out_features == 32


def test_zero_branches_give_identity() -> None:
    block = TransformerBlock(8, 2, drop_path=0.5)
    with torch.no_grad():
        for lin in (block.attn.out.proj, block.mlp.fc2):
            lin.weight.zero_()
            lin.bias.zero_()
    x = torch.randn(4, 3, 8)
    torch.testing.assert_close(block.train()(x), x)
    torch.testing.assert_close(block.eval()(x), x)


def test_eval_is_deterministic_with_all_dropouts() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, drop=0.3, attn_drop=0.3, drop_path=0.3).eval()
    x = torch.randn(4, 6, 16)
    torch.testing.assert_close(block(x), block(x))
    block.train()
    assert not torch.allclose(block(x), block(x))


def test_drop_path_drops_whole_samples() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, drop_path=0.5)
    with torch.no_grad():  # keep only the attention branch
        block.mlp.fc2.weight.zero_()
        block.mlp.fc2.bias.zero_()
    x = torch.randn(64, 3, 8)
    branch = block.eval().attn(block.norm1(x))  # (64, 3, 8)
    y = block.train()(x)
    dropped = torch.isclose(y, x, atol=1e-6).flatten(1).all(1)
    kept = torch.isclose(y, x + branch / 0.5, atol=1e-5).flatten(1).all(1)
    assert bool((dropped ^ kept).all())  # each sample: branch fully dropped or fully kept (rescaled)
    assert 10 < int(dropped.sum()) < 54


def test_block_passes_bias_and_mask() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(8, 2).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.tensor([[False, False, False, True, True]] * 2)
    x2 = x.clone()
    x2[:, 3:] += 10
    torch.testing.assert_close(block(x, key_padding_mask=pad)[:, :3], block(x2, key_padding_mask=pad)[:, :3])
    bias = torch.randn(2, 5, 5)
    assert not torch.allclose(block(x, attn_bias=bias), block(x))


def test_encoder_drop_path_schedule_and_outputs() -> None:
    torch.manual_seed(0)
    enc = TransformerEncoder(16, depth=4, num_heads=4, drop_path=0.3).eval()
    rates = [b.drop_path.drop_prob for b in enc.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    x = torch.randn(2, 7, 16)
    outs = enc(x, return_all=True)
    assert isinstance(outs, list) and len(outs) == 4
    torch.testing.assert_close(outs[-1], enc(x))
    h = x
    for i, block in enumerate(enc.blocks):
        h = block(h)
        torch.testing.assert_close(outs[i], enc.norm(h))


@pytest.mark.parametrize("mode", ["linear", "gate"])
def test_fusion_starts_as_plain_encoder(mode: str) -> None:
    torch.manual_seed(0)
    plain = TransformerEncoder(8, depth=4, num_heads=2).eval()
    fused = TransformerEncoder(8, depth=4, num_heads=2, fusion=mode).eval()
    assert len(fused.fusions) == 2
    fused.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(fused(x), plain(x))
    # once trained away from the identity, block 3 sees block 0's input
    with torch.no_grad():
        if mode == "linear":
            fused.fusions[0].linear.weight[:, 8:].normal_(std=0.3)
        else:
            fused.fusions[0].gate.fill_(1.0)
    assert not torch.allclose(fused(x), plain(x))
    fused(x).sum().backward()
    assert all(p.grad is not None for p in fused.fusions.parameters())


def test_fusion_formulas() -> None:
    x, s = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    lin = CrossLayerFusion(6, "linear")
    torch.testing.assert_close(lin(x, s), x)
    gate = CrossLayerFusion(6, "gate")
    with torch.no_grad():
        gate.gate.copy_(torch.arange(6.0))
    torch.testing.assert_close(gate(x, s), x + torch.arange(6.0) * s)
    # no parameter depends on the number of tokens
    assert CrossLayerFusion(6, "linear")(torch.randn(2, 50, 6), torch.randn(2, 50, 6)).shape == (2, 50, 6)


def test_fusion_not_needed_for_shallow_encoders() -> None:
    assert len(TransformerEncoder(8, depth=2, num_heads=2, fusion="linear").fusions) == 0


def test_encoder_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="depth"):
        TransformerEncoder(8, depth=0, num_heads=2)
    with pytest.raises(ConfigError, match="drop_path"):
        TransformerEncoder(8, depth=2, num_heads=2, drop_path=1.0)
    with pytest.raises(ConfigError, match="fusion"):
        TransformerEncoder(8, depth=3, num_heads=2, fusion="concat")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mlp_ratio"):
        TransformerBlock(8, 2, mlp_ratio=0)
