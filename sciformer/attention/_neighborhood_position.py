"""Hidden layer of the PTv1 position MLP, ``ReLU(BN(Linear(pos_j - pos_i)))``, per edge.

The offsets ``r_ij = pos[idx_ij] - pos_i`` have only d (= 3) channels, so the BatchNorm
statistics of ``W r + b`` follow from the offsets' mean and d x d covariance, and
BatchNorm folds into the linear map (``_neighborhood_norm.linear_batchnorm``). For float32
CPU tensors and the compiled library, :class:`RelativePositionHidden` goes further: the
offsets are never stored; each pass (moments, forward, two backward passes) recomputes
them per edge from ``pos`` (``_edge_terms.rel_*``). The small fold from the moments and
parameters to the folded map is differentiated by autograd in the backward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from sciformer.attention._edge_terms import (
    MAX_DIM,
    compiled,
    rel_grad_params,
    rel_grad_pos,
    rel_linear_relu,
    rel_moments,
)
from sciformer.attention._neighborhood_norm import (
    affine_from_stats,
    batchnorm_fold,
    fold_linear,
    linear_batchnorm,
    linear_stats,
    uses_batch_stats,
)
from sciformer.errors import DataError


def position_hidden(lin: nn.Linear, bn: nn.modules.batchnorm._BatchNorm, pos: Tensor, idx: Tensor) -> Tensor:
    """``ReLU(bn(lin(pos[idx_ij] - pos_i)))`` for every edge; queries are ``pos[:N]`` (N <= M;
    the entries of ``idx`` are the caller's check: ``check_neighbor_index``).

    Shapes:
        pos: (M, D); idx: (N, k) -> (N, k, H)
    """
    n, k = idx.shape
    if n > pos.shape[0]:  # the compiled passes would read queries past the end of pos
        raise DataError(f"position_hidden: {n} queries but {pos.shape[0]} positions; queries are pos[:N]")
    params = [t for t in (lin.weight, lin.bias, bn.weight, bn.bias) if t is not None]
    if compiled(idx, pos, *params) and max(pos.shape[1], lin.out_features) <= MAX_DIM:
        return RelativePositionHidden.apply(pos.contiguous(), idx, lin.weight, lin.bias, bn.weight, bn.bias, bn)
    rel = pos.index_select(0, idx.reshape(-1)) - pos[:n].repeat_interleave(k, 0)  # (N*k, D)
    return linear_batchnorm(lin, bn, rel).relu_().view(n, k, lin.out_features)


def _offset_moments(pos: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and biased covariance of all offsets, float64 (two passes: shift by the mean).

    Shapes:
        pos: (M, D); idx: (N, k) -> (D,), (D, D)
    """
    e, dim = idx.numel(), pos.shape[1]
    s0, _ = rel_moments(pos, idx, pos.new_zeros(dim, dtype=torch.float64), cross=False)
    shift = s0 / e  # (D,)
    s1, cross = rel_moments(pos, idx, shift, cross=True)
    assert cross is not None
    d1 = s1 / e  # (D,) residual of the shift
    return shift + d1, cross / e - torch.outer(d1, d1)


class RelativePositionHidden(torch.autograd.Function):
    """:func:`position_hidden` on the compiled passes (float32 CPU).

    Shapes:
        pos: (M, D); idx: (N, k); W: (H, D); b, gamma, beta: (H,) or None -> (N, k, H)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        pos: Tensor,
        idx: Tensor,
        W: Tensor,
        b: Tensor | None,
        gamma: Tensor | None,
        beta: Tensor | None,
        bn: nn.modules.batchnorm._BatchNorm,
    ) -> Tensor:
        e = idx.numel()
        batch = uses_batch_stats(bn)
        mean_r = cov = mean = var = None
        if batch and e > 1:  # else batchnorm_fold raises
            mean_r, cov = _offset_moments(pos, idx)  # (D,), (D, D)
            mean, var = linear_stats(W, b, mean_r, cov)  # (H,) each
        scale, shift = batchnorm_fold(bn, mean, var, e, pos.dtype)  # updates running stats
        Wf, bf = fold_linear(W, b, scale, shift)  # (H, D), (H,)
        out = rel_linear_relu(pos, idx, Wf.t(), bf)  # (N, k, H)
        ctx.batch, ctx.eps = batch, bn.eps
        running = (None, None) if batch else (bn.running_mean, bn.running_var)
        ctx.save_for_backward(pos, idx, out, W, b, gamma, beta, mean_r, cov, *running)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_out: Tensor) -> tuple[Tensor | None, ...]:
        pos, idx, out, W, b, gamma, beta, mean_r, cov, run_mean, run_var = ctx.saved_tensors
        need_pos = ctx.needs_input_grad[0]
        e, dim, dt = idx.numel(), pos.shape[1], pos.dtype
        g_out = g_out.contiguous()
        with torch.enable_grad():  # the (H, D)-sized fold, differentiated by autograd
            leaves = [None if t is None else t.detach().requires_grad_() for t in (mean_r, cov, W, b, gamma, beta)]
            mr, cv, Wl, bl, gl, btl = leaves
            if ctx.batch:
                mu, v = linear_stats(Wl, bl, mr, cv)
            else:
                mu, v = run_mean, run_var
            Wf, bf = fold_linear(Wl, bl, *affine_from_stats(mu, v, ctx.eps, gl, btl, dt))
        gWT, gb = rel_grad_params(pos, idx, out, g_out)  # (D, H), (H,) float64
        inputs = [t for t in leaves if t is not None]
        grads = dict(zip(map(id, inputs), torch.autograd.grad([Wf, bf], inputs, [gWT.t().to(dt), gb.to(dt)], allow_unused=True)))
        g_leaf = [None if t is None else grads[id(t)] for t in leaves]
        gpos = None
        if need_pos:
            moments = None
            if ctx.batch:  # the offsets' gradient through their mean and covariance
                g_mr, g_cv = g_leaf[0], g_leaf[1]
                gm = pos.new_zeros(dim) if g_mr is None else (g_mr / e).to(dt)  # (D,)
                Gs = pos.new_zeros((dim, dim)) if g_cv is None else ((g_cv + g_cv.t()) / e).to(dt)
                moments = (gm, Gs, mean_r.to(dt))
            gpos = rel_grad_pos(pos, idx, out, g_out, Wf.detach(), moments)  # (M, D)
        gW, gbias, ggamma, gbeta = (g if g is None else g.to(dt) for g in g_leaf[2:])
        return gpos, None, gW, gbias, ggamma, gbeta, None
