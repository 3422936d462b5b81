"""Edge selection of the PTv1 transition down: per point and channel, the one edge that matters.

:class:`~sciformer.pointcloud.layers.TransitionDown` max-pools ``ReLU(BN(h_ij))`` over
neighbours ``j`` of ``h_ij = f[idx_ij] + rel_ij w_p^T``; BatchNorm is an affine map per
channel and ReLU is monotone, so only the edge maximising ``sign(scale) * h_ij`` matters.
:func:`selected_edges` returns ``h`` at that edge (differentiable) and, in training, the
BatchNorm mean and variance over all edges (differentiable), without an (M, k, C) tensor in
autograd: by the compiled kernel (``_edge_select.cpp``, float32 / float64 on CPU, built at
install where a C++ compiler exists) in one pass over the edges, gradients in closed form
(:class:`SelectedEdges`); else by torch operations over chunks of points, gathers and
``edge_moments``.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from sciformer.attention._neighborhood_moments import edge_moments
from sciformer.utils.native import load_library, pointer

_SIGNATURES = {  # name: (integer arguments, pointer arguments)
    "sf_edge_select_f32": (4, 10),
    "sf_edge_select_f64": (4, 10),
    "sf_edge_select_backward_f32": (4, 8),
    "sf_edge_select_backward_f64": (4, 8),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, or ``None`` where the package was installed without it."""
    return load_library(Path(__file__).parent, "_edge_select_kernel", _SIGNATURES)


def _compiled(f: Tensor) -> ctypes.CDLL | None:
    lib = library()
    return lib if lib is not None and f.device.type == "cpu" and f.dtype in (torch.float32, torch.float64) else None


