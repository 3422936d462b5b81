"""Sums over neighbour edges without forming an (N*k, C) tensor (``_edge_terms.cpp``).

Each function takes a neighbour index ``idx`` (n, k) into M source rows. For float32 CPU
tensors it is one call of the compiled library where installed; otherwise torch
operations over one neighbour slot at a time (memory O((n + M) C)). gather_sum, rows_dot,
row_affine and edge_affine split their rows over torch's intra-op thread count of OpenMP
threads (``_edge_terms_rows.cpp``; a row's result does not depend on the split). The ``rel_*``
functions (offsets ``pos[idx_ij] - pos[i]`` recomputed per edge) exist only
compiled: :mod:`~sciformer.attention._neighborhood_position` checks :func:`compiled`. They
and position_sums split their queries over the same threads too; their sums over all
edges and scatters to sources go through one buffer per range, added in range order (the
same result for the same thread count).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sciformer.attention import _neighborhood_native as native
from sciformer.attention._neighborhood_parallel import openmp_threads, ranges_and_threads
from sciformer.utils.native import empty_large, pointer

MAX_DIM = 16  # widest position, offset or hidden dimension the compiled functions take


def compiled(idx: Tensor | None, *tensors: Tensor) -> bool:
    """Whether the compiled functions apply (see ``_neighborhood_native.usable``)."""
    return native.usable(idx, *tensors)


def _threads() -> int:
    """Threads for the row-wise compiled functions: torch's intra-op count, where they can start."""
    return openmp_threads(torch.get_num_threads())


def gather_sum(X: Tensor, idx: Tensor) -> Tensor:
    """``out_i = sum_j X[idx_ij]``.

    Shapes:
        X: (M, C); idx: (n, k) -> (n, C)
    """
    n, k = idx.shape
    if compiled(idx, X):
        X = X.contiguous()
        out = empty_large(X, (n, X.shape[1]))  # (n, C)
        native.lib().sf_et_gather_sum_mt(_threads(), n, k, X.shape[1], *map(pointer, (idx, X, out)))
        return out
    out = X.new_zeros((n, X.shape[1]))  # (n, C)
    for j in range(k):
        out += X.index_select(0, idx[:, j])
    return out


def scatter_rows(Y: Tensor, idx: Tensor, num_sources: int) -> Tensor:
    """``out_m = sum over edges (i, j) with idx_ij = m of Y_i``.

    Shapes:
        Y: (n, C); idx: (n, k) -> (M, C)
    """
    n, k = idx.shape
    out = Y.new_zeros((num_sources, Y.shape[1]))  # (M, C)
    if compiled(idx, Y):
        Y = Y.contiguous()
        native.lib().sf_et_scatter_rows(n, k, Y.shape[1], *map(pointer, (idx, Y, out)))
        return out
    for j in range(k):
        out.index_add_(0, idx[:, j], Y)
    return out


def rows_dot(X: Tensor, mX: Tensor | None, WT: Tensor) -> Tensor:
    """``(X - mX) @ WT.t()`` for a narrow WT (d <= ``MAX_DIM`` rows; BLAS is slow there).

    Shapes:
        X: (R, C); mX: (C,) or None; WT: (d, C) -> (R, d)
    """
    (r, c), d = X.shape, WT.shape[0]
    ts = (X, WT) if mX is None else (X, mX, WT)
    if compiled(None, *ts) and d <= MAX_DIM:
        X, WT = X.contiguous(), WT.contiguous()
        mX = None if mX is None else mX.contiguous()
        out = X.new_empty((r, d))  # (R, d)
        native.lib().sf_et_rows_dot_mt(_threads(), r, c, d, *map(pointer, (X, mX, WT, out)))
        return out
    return (X if mX is None else X - mX) @ WT.t()


