"""Dense multi-head attention over a token sequence.

The projections are split into two small modules shared by every attention form:
:class:`QKVProjection` (one fused ``Linear`` producing queries, keys and values) and
:class:`OutputProjection` (``Linear`` + dropout). The dense form combines them with
:func:`torch.nn.functional.scaled_dot_product_attention`, which dispatches to the
flash / memory-efficient kernels on GPU; the neighbourhood form combines the same
projections with a gather over a neighbour index.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sciformer.errors import ConfigError, DataError
from sciformer.utils.limits import available_memory


def _check_heads(dim: int, num_heads: int) -> None:
    if dim <= 0:
        raise ConfigError(f"dim: expected a positive integer, got {dim}")
    if num_heads <= 0 or dim % num_heads != 0:
        raise ConfigError(f"num_heads: expected a positive divisor of dim={dim}, got {num_heads}")


class QKVProjection(nn.Module):
    """Fused query/key/value projection ``[q, k, v] = x W^T + b``, ``W`` of shape (3D, D).

    The fused weight is laid out like ``torch.nn.MultiheadAttention.in_proj_weight``
    (rows ``[W_q; W_k; W_v]``), so weights copy over one to one. ``still_key_bias``: the key
    part of the bias gets no gradient (for softmax attention, which ignores a key bias:
    ``q.b_k`` is the same for every key, so its gradient is 0 up to rounding, which Adam
    would turn into steps). The bias is used detached in the forward pass itself, so the rule
    survives ``copy.deepcopy`` and ``load_state_dict(assign=True)``.

    Shapes:
        x: (..., D) -> q, k, v: each (..., D)
    """

    still_key_bias = False  # class default: a module pickled before the attribute existed

    def __init__(self, dim: int, bias: bool = True, still_key_bias: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.still_key_bias = still_key_bias
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = self.qkv.bias
        if b is not None and self.still_key_bias:
            d = self.dim
            b = torch.cat([b[:d], b[d : 2 * d].detach(), b[2 * d :]])  # (3D,) the same values
        q, k, v = F.linear(x, self.qkv.weight, b).chunk(3, dim=-1)  # each (..., D)
        return q, k, v


class OutputProjection(nn.Module):
    """Output projection ``y = Dropout(x W^T + b)`` after attention.

    Shapes:
        x: (..., D) -> (..., D)
    """

    def __init__(self, dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(x))  # (..., D)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(n, L, D) -> (n, H, L, D / H)``."""
    n, length, dim = x.shape
    return x.view(n, length, num_heads, dim // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(n, H, L, d) -> (n, L, H * d)``."""
    n, h, length, d = x.shape
    return x.transpose(1, 2).reshape(n, length, h * d)


def build_attention_bias(
    attn_bias: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    n: int,
    length: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Combine an additive bias and a key padding mask into one float ``attn_mask``.

    ``attn_bias`` is broadcastable to (n, H, L, L); ``key_padding_mask`` is bool (n, L)
    with ``True`` marking keys to ignore (the ``torch.nn.MultiheadAttention`` convention).
    Returns ``None`` when neither is given.
    """
    if key_padding_mask is None:
        return None if attn_bias is None else attn_bias.to(dtype)
    if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (n, length):
        raise DataError(
            f"key_padding_mask: expected a bool tensor of shape ({n}, {length}), "
            f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )
    if bool(key_padding_mask.all(dim=-1).any()):
        raise DataError("key_padding_mask: every sequence needs at least one unmasked key")
    mask = key_padding_mask[:, None, None, :]  # (n, 1, 1, L)
    if attn_bias is None:
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    else:
        bias = attn_bias.to(dtype)
    return bias.masked_fill(mask, float("-inf"))  # broadcast (n, H|1, L|1, L)


# (n, H, L, L) blocks at the peak of a forward + backward with dropout on CPU: 4.03-4.06 for blocks of 256-512 MiB,
# 4.3 at 32 MiB, more below, where fixed costs weigh (benchmarks/bench_attention_dropout_memory.py)
DROPOUT_WEIGHT_BLOCKS = 4


def check_dropout_weights_fit(n: int, heads: int, length: int, element_size: int) -> None:
    """With attention dropout, SDPA on CPU builds the (n, H, L, L) weights (about
    :data:`DROPOUT_WEIGHT_BLOCKS` such blocks at once, with the backward pass; without dropout
    it works in O(L) memory). Where they exceed the memory available to the process (the system's,
    or a container's limit: :func:`~sciformer.utils.limits.available_memory`), raise MemoryError
    (one line from the command line) instead of letting the out-of-memory killer end the process
    silently. Blocks of later layers held for the backward pass are not counted: a bound, not a
    budget."""
    need = DROPOUT_WEIGHT_BLOCKS * n * heads * length * length * element_size
    if need < 2**26:  # 64 MiB: not worth reading /proc/meminfo each call
        return
    free = available_memory()
    if free is not None and need > free:
        raise MemoryError(f"Tried to allocate {need} bytes: attention dropout over {length} tokens builds "
                          f"({n}, {heads}, {length}, {length}) weights, beyond the {free} bytes available")


class MultiHeadAttention(nn.Module):
    """Dense multi-head scaled dot-product attention (Vaswani et al. 2017).

    For each head ``h`` with ``d = D / H``::

        A_h = softmax(Q_h K_h^T / sqrt(d) + bias_h)      # bias: relative positions, -inf masks
        y   = Dropout(concat_h(A_h V_h) W_o^T + b_o)

    computed with :func:`torch.nn.functional.scaled_dot_product_attention`.

    Args:
        dim: token width ``D``.
        num_heads: number of heads ``H`` (divides ``D``).
        qkv_bias: learn a bias in the fused Q/K/V projection.
        attn_drop: dropout on the attention weights (training only).
        proj_drop: dropout after the output projection.

    Shapes:
        x: (n, L, D)
        attn_bias: broadcastable to (n, H, L, L), additive (optional)
        key_padding_mask: (n, L) bool, ``True`` = ignore this key (optional)
        output: (n, L, D)
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        _check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_drop = float(attn_drop)
        self.qkv = QKVProjection(dim, bias=qkv_bias, still_key_bias=True)  # softmax ignores a key bias
        self.out = OutputProjection(dim, dropout=proj_drop)

    def forward(
        self,
        x: torch.Tensor,
        attn_bias: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise DataError(f"x: expected shape (n, L, {self.dim}), got {tuple(x.shape)}")
        n, length, _ = x.shape
        q, k, v = (split_heads(t, self.num_heads) for t in self.qkv(x))  # each (n, H, L, d)
        mask = build_attention_bias(attn_bias, key_padding_mask, n, length, q.dtype)
        dropout = self.attn_drop if self.training else 0.0
        if dropout > 0 and q.device.type == "cpu":
            check_dropout_weights_fit(n, self.num_heads, length, q.element_size())
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)  # (n, H, L, d)
        return self.out(merge_heads(y))  # (n, L, D)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, attn_drop={self.attn_drop}"
