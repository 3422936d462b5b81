"""Mean and variance over all N*k edges of the PTv1 pre-activation, from per-point sums.

The first BatchNorm of the PTv1 weight MLP acts on ``a_ij = K_{n(i,j)} - Q_i + W_p P_ij + b_p``,
a sum of a per-source term, a per-query term and a low-rank (d = 3) position term. Its
per-channel mean and variance over all edges follow from per-point sums (keys summed per
query, queries and positions summed per source; :mod:`~sciformer.attention._edge_terms`),
without forming the (N, k, C) tensor. Statistics come from centred terms (per-point
products in the input dtype, (C,)-sized partial sums combined in ``stats_dtype``) to avoid
cancellation. :class:`EdgeMoments` has a closed-form backward pass: with
``h_ij = g_mean / E + 2 g_var (a_ij - mean) / E`` (the gradient of the moments in a_ij),
each input's gradient is a sum of h over its edges, which the same per-point sums give.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from sciformer.attention import _neighborhood_native as native
from sciformer.attention._edge_terms import (
    edge_affine,
    gather_sum,
    position_sums,
    row_affine,
    rows_dot,
    scatter_rows,
)
from sciformer.attention._neighborhood_norm import stats_dtype


def _mm_tn(a: Tensor, b: Tensor) -> Tensor:
    """``a.t() @ b`` without transposing a (compiled for float32 CPU).

    Shapes:
        a: (R, K); b: (R, N) -> (K, N)
    """
    if native.usable(None, a, b):
        return native.matmul(a.contiguous(), b.contiguous(), transpose_a=True)
    return a.t() @ b


def edge_moments(K: Tensor, Q: Tensor | None, P: Tensor, Wp: Tensor, bp: Tensor | None, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and biased variance over all edges of ``a_ij = K[idx_ij] - Q_i + P_ij Wp^T + bp``.

    Differentiable in K, Q, P, Wp, bp; costs O((N + M) C + N k d) (``Q=None`` and
    ``bp=None`` drop those terms). Sources no edge reads take no part (even NaN ones).

    Shapes:
        K: (M, C); Q: (N, C); P: (N, k, d); Wp: (C, d); bp: (C,); idx: (N, k)
        -> mean (C,), var (C,) in ``stats_dtype``
    """
    out = EdgeMoments.apply(idx, K, Q, P, Wp, bp)
    return out[0], out[1]