class SelectedEdges(torch.autograd.Function):
    """``h`` at each point's selected edge per channel and, with ``stats``, the mean and biased
    variance of ``h`` over all M k edges, from the compiled kernel's one pass over the edges.

    Gradients in closed form. Selected values: the gradient goes to the selected edge's
    source row of f, its offset and w_p. Statistics: with ``a = g_mean / E - 2 g_var mean / E``
    and ``b = 2 g_var / E`` (E = M k) every edge value's gradient is ``a + b h_ij``, which sums
    to per-point terms: ``g_f = cnt (a + b f) + b (R_src w_p^T)``, ``g_rel_ij = (a + b h_ij) w_p``,
    ``g_w_p = a Rsum^T + b (f^T R_src + w_p (rel^T rel))``, where ``cnt`` counts each source's
    edges and ``R_src`` sums the offsets of each source's edges.

    Shapes:
        f: (N, C); rel: (M, k, d); w_p: (C, d); idx: (M, k) int64; direction: (C,) in {1, -1, 0}
        -> h (M, C), mean (C,) float64, var (C,) float64 (zeros without ``stats``)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, f: Tensor, rel: Tensor, w_p: Tensor, idx: Tensor, direction: Tensor, stats: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        lib = _compiled(f)
        assert lib is not None
        m, k = idx.shape
        c, d = f.shape[1], rel.shape[-1]
        f, rel, w_p = f.detach().contiguous(), rel.detach().to(f.dtype).contiguous(), w_p.detach().to(f.dtype)
        idx = idx.to(torch.int64).contiguous()
        w_t = w_p.t().contiguous()  # (d, C)
        sign = direction.cpu().to(f.dtype).contiguous()  # (C,)
        shift = (f[idx[:, 0]].mean(0) + rel.reshape(-1, d).mean(0) @ w_p.t()).contiguous()  # (C,) near the edge mean
        best = torch.empty(m, c, dtype=torch.int64)
        val = torch.empty(m, c, dtype=f.dtype)
        sums = torch.zeros(2, c, dtype=torch.float64)
        fn = lib.sf_edge_select_f32 if f.dtype == torch.float32 else lib.sf_edge_select_f64
        fn(m, k, c, d, *map(pointer, (idx, f, rel, w_t, sign, best, shift)),
           pointer(sums[0]) if stats else None, pointer(sums[1]) if stats else None, pointer(val))
        e = m * k
        dev = sums[0] / e  # (C,) mean of h - shift
        mean = shift.double() + dev if stats else torch.zeros(c, dtype=torch.float64)
        var = (sums[1] / e - dev.square()).clamp_min(0.0) if stats else torch.zeros(c, dtype=torch.float64)
        ctx.stats = stats
        ctx.save_for_backward(f, rel, w_p, idx, best, mean)
        return val, mean, var

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_h: Tensor | None, g_mean: Tensor | None, g_var: Tensor | None) -> tuple[Tensor | None, ...]:
        f, rel, w_p, idx, best, mean = ctx.saved_tensors
        need_f, need_rel, need_w = ctx.needs_input_grad[:3]
        m, k, d = rel.shape
        g_f = torch.zeros_like(f) if need_f else None
        g_rel = torch.zeros_like(rel) if need_rel else None
        g_wt = torch.zeros(d, f.shape[1], dtype=f.dtype) if need_w else None  # (d, C)
        if g_h is not None:
            lib = _compiled(f)
            assert lib is not None
            fn = lib.sf_edge_select_backward_f32 if f.dtype == torch.float32 else lib.sf_edge_select_backward_f64
            g_h, w_t = g_h.to(f.dtype).contiguous(), w_p.t().contiguous()  # held: the kernel reads them
            fn(m, k, f.shape[1], d, *map(pointer, (idx, best, g_h, rel, w_t, g_f, g_rel, g_wt)))
        g_w = None if g_wt is None else g_wt.t()
        if ctx.stats and (g_mean is not None or g_var is not None):
            e = m * k
            g_mean = torch.zeros_like(mean) if g_mean is None else g_mean
            g_var = torch.zeros_like(mean) if g_var is None else g_var
            a = (g_mean / e - 2.0 * g_var * mean / e).to(f.dtype)  # (C,)
            b = (2.0 * g_var / e).to(f.dtype)  # (C,)
            wb = w_p * b.unsqueeze(1)  # (C, d): diag(b) w_p
            flat = rel.reshape(e, d)  # (E, d)
            r_src = torch.zeros(f.shape[0], d, dtype=f.dtype).index_add_(0, idx.reshape(-1), flat)  # (N, d)
            cnt = torch.bincount(idx.reshape(-1), minlength=f.shape[0]).to(f.dtype).unsqueeze(1)  # (N, 1)
            unread = cnt == 0  # (N, 1)
            if bool(unread.any()):  # rows no edge reads take no part (even NaN ones)
                f = f.masked_fill(unread, 0.0)  # (N, C)
            if g_f is not None:
                g_f += (f * b + a).mul_(cnt).add_(r_src @ wb.t())  # (N, C)
            if g_rel is not None:
                g_rel += (f @ wb)[idx] + rel @ (w_p.t() @ wb) + a @ w_p  # (M, k, d)
            if g_w is not None:
                g_w = g_w + a.unsqueeze(1) * flat.sum(0) + b.unsqueeze(1) * (f.t() @ r_src + w_p @ (flat.t() @ flat))
        return g_f, g_rel, g_w, None, None, None


def selected_edges(
    f: Tensor, rel: Tensor, w_p: Tensor, idx: Tensor, direction: Tensor, stats: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Per point and channel, ``h_ij = f[idx_ij] + rel_ij w_p^T`` at the neighbour maximising
    ``direction * h`` (1: the largest, -1: the smallest, 0: the first neighbour; the first of
    tied ones; a NaN edge is chosen, so NaN propagates like torch.max) and, with ``stats``, the
    mean and biased variance of h over all edges (``stats_dtype``), else None, None.
    Differentiable in f, rel, w_p.

    Shapes:
        f: (N, C); rel: (M, k, d); w_p: (C, d); idx: (M, k); direction: (C,) -> (M, C), (C,), (C,)
    """
    if _compiled(f) is not None:
        h, mean, var = SelectedEdges.apply(f, rel, w_p, idx, direction, stats)
        return (h, mean, var) if stats else (h, None, None)
    m, k = idx.shape
    c = f.shape[1]
    with torch.no_grad():
        sign = direction.to(f.device, f.dtype)  # (C,)
        best = torch.empty(m, c, dtype=torch.int64, device=f.device)
        step = max(1, (1 << 20) // max(1, k * c))
        for s in range(0, m, step):
            e = min(m, s + step)
            h = torch.matmul(rel[s:e], w_p.t()).add_(f[idx[s:e]])  # (m, k, C)
            best[s:e] = h.mul_(sign).max(dim=1).indices  # (m, C)
    rel_best = rel.gather(1, best.unsqueeze(-1).expand(m, c, rel.shape[-1]))  # (M, C, d)
    h = f.gather(0, idx.gather(1, best)) + (rel_best * w_p).sum(-1)  # (M, C)
    if not stats:
        return h, None, None
    mean, var = edge_moments(f, None, rel, w_p, None, idx)  # (C,) each
    return h, mean, var
