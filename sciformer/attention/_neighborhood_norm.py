"""BatchNorm over all N*k neighbour edges, folded into per-point tensors.

The first BatchNorm of the PTv1 weight MLP acts on ``a_ij = K_{n(i,j)} - Q_i + W_p P_ij + b_p``,
a sum of a per-source term, a per-query term and a low-rank (d = 3) position term. Its
per-channel mean and variance over all edges therefore follow from per-point sums and one
sparse adjacency product, without forming the (N, k, C) tensor; BatchNorm then becomes a
per-channel affine map ``s * a + t`` that folds into K, Q and W_p. Statistics come from
centred terms (per-point products in the input dtype, partial sums combined in float64
where the device has it) to avoid cancellation. The same folding applies to the
BatchNorm after the first linear of the position MLP (:func:`linear_batchnorm`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sciformer.attention._neighborhood_ops import AdjacencyMatmul
from sciformer.errors import DataError


@dataclass
class NeighborGraph:
    """Sparse form of a neighbour index (N, k) into M sources.

    Shapes:
        counts: (M,) number of edges leaving each source; adj: (N, M) CSR; adj_t: (M, N) CSR
    """

    counts: Tensor
    adj: Tensor
    adj_t: Tensor

    @classmethod
    def build(cls, idx: Tensor, num_sources: int, dtype: torch.dtype) -> NeighborGraph:
        n, k = idx.shape
        e = n * k
        flat = idx.reshape(-1)  # (E,)
        dev = idx.device
        ones = torch.ones(e, dtype=dtype, device=dev)
        crow = torch.arange(0, e + 1, k, device=dev)  # (N+1,)
        cols = idx.sort(dim=1).values.reshape(-1)  # (E,) sorted within each row
        counts = torch.bincount(flat, minlength=num_sources)  # (M,)
        crow_t = torch.zeros(num_sources + 1, dtype=torch.long, device=dev)
        torch.cumsum(counts, 0, out=crow_t[1:])
        order = torch.argsort(flat, stable=True)  # edges grouped by source
        cols_t = torch.div(order, k, rounding_mode="floor")  # (E,) query of each edge
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
            adj = torch.sparse_csr_tensor(
                crow, cols, ones, (n, num_sources), check_invariants=False
            )
            adj_t = torch.sparse_csr_tensor(
                crow_t, cols_t, ones, (num_sources, n), check_invariants=False
            )
        return cls(counts=counts.to(dtype), adj=adj, adj_t=adj_t)


def stats_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device supports it (statistics are per-point sized)."""
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def edge_moments(
    K: Tensor,
    Q: Tensor | None,
    P: Tensor,
    Wp: Tensor,
    bp: Tensor | None,
    idx: Tensor,
    graph: NeighborGraph | None,
) -> tuple[Tensor, Tensor]:
    """Mean and biased variance over all edges of ``a_ij = K[idx_ij] - Q_i + P_ij Wp^T + bp``.

    Differentiable in K, Q, P, Wp, bp; costs O((N + M) C + N k d) plus one sparse product
    (none without Q: ``Q=None`` and ``bp=None`` drop those terms, and ``graph`` may be None).
    Per-point products run in the input dtype on centred terms (rounding comparable to
    forming a_ij itself); the (C,)-sized partial sums are combined in ``stats_dtype``.

    Shapes:
        K: (M, C); Q: (N, C); P: (N, k, d); Wp: (C, d); bp: (C,); idx: (N, k)
        -> mean (C,), var (C,) in ``stats_dtype``
    """
    sdt = stats_dtype(K.device)
    n, k, d = P.shape
    e = n * k
    Pf = P.reshape(e, d)  # (E, d)
    if graph is not None:
        cnt = graph.counts.to(K.dtype)  # (M,)
    else:
        cnt = torch.bincount(idx.reshape(-1), minlength=K.shape[0]).to(K.dtype)  # (M,)
    unread = cnt == 0  # (M,)
    if bool(unread.any()):  # sources no edge reads take no part (even NaN ones)
        K = K.masked_fill(unread.unsqueeze(1), 0.0)  # (M, C)
    mK = (cnt @ K) / e  # (C,)
    mP = Pf.mean(0)  # (d,)
    Kc, Pc = K - mK, Pf - mP  # centred terms
    mean = mK + Wp @ mP  # (C,)
    if bp is not None:
        mean = mean + bp
    gram = Pc.t() @ Pc  # (d, d)
    pscat = torch.zeros(K.shape[0], d, dtype=K.dtype, device=K.device).index_add(
        0, idx.reshape(-1), Pc
    )  # (M, d) position terms summed per source
    terms = [
        cnt @ Kc.square(),  # sum over edges of K_j^2
        ((Wp @ gram) * Wp).sum(1),  # (W_p P_ij)^2
        2.0 * (Kc * (pscat @ Wp.t())).sum(0),  # 2 K_j W_p P_ij
    ]  # (C,) each
    if Q is not None:
        if graph is None:
            raise ValueError("edge_moments with Q needs the neighbour graph")
        mQ = Q.mean(0)  # (C,)
        Qc = Q - mQ
        mean = mean - mQ
        psum = Pc.view(n, k, d).sum(1)  # (N, d) position terms summed per query
        ksum = AdjacencyMatmul.apply(graph.adj, graph.adj_t, Kc)  # (N, C) keys summed per query
        terms += [
            k * Qc.square().sum(0),  # Q_i^2
            -2.0 * (Qc * ksum).sum(0),  # -2 K_j Q_i
            -2.0 * (Qc * (psum @ Wp.t())).sum(0),  # -2 Q_i W_p P_ij
        ]
    sq = torch.stack([t.to(sdt) for t in terms]).sum(0)  # (C,) sum of (a - mean)^2
    var = (sq / e).clamp_min(0.0)
    return mean.to(sdt), var


