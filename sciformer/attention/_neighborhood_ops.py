"""Memory-bounded autograd functions behind :mod:`sciformer.attention.neighborhood`.

Every function here works on a neighbour index ``idx`` of shape (N, k) into M source
points and never holds an (N, k, C) tensor for more than one chunk of points. The forward
pass runs chunk by chunk; the backward pass recomputes each chunk's edge tensors from
per-point inputs and accumulates gradients (gathered inputs through ``index_add_``).

- :class:`ChunkedEdgeMap` is generic: any per-chunk function, differentiated with autograd
  inside the backward pass (used for LayerNorm, custom attention MLPs, scalar attention).
- ``_neighborhood_fused`` holds the hand-written fast path of the Point Transformer v1
  vector attention with BatchNorm, built from the helpers here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

ChunkFn = Callable[[list[Tensor], list[Tensor], list[Tensor]], Tensor]


def auto_chunk_size(num_points: int, k: int, channels: int, budget: int = 1 << 20) -> int:
    """Points per chunk so that one chunk's (n, k, C) tensor holds about ``budget`` values."""
    return max(1, min(num_points, budget // max(1, k * channels)))


def chunk_ranges(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + chunk)) for s in range(0, n, chunk)]


def _gather(src: Tensor, idx: Tensor) -> Tensor:
    """``src[idx]`` for idx (n, k): (M, *F) -> (n, k, *F)."""
    n, k = idx.shape
    return src.index_select(0, idx.reshape(-1)).view(n, k, *src.shape[1:])


