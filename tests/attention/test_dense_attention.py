"""Dense multi-head attention against explicit and torch.nn oracles."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sciformer.attention.dense import (
    MultiHeadAttention,
    OutputProjection,
    QKVProjection,
    merge_heads,
    split_heads,
)
from sciformer.errors import ConfigError, DataError, SciformerError


def reference_attention(
    attn: MultiHeadAttention, x: torch.Tensor, bias: torch.Tensor | None = None, pad: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + bias) V, one head at a time, with explicit weights."""
    n, length, dim = x.shape
    h, d = attn.num_heads, attn.head_dim
    w, b = attn.qkv.qkv.weight, attn.qkv.qkv.bias
    q = x @ w[:dim].T + b[:dim]
    k = x @ w[dim : 2 * dim].T + b[dim : 2 * dim]
    v = x @ w[2 * dim :].T + b[2 * dim :]
    heads = []
    for i in range(h):
        sl = slice(i * d, (i + 1) * d)
        scores = q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(d)  # (n, L, L)
        if bias is not None:
            scores = scores + bias.expand(n, h, length, length)[:, i]
        if pad is not None:
            scores = scores.masked_fill(pad[:, None, :], float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[..., sl])
    y = torch.cat(heads, dim=-1)
    return y @ attn.out.proj.weight.T + attn.out.proj.bias


@pytest.fixture
def attn() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(16, num_heads=4).eval()


def test_matches_explicit_softmax(attn: MultiHeadAttention) -> None:
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(attn(x), reference_attention(attn, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 4, 7, 7), (4, 7, 7), (1, 1, 7, 7)])
def test_additive_bias_matches_reference(attn: MultiHeadAttention, shape: tuple[int, ...]) -> None:
    x = torch.randn(3, 7, 16)
    bias = torch.randn(shape)
    torch.testing.assert_close(attn(x, attn_bias=bias), reference_attention(attn, x, bias), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(attn(x, attn_bias=bias), attn(x), atol=1e-4)


def test_matches_torch_multihead_attention() -> None:
    torch.manual_seed(1)
    ours = MultiHeadAttention(24, num_heads=3).eval()
    ref = nn.MultiheadAttention(24, 3, batch_first=True).eval()
    with torch.no_grad():
        ours.qkv.qkv.weight.copy_(ref.in_proj_weight)
        ours.qkv.qkv.bias.copy_(torch.randn(72))
        ref.in_proj_bias.copy_(ours.qkv.qkv.bias)
        ours.out.proj.weight.copy_(ref.out_proj.weight)
        ours.out.proj.bias.copy_(torch.randn(24))
        ref.out_proj.bias.copy_(ours.out.proj.bias)
    x = torch.randn(2, 9, 24)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, 6:] = True
    pad[1, :2] = True
    expected, _ = ref(x, x, x, need_weights=False)
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
    expected, _ = ref(x, x, x, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(ours(x, key_padding_mask=pad), expected, rtol=1e-5, atol=1e-5)


def test_key_padding_mask_hides_keys(attn: MultiHeadAttention) -> None:
    x = torch.randn(2, 8, 16)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[:, 5:] = True
    y = attn(x, key_padding_mask=pad)
    x2 = x.clone()
    x2[:, 5:] = 100 * torch.randn(2, 3, 16)  # change only the padded tokens
    y2 = attn(x2, key_padding_mask=pad)
    torch.testing.assert_close(y[:, :5], y2[:, :5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, reference_attention(attn, x, pad=pad), rtol=1e-5, atol=1e-5)


def test_mask_and_bias_combine(attn: MultiHeadAttention) -> None:
    x = torch.randn(2, 6, 16)
    bias = torch.randn(4, 6, 6)
    pad = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    expected = reference_attention(attn, x, bias, pad)
    torch.testing.assert_close(attn(x, attn_bias=bias, key_padding_mask=pad), expected, rtol=1e-5, atol=1e-5)


def test_bad_masks_raise(attn: MultiHeadAttention) -> None:
    x = torch.randn(2, 5, 16)
    with pytest.raises(DataError, match="key_padding_mask"):
        attn(x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool))  # a row with no key left
    with pytest.raises(DataError, match="key_padding_mask"):
        attn(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(DataError, match="key_padding_mask"):
        attn(x, key_padding_mask=torch.zeros(2, 5))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ConfigError, match="num_heads"):
        MultiHeadAttention(10, num_heads=3)
    with pytest.raises(SciformerError, match="dim"):
        MultiHeadAttention(0, num_heads=1)
    with pytest.raises(DataError, match=r"x: expected shape \(n, L, 16\)"):
        MultiHeadAttention(16, 4)(torch.randn(2, 5, 8))


def test_gradcheck_double() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(4, num_heads=2).double()
    x = torch.randn(2, 3, 4, dtype=torch.double, requires_grad=True)
    bias = torch.randn(2, 3, 3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: attn(a, attn_bias=b), (x, bias))


def test_parameters_receive_gradients(attn: MultiHeadAttention) -> None:
    attn(torch.randn(2, 5, 16)).pow(2).sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None, name
        part = p.grad[: 16] if name == "qkv.qkv.bias" else p.grad  # the key bias [16:32] is held still
        assert part.abs().sum() > 0, name


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, attn_drop=0.5, proj_drop=0.5)
    x = torch.randn(2, 6, 16)
    attn.eval()
    torch.testing.assert_close(attn(x), attn(x))
    attn.train()
    assert not torch.allclose(attn(x), attn(x))