def row_affine(
    X: Tensor,
    mX: Tensor,
    wx: Tensor | float,
    wa: Tensor | float,
    Pr: Tensor,
    WpT: Tensor,
    Y: Tensor | None,
    alpha: Tensor,
    beta: Tensor,
    ysign: float = 1.0,
    sign: float = 1.0,
) -> Tensor:
    """``sign * (beta * (wx (X - mX) + Pr WpT + ysign Y) + wa alpha)``; ``wx``/``wa`` are per-row
    weights or constants (the BatchNorm statistics' gradient in keys or queries).

    Shapes:
        X, Y: (R, C); mX, alpha, beta: (C,); wx, wa: (R,) or float; Pr: (R, d); WpT: (d, C)
        -> (R, C)
    """
    (r, c), d = X.shape, Pr.shape[1]
    rows = [t for t in (wx, wa, Y) if isinstance(t, Tensor)]
    if compiled(None, X, mX, Pr, WpT, alpha, beta, *rows):
        X, mX, Pr, WpT, alpha, beta = (t.contiguous() for t in (X, mX, Pr, WpT, alpha, beta))
        wxt = wx.contiguous() if isinstance(wx, Tensor) else None
        wat = wa.contiguous() if isinstance(wa, Tensor) else None
        Y = None if Y is None else Y.contiguous()
        consts = torch.tensor([0.0 if wxt is not None else wx, 0.0 if wat is not None else wa, ysign, sign], dtype=torch.float32)
        out = empty_large(X, (r, c))  # (R, C)
        args = (X, mX, wxt, wat, Pr, WpT, Y, alpha, beta, consts, out)
        native.lib().sf_et_row_affine_mt(_threads(), r, c, d, *map(pointer, args))
        return out
    wxr = wx.unsqueeze(1) if isinstance(wx, Tensor) else wx
    war = wa.unsqueeze(1) if isinstance(wa, Tensor) else wa
    inner = wxr * (X - mX) + Pr @ WpT  # (R, C)
    if Y is not None:
        inner = inner + ysign * Y
    return sign * (beta * inner + war * alpha)