class ChunkedEdgeMap(torch.autograd.Function):
    """Apply ``fn`` chunk by chunk over points; recompute chunks in the backward pass.

    ``fn(rows, gathered, params)`` maps one chunk of n points to an (n, ...) tensor, where
    ``rows`` are row slices [s:e] of the per-point inputs (N, ...), ``gathered`` are the
    source inputs (M, F) gathered by the chunk's index (n, k, F) and ``params`` are whole
    tensors (weights). Only the inputs are saved; (n, k, C) edge tensors live one chunk at
    a time in forward and backward.

    Shapes:
        idx: (N, k) int64; rows: (N, ...); gathered: (M, F); output: (N, ...)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        fn: ChunkFn,
        idx: Tensor,
        chunk: int,
        n_rows: int,
        n_gathered: int,
        *tensors: Tensor,
    ) -> Tensor:
        rows = list(tensors[:n_rows])
        gathered = list(tensors[n_rows : n_rows + n_gathered])
        params = list(tensors[n_rows + n_gathered :])
        n = idx.shape[0]
        out: Tensor | None = None
        for s, e in chunk_ranges(n, chunk):
            ic = idx[s:e]
            y = fn([r[s:e] for r in rows], [_gather(g, ic) for g in gathered], params)
            if out is None:
                out = y.new_empty((n, *y.shape[1:]))
            out[s:e] = y
        assert out is not None
        ctx.fn, ctx.chunk, ctx.n_rows, ctx.n_gathered = fn, chunk, n_rows, n_gathered
        ctx.save_for_backward(idx, *tensors)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        idx, *tensors = ctx.saved_tensors
        nr, ng = ctx.n_rows, ctx.n_gathered
        needs = ctx.needs_input_grad[5:]
        grads: list[Tensor | None] = [
            (torch.zeros_like(t) if need else None) for t, need in zip(tensors, needs)
        ]
        grad_out = grad_out.contiguous()
        for s, e in chunk_ranges(idx.shape[0], ctx.chunk):
            ic = idx[s:e]
            flat = ic.reshape(-1)
            with torch.enable_grad():
                inputs: list[Tensor] = []
                for i, t in enumerate(tensors):
                    if i < nr:
                        v = t[s:e]
                    elif i < nr + ng:
                        v = _gather(t, ic)
                    else:
                        v = t
                    inputs.append(v.detach().requires_grad_(needs[i]))
                y = ctx.fn(inputs[:nr], inputs[nr : nr + ng], inputs[nr + ng :])
                wanted = [i for i in range(len(inputs)) if needs[i]]
                if not wanted or not y.requires_grad:
                    continue
                gs = torch.autograd.grad(
                    y, [inputs[i] for i in wanted], grad_out[s:e], allow_unused=True
                )
            for i, g in zip(wanted, gs):
                if g is None:
                    continue
                acc = grads[i]
                assert acc is not None
                if i < nr:
                    acc[s:e] = g
                elif i < nr + ng:
                    acc.index_add_(0, flat, g.reshape(-1, *acc.shape[1:]))
                else:
                    acc.add_(g)
        return (None, None, None, None, None, *grads)


def chunked_edge_map(
    fn: ChunkFn,
    idx: Tensor,
    rows: Sequence[Tensor],
    gathered: Sequence[Tensor],
    params: Sequence[Tensor],
    chunk: int,
) -> Tensor:
    """Functional entry point of :class:`ChunkedEdgeMap` (see there)."""
    return ChunkedEdgeMap.apply(
        fn, idx, int(chunk), len(rows), len(gathered), *rows, *gathered, *params
    )


class Workspace:
    """Reusable per-chunk buffers: fresh (n, k, C) allocations each chunk cost page faults."""

    def __init__(self, like: Tensor) -> None:
        self._like = like
        self._bufs: dict[str, Tensor] = {}

    def get(self, name: str, *shape: int) -> Tensor:
        numel = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < numel:
            buf = self._like.new_empty(numel)
            self._bufs[name] = buf
        return buf[:numel].view(shape)


def gather_into(out: Tensor, src: Tensor, idx: Tensor) -> Tensor:
    """``src[idx]`` written into ``out`` (n*k, F); returns it."""
    return torch.index_select(src, 0, idx.reshape(-1), out=out)


def relu_backward(grad: Tensor, out: Tensor, buf: Tensor) -> Tensor:
    """``grad * (out > 0)`` in one fused pass, written into ``buf``."""
    return torch.ops.aten.threshold_backward.grad_input(grad, out, 0, grad_input=buf)


def relu_pre(
    ws: Workspace, A: Tensor, B: Tensor, P: Tensor, Wa_t: Tensor, ic: Tensor, s: int, e: int
) -> Tensor:
    """ReLU(A[idx] - B_i + P Wa^T) for one chunk, in a workspace buffer (n*k, C)."""
    n, k = ic.shape
    c = A.shape[1]
    pre = gather_into(ws.get("pre", n * k, c), A, ic)  # (n*k, C)
    pre.view(n, k, c).sub_(B[s:e].unsqueeze(1))
    pre.addmm_(P[s:e].reshape(n * k, -1), Wa_t)
    return pre.relu_()


def values_with_position(
    ws: Workspace, V: Tensor, P: Tensor, Wp_t: Tensor, ic: Tensor, s: int, e: int
) -> Tensor:
    """V[idx] + P Wp^T for one chunk, in a workspace buffer (n, k, C)."""
    n, k = ic.shape
    vals = gather_into(ws.get("vals", n * k, V.shape[1]), V, ic)  # (n*k, C)
    vals.addmm_(P[s:e].reshape(n * k, -1), Wp_t)  # + W_p P_ij
    return vals.view(n, k, -1)


def softmax_backward(
    ws: Workspace, V: Tensor, P: Tensor, Wp_t: Tensor, ic: Tensor, p: Tensor, gy: Tensor, s: int, e: int
) -> Tensor:
    """Gradient of the logits w from the output's gradient ``gy`` (torch operations).

    Shapes:
        p: (m, k, G); gy: (m, 1, C) -> (m, k, G)
    """
    m, k, g = p.shape
    sh = gy.shape[-1] // g
    vals = values_with_position(ws, V, P, Wp_t, ic, s, e)  # (m, k, C)
    # gradient of p; the constant b_p * dy cancels in the softmax backward
    if sh == 1:
        gp = vals.mul_(gy)  # (m, k, G)
    else:
        gp = vals.view(m, k, sh, g).mul_(gy.view(m, 1, sh, g)).sum(2)
    # softmax backward: gw = p * (gp - sum_j p gp)
    pgp = torch.mul(p, gp, out=ws.get("pgp", m, k, g)).sum(1, keepdim=True)
    return gp.sub_(pgp).mul_(p)  # (m, k, G)


class AdjacencyMatmul(torch.autograd.Function):
    """``adj @ X`` with a constant sparse CSR adjacency and its transpose for backward.

    Shapes:
        adj: (N, M) CSR; adj_t: (M, N) CSR; X: (M, F) -> (N, F)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, adj: Tensor, adj_t: Tensor, X: Tensor
    ) -> Tensor:
        ctx.adj_t = adj_t
        return adj @ X

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None, Tensor]:
        return None, None, ctx.adj_t @ grad.contiguous()