def test_projection_modules_and_heads() -> None:
    proj = QKVProjection(12)
    q, k, v = proj(torch.randn(5, 4, 12))
    assert q.shape == k.shape == v.shape == (5, 4, 12)
    q2, _, _ = proj(torch.randn(7, 12))  # any leading shape (the neighbourhood form uses (N, C))
    assert q2.shape == (7, 12)
    assert OutputProjection(12)(torch.randn(3, 12)).shape == (3, 12)
    x = torch.randn(2, 5, 12)
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    torch.testing.assert_close(heads[:, 1], x[..., 4:8])
    torch.testing.assert_close(merge_heads(heads), x)


def test_attention_dropout_beyond_the_available_memory_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout makes SDPA build (n, H, L, L) weights on CPU (without it, O(L) memory): a size the
    system cannot hold is a MemoryError before the kernel's OOM killer would end the process."""
    from sciformer.attention import dense

    attn = dense.MultiHeadAttention(8, 2, attn_drop=0.1).train()
    x = torch.randn(4, 1024, 8)  # 4 blocks of 4 x 2 x 1024 x 1024 floats: 128 MiB
    monkeypatch.setattr(dense, "available_memory", lambda: 50 * 2**20)
    with pytest.raises(MemoryError, match=r"Tried to allocate 134217728 bytes: attention dropout over 1024 tokens"):
        attn(x)
    attn.eval()
    assert attn(x).shape == (4, 1024, 8)  # no dropout: no weights built, nothing refused
    attn.train()
    monkeypatch.setattr(dense, "available_memory", lambda: 200 * 2**20)
    assert attn(x).shape == (4, 1024, 8)


@pytest.mark.parametrize("how", ["itself", "deepcopy", "assign"])
def test_the_key_bias_never_moves_under_adam(how: str) -> None:
    """Softmax ignores a key bias, so its gradient is kept exactly 0 (rounding noise would become
    Adam steps), also for a deep copy and for weights loaded with ``assign=True``."""
    import copy

    torch.manual_seed(0)
    attn = MultiHeadAttention(16, num_heads=4)
    if how == "deepcopy":
        attn = copy.deepcopy(attn)
    elif how == "assign":
        fresh = MultiHeadAttention(16, num_heads=4)
        fresh.load_state_dict({k: v.clone() for k, v in attn.state_dict().items()}, assign=True)
        attn = fresh
    key_bias, query_bias = attn.qkv.qkv.bias[16:32].detach().clone(), attn.qkv.qkv.bias[:16].detach().clone()
    opt = torch.optim.Adam(attn.parameters(), lr=1e-2)
    for _ in range(5):
        opt.zero_grad()
        attn(torch.randn(2, 7, 16)).pow(2).sum().backward()
        assert torch.equal(attn.qkv.qkv.bias.grad[16:32], torch.zeros(16))
        opt.step()
    assert torch.equal(attn.qkv.qkv.bias[16:32].detach(), key_bias)
    assert not torch.equal(attn.qkv.qkv.bias[:16].detach(), query_bias)  # the query bias does learn
