"""BatchNorm over neighbour edges as a per-channel affine map folded into its inputs.

The PTv1 layer never forms its (N*k, C) edge tensors in full, so its BatchNorms normalise
with statistics computed from per-point sums (:mod:`~sciformer.attention._neighborhood_moments`
for the weight MLP, the offsets' mean and covariance for the position MLP): BatchNorm then
becomes ``scale * a + shift`` (:func:`batchnorm_fold`), which folds into the linear maps
around it (:func:`linear_batchnorm`, :func:`fold_linear`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sciformer.errors import DataError


def stats_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device supports it (statistics are per-point sized)."""
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def uses_batch_stats(bn: nn.modules.batchnorm._BatchNorm) -> bool:
    """Whether ``bn`` normalises with batch statistics (as ``nn.BatchNorm1d.forward`` decides)."""
    return bn.training or (bn.running_mean is None and bn.running_var is None)


def update_running_stats(
    bn: nn.modules.batchnorm._BatchNorm, mean: Tensor, var: Tensor, count: int
) -> None:
    """Running statistics of ``bn`` after a training batch, as ``nn.BatchNorm1d`` updates them.

    Shapes:
        mean, var: (C,) batch mean and biased variance over ``count`` samples
    """
    if not (bn.training and bn.track_running_stats and bn.running_mean is not None):
        return
    assert bn.running_var is not None
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:
            factor = 1.0 / float(bn.num_batches_tracked)
    with torch.no_grad():
        unbiased = var.detach() * (count / (count - 1))
        mean_d = mean.detach().to(bn.running_mean)
        bn.running_mean.mul_(1.0 - factor).add_(mean_d, alpha=factor)
        bn.running_var.mul_(1.0 - factor).add_(unbiased.to(bn.running_var), alpha=factor)


def affine_from_stats(
    mu: Tensor, v: Tensor, eps: float, weight: Tensor | None, bias: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``(a - mu) / sqrt(v + eps) * weight + bias`` as ``scale * a + shift``.

    Shapes:
        mu, v, weight, bias: (C,) -> scale (C,), shift (C,)
    """
    scale = torch.rsqrt(v + eps).to(dtype)  # (C,)
    if weight is not None:
        scale = scale * weight
    shift = -mu.to(dtype) * scale  # (C,)
    if bias is not None:
        shift = shift + bias
    return scale, shift


def batchnorm_fold(
    bn: nn.modules.batchnorm._BatchNorm,
    mean: Tensor | None,
    var: Tensor | None,
    count: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """BatchNorm as ``scale * a + shift``; updates running statistics like ``nn.BatchNorm1d``.

    ``mean``/``var`` are the batch statistics (biased variance) over ``count`` samples,
    required when :func:`uses_batch_stats`; otherwise the running statistics are used.

    Shapes:
        mean, var: (C,) -> scale (C,), shift (C,)
    """
    if uses_batch_stats(bn):
        if count <= 1:  # as nn.BatchNorm1d, also in eval without running statistics
            raise DataError(f"BatchNorm with batch statistics needs more than 1 edge, got {count}")
        if mean is None or var is None:
            raise ValueError("batch statistics required")
        update_running_stats(bn, mean, var, count)
        mu, v = mean, var
    else:
        assert bn.running_mean is not None and bn.running_var is not None
        mu, v = bn.running_mean, bn.running_var
    return affine_from_stats(mu, v, bn.eps, bn.weight, bn.bias, dtype)


def linear_stats(W: Tensor, b: Tensor | None, mean_r: Tensor, cov: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance of ``W r + b`` from the mean and covariance of r (in their dtype).

    Shapes:
        W: (d_out, d_in); b: (d_out,); mean_r: (d_in,); cov: (d_in, d_in) -> (d_out,), (d_out,)
    """
    Wd = W.to(cov.dtype)
    mean = Wd @ mean_r.to(cov.dtype)  # (d_out,)
    if b is not None:
        mean = mean + b.to(cov.dtype)
    return mean, ((Wd @ cov) * Wd).sum(1).clamp_min(0.0)


def fold_linear(W: Tensor, b: Tensor | None, scale: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """``scale * (W r + b) + shift`` as ``Wf r + bf``.

    Shapes:
        W: (d_out, d_in); b, scale, shift: (d_out,) -> Wf (d_out, d_in), bf (d_out,)
    """
    bf = shift if b is None else shift + scale * b
    return W * scale.unsqueeze(1), bf


def linear_batchnorm(lin: nn.Linear, bn: nn.modules.batchnorm._BatchNorm, r: Tensor) -> Tensor:
    """``bn(lin(r))`` with BatchNorm folded into the linear map (statistics from r's moments).

    For a narrow input (the 3D offsets of the position MLP) the mean and variance of
    ``W r + b`` follow from the mean and the d x d covariance of r, so the normalised output
    is one ``addmm``; it saves the BatchNorm passes over the (E, d_out) tensor.

    Shapes:
        r: (E, d_in) -> (E, d_out)
    """
    e = r.shape[0]
    mean = var = None
    if uses_batch_stats(bn):
        mean_r = r.mean(0)  # (d_in,)
        rc = (r - mean_r).to(stats_dtype(r.device))  # (E, d_in)
        mean, var = linear_stats(lin.weight, lin.bias, mean_r, rc.t() @ rc / e)  # (d_out,) each
    scale, shift = batchnorm_fold(bn, mean, var, e, r.dtype)  # (d_out,) each
    Wf, bf = fold_linear(lin.weight, lin.bias, scale, shift)
    return torch.addmm(bf, r, Wf.t())  # (E, d_out)