def position_sums(P: Tensor, mP: Tensor, idx: Tensor, num_sources: int, sdt: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sums of the centred position terms ``Pc_ij = P_ij - mP``: per source, per query, their
    Gram matrix and their total (the last two in ``sdt``).

    Shapes:
        P: (n, k, d); mP: (d,); idx: (n, k)
        -> pscat (M, d), psum (n, d), gram (d, d), total (d,)
    """
    n, k, d = P.shape
    pscat = P.new_zeros((num_sources, d))  # (M, d)
    if compiled(idx, P, mP) and d <= MAX_DIM and sdt == torch.float64:
        P, mP = P.contiguous(), mP.contiguous()
        psum = P.new_empty((n, d))  # (n, d)
        gram = P.new_zeros((d, d), dtype=sdt)
        total = P.new_zeros(d, dtype=sdt)
        args = (idx, P, mP, pscat, psum, gram, total)
        native.lib().sf_et_position_sums_mt(*ranges_and_threads(), n, k, d, num_sources, *map(pointer, args))
        return pscat, psum, gram, total
    Pc = (P - mP).reshape(n * k, d)  # (n*k, d)
    pscat.index_add_(0, idx.reshape(-1), Pc)
    psum = Pc.view(n, k, d).sum(1)  # (n, d)
    Pcs = Pc.to(sdt)
    return pscat, psum, Pcs.t() @ Pcs, Pcs.sum(0)


def edge_affine(P: Tensor, KW: Tensor, QW: Tensor | None, D: Tensor, c: Tensor, idx: Tensor) -> Tensor:
    """``out_ij = c + KW[idx_ij] - QW_i + P_ij D`` (no QW term when it is None).

    Shapes:
        P: (n, k, d); KW: (M, d); QW: (n, d); D: (d, d); c: (d,); idx: (n, k) -> (n, k, d)
    """
    n, k, d = P.shape
    ts = (P, KW, D, c) if QW is None else (P, KW, QW, D, c)
    if compiled(idx, *ts) and d <= MAX_DIM:
        P, KW, D, c = P.contiguous(), KW.contiguous(), D.contiguous(), c.contiguous()
        QW = None if QW is None else QW.contiguous()
        out = empty_large(P, (n, k, d))  # (n, k, d)
        native.lib().sf_et_edge_affine_mt(_threads(), n, k, d, *map(pointer, (idx, P, KW, QW, D, c, out)))
        return out
    out = (P.reshape(n * k, d) @ D).view(n, k, d) + c  # (n, k, d)
    out += KW[idx]
    if QW is not None:
        out -= QW.unsqueeze(1)
    return out


def rel_moments(pos: Tensor, idx: Tensor, shift: Tensor, cross: bool) -> tuple[Tensor, Tensor | None]:
    """Sum of the offsets ``r_ij - shift`` and (``cross``) of their outer products, float64
    (compiled only; queries are ``pos[:n]``).

    Shapes:
        pos: (M, D); idx: (n, k); shift: (D,) float64 -> (D,), (D, D)
    """
    (n, k), dim = idx.shape, pos.shape[1]
    s = pos.new_zeros(dim, dtype=torch.float64)
    x = pos.new_zeros((dim, dim), dtype=torch.float64) if cross else None
    shift = shift.contiguous()  # kept alive through the call
    native.lib().sf_et_rel_moments_mt(*ranges_and_threads(), n, k, dim, *map(pointer, (idx, pos, shift, s, x)))
    return s, x


def rel_linear_relu(pos: Tensor, idx: Tensor, WT: Tensor, b: Tensor) -> Tensor:
    """``ReLU(r_ij WT + b)`` (compiled only).

    Shapes:
        pos: (M, D); idx: (n, k); WT: (D, H); b: (H,) -> (n, k, H)
    """
    (n, k), (dim, h) = idx.shape, WT.shape
    out = empty_large(pos, (n, k, h))  # (n, k, H)
    WT, b = WT.contiguous(), b.contiguous()  # kept alive through the call
    native.lib().sf_et_rel_linear_relu_mt(_threads(), n, k, dim, h, *map(pointer, (idx, pos, WT, b, out)))
    return out


def rel_grad_params(pos: Tensor, idx: Tensor, out: Tensor, gout: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of :func:`rel_linear_relu` in ``WT`` and ``b`` (float64; compiled only).

    Shapes:
        pos: (M, D); idx: (n, k); out, gout: (n, k, H) -> gWT (D, H), gb (H,)
    """
    (n, k), dim, h = idx.shape, pos.shape[1], out.shape[-1]
    gWT = pos.new_zeros((dim, h), dtype=torch.float64)
    gb = pos.new_zeros(h, dtype=torch.float64)
    gout = gout.contiguous()  # kept alive through the call
    native.lib().sf_et_rel_grad_params_mt(*ranges_and_threads(), n, k, dim, h, *map(pointer, (idx, pos, out, gout, gWT, gb)))
    return gWT, gb


def rel_grad_pos(
    pos: Tensor,
    idx: Tensor,
    out: Tensor,
    gout: Tensor,
    W: Tensor,
    moments: tuple[Tensor, Tensor, Tensor] | None,
) -> Tensor:
    """Gradient in ``pos`` of :func:`rel_linear_relu` plus, with ``moments = (gm, Gs, mean)``,
    the offsets' own gradient ``gm + Gs (r_ij - mean)`` (from their mean and covariance),
    summed over edges (compiled only).

    Shapes:
        pos: (M, D); idx: (n, k); out, gout: (n, k, H); W: (H, D); gm, mean: (D,);
        Gs: (D, D) -> (M, D)
    """
    (n, k), dim, h = idx.shape, pos.shape[1], out.shape[-1]
    gpos = torch.zeros_like(pos)  # (M, D)
    ts = [t.contiguous() for t in (gout, W)]  # kept alive through the call
    ms = [None, None, None] if moments is None else [t.contiguous() for t in moments]
    native.lib().sf_et_rel_grad_pos_mt(*ranges_and_threads(), n, k, dim, h, pos.shape[0], *map(pointer, (idx, pos, out, *ts, *ms, gpos)))
    return gpos