class EdgeMoments(torch.autograd.Function):
    """:func:`edge_moments` with its closed-form backward pass (see the module docstring).

    Shapes:
        idx: (N, k); K: (M, C); Q: (N, C) or None; P: (N, k, d); Wp: (C, d); bp: (C,) or None
        -> mean (C,), var (C,)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, idx: Tensor, K: Tensor, Q: Tensor | None, P: Tensor, Wp: Tensor, bp: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        sdt = stats_dtype(K.device)
        n, k, d = P.shape
        e, m = n * k, K.shape[0]
        cnt = torch.bincount(idx.reshape(-1), minlength=m).to(K.dtype)  # (M,) edges per source
        unread = cnt == 0  # (M,)
        if bool(unread.any()):
            K = K.masked_fill(unread.unsqueeze(1), 0.0)  # (M, C)
        mK = (cnt @ K) / e  # (C,)
        mP = P.reshape(e, d).sum(0) / e  # (d,)
        Kc = K - mK  # (M, C) centred keys
        pscat, psum, gram, total = position_sums(P, mP, idx, m, sdt)  # (M, d), (N, d), (d, d), (d,)
        KP = _mm_tn(pscat, Kc)  # (d, C) sum over edges of Pc_ij K_j
        Wps = Wp.to(sdt)  # (C, d)
        mean = mK + Wp @ mP  # (C,)
        if bp is not None:
            mean = mean + bp
        terms = [
            (cnt @ Kc.square()).to(sdt),  # sum over edges of K_j^2
            ((Wps @ gram) * Wps).sum(1),  # (W_p P_ij)^2
            2.0 * (Wps.t() * KP.to(sdt)).sum(0),  # 2 K_j W_p P_ij
        ]  # (C,) each
        mQ = ksum = QP = None
        if Q is not None:
            mQ = Q.mean(0)  # (C,)
            Qc = Q - mQ  # (N, C)
            mean = mean - mQ
            ksum = gather_sum(Kc, idx)  # (N, C) keys summed per query
            QP = _mm_tn(psum, Qc)  # (d, C)
            terms += [
                (k * Qc.square().sum(0)).to(sdt),  # Q_i^2
                (-2.0 * (Qc * ksum).sum(0)).to(sdt),  # -2 K_j Q_i
                -2.0 * (Wps.t() * QP.to(sdt)).sum(0),  # -2 Q_i W_p P_ij
            ]
        sq = torch.stack(terms).sum(0)  # (C,) sum of (a - mean)^2
        var = (sq / e).clamp_min(0.0)
        ctx.k, ctx.has_q = k, Q is not None
        ctx.save_for_backward(idx, K, Q, P, Wp, cnt, mK, mQ, mP, pscat, psum, gram, total, KP, QP, ksum, sq)
        return mean.to(sdt), var

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_mean: Tensor | None, g_var: Tensor | None) -> tuple[Tensor | None, ...]:
        idx, K, Q, P, Wp, cnt, mK, mQ, mP, pscat, psum, gram, total, KP, QP, ksum, sq = ctx.saved_tensors
        _, nK, nQ, nP, nWp, nbp = ctx.needs_input_grad
        k, dt = ctx.k, K.dtype
        n, _, d = P.shape
        e = n * k
        g_mean = torch.zeros_like(sq) if g_mean is None else g_mean  # (C,)
        g_var = torch.zeros_like(sq) if g_var is None else g_var  # (C,)
        alpha_s = g_mean / e  # (C,) gradient of the mean in each a_ij
        beta_s = torch.where(sq >= 0, 2.0 * g_var / e, 0.0)  # (C,) times (a_ij - mean)
        alpha, beta = alpha_s.to(dt), beta_s.to(dt)
        WpT = Wp.t().contiguous()  # (d, C)
        gK = gQ = gP = gWp = gbp = None
        if nK:  # sum over each source's edges of h
            qscat = scatter_rows(Q - mQ, idx, K.shape[0]) if ctx.has_q else None  # (M, C)
            gK = row_affine(K, mK, cnt, cnt, pscat, WpT, qscat, alpha, beta, ysign=-1.0)  # (M, C)
        if nQ and ctx.has_q:  # minus the sum over each query's edges of h
            gQ = row_affine(Q, mQ, -float(k), float(k), psum, WpT, ksum, alpha, beta, sign=-1.0)
        if nP:  # Wp^T h_ij per edge
            WbT = (beta.unsqueeze(1) * Wp).t()  # (d, C)
            KW = rows_dot(K, mK, WbT)  # (M, d)
            QW = rows_dot(Q, mQ, WbT) if ctx.has_q else None  # (N, d)
            D = WpT @ WbT.t()  # (d, d)
            gP = edge_affine(P, KW, QW, D, WpT @ alpha - mP @ D, idx)  # (N, k, d)
        if nWp:
            cross = KP.t().to(beta_s.dtype)  # (C, d)
            if QP is not None:
                cross = cross - QP.t().to(beta_s.dtype)
            cross = cross + Wp.to(beta_s.dtype) @ gram
            gWp = beta_s.unsqueeze(1) * cross + torch.outer(g_mean, mP.to(g_mean.dtype))
            gWp = (gWp + torch.outer(alpha_s, total)).to(dt)  # (C, d)
        if nbp:
            gbp = g_mean.to(dt)
        return None, gK, gQ, gP, gWp, gbp