def uses_batch_stats(bn: nn.modules.batchnorm._BatchNorm) -> bool:
    """Whether ``bn`` normalises with batch statistics (as ``nn.BatchNorm1d.forward`` decides)."""
    return bn.training or (bn.running_mean is None and bn.running_var is None)


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
        if mean is None or var is None:
            raise ValueError("batch statistics required")
        if count <= 1:  # as nn.BatchNorm1d, also in eval without running statistics
            raise DataError(f"BatchNorm with batch statistics needs more than 1 edge, got {count}")
        if bn.training and bn.track_running_stats and bn.running_mean is not None:
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
        mu, v = mean, var
    else:
        assert bn.running_mean is not None and bn.running_var is not None
        mu, v = bn.running_mean, bn.running_var
    scale = torch.rsqrt(v + bn.eps).to(dtype)  # (C,)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -mu.to(dtype) * scale  # (C,)
    if bn.bias is not None:
        shift = shift + bn.bias
    return scale, shift


def linear_batchnorm(lin: nn.Linear, bn: nn.modules.batchnorm._BatchNorm, r: Tensor) -> Tensor:
    """``bn(lin(r))`` with BatchNorm folded into the linear map (statistics from r's moments).

    For a narrow input (the 3D offsets of the position MLP) the mean and variance of
    ``W r + b`` follow from the mean and the d x d covariance of r, so the normalised output
    is one ``addmm``; it saves the BatchNorm passes over the (E, d_out) tensor.

    Shapes:
        r: (E, d_in) -> (E, d_out)
    """
    e = r.shape[0]
    W, b = lin.weight, lin.bias  # (d_out, d_in), (d_out,) or None
    mean = var = None
    if uses_batch_stats(bn):
        sdt = stats_dtype(r.device)
        mean_r = r.mean(0)  # (d_in,)
        rc = (r - mean_r).to(sdt)  # (E, d_in)
        cov = rc.t() @ rc / e  # (d_in, d_in)
        Wd = W.to(sdt)
        mean = (W @ mean_r).to(sdt) + (0.0 if b is None else b.to(sdt))  # (d_out,)
        var = ((Wd @ cov) * Wd).sum(1).clamp_min(0.0)  # (d_out,)
    scale, shift = batchnorm_fold(bn, mean, var, e, r.dtype)  # (d_out,) each
    if b is not None:
        shift = shift + scale * b
    return torch.addmm(shift, r, (W * scale.unsqueeze(1)).t())  # (E, d_out)
