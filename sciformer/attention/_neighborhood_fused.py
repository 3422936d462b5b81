"""Fused, chunked Point Transformer v1 vector attention with BatchNorm (custom autograd).

The PTv1 weight MLP ``BN-ReLU-Linear-BN-ReLU-Linear`` on ``a_ij = k_j - q_i + delta_ij``
runs as two autograd functions over chunks of points:

- :class:`VectorStage1`: ``u = W1 ReLU(BN1(a))`` with BN1 folded into per-point tensors
  (statistics from ``_neighborhood_moments.edge_moments``), plus the moments of u for BN2;
- :class:`VectorStage2`: ``softmax_j(W2 ReLU(BN2(u)))`` and the aggregation
  ``sum_j p_ij (v_j + delta_ij)``.

Only (N, k, G) tensors (u and the softmax, G = C / share_planes) are kept between the
passes; the (N, k, C) ones (gathered keys and values, position encoding, pre-activation)
are recomputed chunk by chunk in the backward pass. On CPU, worker w of T takes chunks w,
w + T, ... of a backward pass; per-worker partial sums are added in worker order (the
compiled forward passes sum nothing across chunks: their threads take chunks as they
come free). For float32 CPU tensors a
stage is one call of ``_neighborhood_native`` where installed: its chunk loop runs on
the OpenMP threads of torch's own runtime, each chunk through elementwise passes and
matrix products tile by tile in cache; otherwise torch operations run per chunk in worker
threads (``_neighborhood_parallel.run_chunks``). Both give the same sums for a given T.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from sciformer.attention import _neighborhood_native as native
from sciformer.attention._neighborhood_ops import (
    Workspace,
    chunk_ranges,
    relu_backward,
    relu_pre,
    softmax_backward,
    values_with_position,
)
from sciformer.attention._neighborhood_parallel import num_workers, run_chunks, sum_parts
from sciformer.utils.native import empty_large


def graph_is_freed() -> bool:
    """Whether the running backward pass frees the graph's saved tensors (no
    ``retain_graph`` / ``create_graph``), so that one read for the last time may be
    overwritten; False where this torch cannot tell."""
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return keep is not None and not keep()


def _per_worker(like: Tensor, workers: int, wanted: dict[str, tuple[bool, Any]]) -> dict[str, Tensor | None]:
    """Zeroed accumulators of the compiled chunk loops, one slice per worker (leading dimension
    ``workers``); None where not wanted. ``wanted``: name -> (wanted, shape of one slice)."""
    return {name: like.new_zeros((workers, *shape)) if want else None for name, (want, shape) in wanted.items()}


def _worker_sums(grads: dict[str, Tensor | None]) -> list[Tensor | None]:
    """Each accumulator's worker slices added in worker order (as :func:`sum_parts`)."""
    return [None if t is None else sum_parts(list(t.unbind(0))) for t in grads.values()]


class VectorStage1(torch.autograd.Function):
    """First half of the PTv1 weight MLP, with its BatchNorm folded into the inputs.

    .. math::
        u_{ij} = W_1\\,\\mathrm{ReLU}(A_{n(i,j)} - B_i + W_a P_{ij})

    where ``A`` = s*K (scaled keys), ``B`` = s*Q - t - s*b_p (scaled queries with the
    BatchNorm shift), ``W_a`` = diag(s) W_p and P the position-MLP hidden features. The
    bias of ``W_1`` is left to the caller (it only shifts the next BatchNorm's input).
    Also returns the per-channel mean and biased variance of u over all N*k edges
    (per-chunk moments combined in ``stats_dtype``; zeros when it is None), which feed
    the next BatchNorm; their gradients enter the backward pass. The pre-activation
    (n, k, C) is recomputed per chunk in the backward pass.

    Shapes:
        idx: (N, k); A: (M, C); B: (N, C); P: (N, k, d); Wa: (C, d); W1: (G, C)
        -> u: (N, k, G), mean: (G,), var: (G,)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        idx: Tensor,
        chunk: int,
        stats_dtype: torch.dtype | None,
        A: Tensor,
        B: Tensor,
        P: Tensor,
        Wa: Tensor,
        W1: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, k = idx.shape
        g = W1.shape[0]
        u = empty_large(A, (n, k, g))  # (N, k, G)
        Wa_t, W1_t = Wa.t(), W1.t()
        nat = native.usable(idx, A, B, P, Wa, W1)
        if nat:
            A, B, P = A.contiguous(), B.contiguous(), P.contiguous()
            Wa_t, W1_t = Wa_t.contiguous(), W1_t.contiguous()

        def job(part: list[tuple[int, int]]) -> list[tuple[int, Tensor, Tensor]]:
            ws = Workspace(A)
            moments = []
            for s, e in part:
                uc = u[s:e].view(-1, g)  # (m*k, G)
                z = relu_pre(ws, A, B, P, Wa_t, idx[s:e], s, e)  # (m*k, C)
                torch.mm(z, W1_t, out=uc)
                if stats_dtype is not None:
                    mc = uc.mean(0)  # (G,)
                    dc = torch.sub(uc, mc, out=ws.get("dc", *uc.shape))  # (m*k, G)
                    m2 = dc.square_().sum(0)  # (G,)
                    moments.append((uc.shape[0], mc.to(stats_dtype), m2.to(stats_dtype)))
            return moments

        ranges = chunk_ranges(n, chunk)
        if nat:  # per-chunk moments in worker order, as run_chunks would give them
            workers = num_workers(A.device, len(ranges))
            mom = None
            if stats_dtype is not None:
                mom = (A.new_empty((len(ranges), g), dtype=torch.float64), A.new_empty((len(ranges), g), dtype=torch.float64))
            native.stage1_forward_chunks(idx, chunk, workers, A, B, P, Wa_t, W1_t, u, mom)
            order = [c for w in range(workers) for c in range(w, len(ranges), workers)]
            chunks = [] if mom is None else [((e - s) * k, mom[0][c].to(stats_dtype), mom[1][c].to(stats_dtype))
                                             for c, (s, e) in ((c, ranges[c]) for c in order)]
        else:
            chunks = [m for part in run_chunks(job, ranges, A.device) for m in part]
        sdt = stats_dtype or A.dtype
        mean = torch.zeros(g, dtype=sdt, device=A.device)
        var = torch.zeros(g, dtype=sdt, device=A.device)
        if chunks:  # combine per-chunk moments (Chan et al.)
            counts = torch.tensor([c for c, _, _ in chunks], dtype=sdt, device=A.device)
            means = torch.stack([mc for _, mc, _ in chunks])  # (chunks, G)
            m2s = torch.stack([m2 for _, _, m2 in chunks])  # (chunks, G)
            total = counts.sum()
            mean = (counts[:, None] * means).sum(0) / total
            m2 = m2s.sum(0) + (counts[:, None] * (means - mean).square()).sum(0)
            var = m2 / total
        ctx.chunk, ctx.native = chunk, nat
        ctx.save_for_backward(idx, A, B, P, Wa, W1, u, mean)
        return u, mean, var

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_u: Tensor | None, g_mean: Tensor | None, g_var: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        idx, A, B, P, Wa, W1, u, mean = ctx.saved_tensors
        _, _, _, nA, nB, nP, nWa, nW1 = ctx.needs_input_grad
        n, k, g_dim = u.shape
        c, d = Wa.shape
        count = n * k
        # total gradient of u: grad_u + cv * u + const, with d mean/du = 1/E and
        # d var/du = 2 (u - mean)/E: cv = 2 g_var/E, const = g_mean/E - cv * mean
        cv = None if g_var is None else (2.0 * g_var / count).to(u.dtype)  # (G,)
        const = None
        if cv is not None:
            const = -cv * mean.to(u.dtype)
        if g_mean is not None:
            cm = (g_mean / count).to(u.dtype)
            const = cm if const is None else const + cm
        if grad_u is not None:
            grad_u = grad_u.contiguous()
        gB = torch.empty_like(B) if nB else None
        gP = torch.empty_like(P) if nP else None
        Wa_t = Wa.t().contiguous()  # (d, C)
        need_gz = nA or nB or nP or nWa
        nat = ctx.native
        if nat:
            W1 = W1.contiguous()

        def job(part: list[tuple[int, int]]) -> tuple[Tensor | None, ...]:
            ws = Workspace(A)
            gA = torch.zeros_like(A) if nA else None
            gWa_t = Wa.new_zeros((d, c)) if nWa else None  # (d, C)
            gW1 = torch.zeros_like(W1) if nW1 else None
            for s, e in part:
                ic = idx[s:e]
                m = e - s
                gu = ws.get("gu", m * k, g_dim)  # (m*k, G)
                u_c = u[s:e].view(m * k, g_dim)
                if grad_u is not None and cv is not None:
                    torch.addcmul(grad_u[s:e].view(m * k, g_dim), u_c, cv, out=gu)
                elif grad_u is not None:
                    gu.copy_(grad_u[s:e].view(m * k, g_dim))
                elif cv is not None:
                    torch.mul(u_c, cv, out=gu)
                else:
                    gu.zero_()
                if const is not None:
                    gu.add_(const)
                z = relu_pre(ws, A, B, P, Wa_t, ic, s, e)  # (m*k, C)
                if gW1 is not None:
                    gW1.addmm_(gu.t(), z)
                if not need_gz:
                    continue
                gz = torch.mm(gu, W1, out=ws.get("gz", m * k, c))  # (m*k, C)
                gz = relu_backward(gz, z, z)  # z is not needed any more
                if gA is not None:
                    gA.index_add_(0, ic.reshape(-1), gz)
                if gB is not None:
                    torch.sum(gz.view(m, k, c), 1, out=gB[s:e]).neg_()
                Pc = P[s:e].reshape(m * k, d)  # (m*k, d)
                if gWa_t is not None:
                    gWa_t.addmm_(Pc.t(), gz)
                if gP is not None:
                    torch.mm(gz, Wa_t.t(), out=gP[s:e].view(m * k, d))
            return gA, gWa_t, gW1

        ranges = chunk_ranges(n, ctx.chunk)
        if nat:  # one slice per worker of each accumulated gradient, added in worker order
            workers = num_workers(A.device, len(ranges))
            grads = _per_worker(A, workers, {"gA": (nA, A.shape), "gWaT": (nWa, (d, c)), "gW1": (nW1, W1.shape)})
            native.stage1_backward_chunks(idx, ctx.chunk, workers, grad_u, u, cv, const, A, B, P, Wa_t, W1,
                                          grads | {"gB": gB, "gP": gP})
            gA, gWa_t, gW1 = _worker_sums(grads)
        else:
            parts = run_chunks(job, ranges, A.device)
            gA, gWa_t, gW1 = (sum_parts([p[i] for p in parts]) for i in range(3))
        gWa = gWa_t.t().contiguous() if gWa_t is not None else None
        return None, None, None, gA, gB, gP, gWa, gW1


def _weight_backward(
    ws: Workspace, gw: Tensor, uc: Tensor, s2: Tensor, t2: Tensor, W2: Tensor,
    gW2: Tensor | None, gs2: Tensor | None, gt2: Tensor | None, gu: Tensor | None,
) -> None:
    """Backward of ``w = W2 ReLU(s2 * u + t2)`` for one chunk from the logits' gradient gw
    (torch operations; gW2, gs2, gt2 accumulate, gu is set).

    Shapes:
        gw, uc, gu: (m, k, G); s2, t2: (G,); W2: (G, G)
    """
    m, k, g = uc.shape
    gw2 = gw.view(m * k, g)
    z = torch.addcmul(t2, uc, s2, out=ws.get("z", m, k, g)).relu_()  # (m, k, G)
    if gW2 is not None:
        gW2.addmm_(gw2.t(), z.view(m * k, g))
    gz = torch.mm(gw2, W2, out=ws.get("gz", m * k, g)).view(m, k, g)
    gz = relu_backward(gz, z, z)  # (m, k, G); z is not needed any more
    if gt2 is not None:
        gt2 += gz.view(m * k, g).sum(0)
    if gs2 is not None:
        gs2 += torch.mul(gz, uc, out=ws.get("pgp", m, k, g)).view(m * k, g).sum(0)
    if gu is not None:
        torch.mul(gz, s2, out=gu)


class VectorStage2(torch.autograd.Function):
    """Second half of the PTv1 weight MLP, softmax over neighbours and aggregation.

    .. math::
        w_{ij} = W_2\\,\\mathrm{ReLU}(s_2 \\odot u_{ij} + t_2) + b_2,\\quad
        p_{ij} = \\mathrm{softmax}_j(w_{ij}),\\quad
        y_i[c] = \\sum_j p_{ij}[c \\bmod G]\\,(V_{n(i,j)} + W_p P_{ij} + b_p)[c]

    The softmax ``p`` (N, k, G) is kept for the backward pass (``keep_prob``; without it
    no backward pass is possible, e.g. for inference), which writes the gradient of u over
    it when it frees the graph (:func:`graph_is_freed`; one (N, k, G) block less at the
    step's peak); the gathered values plus position encoding (n, k, C) are recomputed per
    chunk. ``b_p`` leaves the sum over neighbours unchanged in weight (softmax sums to one)
    and is added once per point; ``b_2`` shifts all neighbours' logits equally, so the
    softmax ignores it (zero gradient).

    Shapes:
        idx: (N, k); u: (N, k, G); s2, t2: (G,); W2: (G, G); b2: (G,); V: (M, C);
        P: (N, k, d); Wp: (C, d); bp: (C,) -> y: (N, C)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        idx: Tensor,
        chunk: int,
        keep_prob: bool,
        u: Tensor,
        s2: Tensor,
        t2: Tensor,
        W2: Tensor,
        b2: Tensor,
        V: Tensor,
        P: Tensor,
        Wp: Tensor,
        bp: Tensor,
    ) -> Tensor:
        n, k, g = u.shape
        c = Wp.shape[0]
        sh = c // g
        y = V.new_empty((n, c))  # (N, C)
        prob = empty_large(u, u.shape) if keep_prob else None  # (N, k, G)
        Wp_t, W2_t = Wp.t(), W2.t()
        nat = native.usable(idx, u, s2, t2, W2, V, P, Wp)
        if nat:
            u, s2, t2 = u.contiguous(), s2.contiguous(), t2.contiguous()
            V, P, Wp_t, W2_t = V.contiguous(), P.contiguous(), Wp_t.contiguous(), W2_t.contiguous()

        def job(part: list[tuple[int, int]]) -> None:
            ws = Workspace(V)
            for s, e in part:
                ic = idx[s:e]
                m = e - s
                p = prob[s:e] if prob is not None else ws.get("p", m, k, g)
                z = torch.addcmul(t2, u[s:e], s2, out=ws.get("z", m, k, g)).relu_()  # (m, k, G)
                w = torch.mm(z.view(m * k, g), W2_t, out=ws.get("w", m * k, g))
                torch.ops.aten._softmax.out(w.view(m, k, g), 1, False, out=p)  # (m, k, G)
                vals = values_with_position(ws, V, P, Wp_t, ic, s, e)  # (m, k, C)
                if sh == 1:
                    vals.mul_(p)
                else:
                    vals.view(m, k, sh, g).mul_(p.unsqueeze(2))
                torch.sum(vals, 1, out=y[s:e])  # (m, C)

        ranges = chunk_ranges(n, chunk)
        if nat:
            workers = num_workers(V.device, len(ranges))
            native.stage2_forward_chunks(idx, chunk, workers, u, s2, t2, W2_t, V, P, Wp_t, prob, y)
        else:
            run_chunks(job, ranges, V.device)
        y += bp
        ctx.chunk, ctx.native = chunk, nat
        ctx.save_for_backward(idx, u, s2, t2, W2, V, P, Wp, prob)  # prob may be None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        idx, u, s2, t2, W2, V, P, Wp, prob = ctx.saved_tensors
        _, _, _, nu, ns2, nt2, nW2, nb2, nV, nP, nWp, nbp = ctx.needs_input_grad
        if prob is None:
            raise RuntimeError("VectorStage2 ran with keep_prob=False; no backward pass")
        n, k, g = u.shape
        c, d = Wp.shape
        sh = c // g
        grad_y = grad_y.contiguous()
        gu = None
        if nu:  # each tile's softmax is read before its gradient of u is written: it can
            # take the softmax's block, unless the graph is kept for another backward pass
            gu = prob if graph_is_freed() else empty_large(u, u.shape)  # (N, k, G)
        gP = torch.empty_like(P) if nP else None
        gb2 = W2.new_zeros(W2.shape[0]) if nb2 else None  # the softmax is shift invariant
        gbp = grad_y.sum(0) if nbp else None
        Wp_t = Wp.t().contiguous()  # (d, C)
        need_v = nV or nP or nWp
        need_w = nu or ns2 or nt2 or nW2
        nat = ctx.native
        if nat:
            W2 = W2.contiguous()

        def job(part: list[tuple[int, int]]) -> tuple[Tensor | None, ...]:
            ws = Workspace(V)
            gs2 = torch.zeros_like(s2) if ns2 else None
            gt2 = torch.zeros_like(t2) if nt2 else None
            gW2 = torch.zeros_like(W2) if nW2 else None
            gV = torch.zeros_like(V) if nV else None
            gWp_t = Wp.new_zeros((d, c)) if nWp else None  # (d, C)
            for s, e in part:
                ic = idx[s:e]
                m = e - s
                p = prob[s:e]  # (m, k, G)
                gu_c = None if gu is None else gu[s:e]
                gy = grad_y[s:e].unsqueeze(1)  # (m, 1, C)
                if need_v:
                    # gradient of the aggregated values v_j + W_p P_ij: p (broadcast) * dy
                    gv = ws.get("gv", m, k, c)  # (m, k, C)
                    if sh == 1:
                        torch.mul(p, gy, out=gv)
                    else:
                        pg = p.unsqueeze(2)  # (m, k, 1, G)
                        torch.mul(pg, gy.view(m, 1, sh, g), out=gv.view(m, k, sh, g))
                    gv2 = gv.view(m * k, c)
                    if gV is not None:
                        gV.index_add_(0, ic.reshape(-1), gv2)
                    Pc = P[s:e].reshape(m * k, d)  # (m*k, d)
                    if gWp_t is not None:
                        gWp_t.addmm_(Pc.t(), gv2)
                    if gP is not None:
                        torch.mm(gv2, Wp_t.t(), out=gP[s:e].view(m * k, d))
                if need_w:
                    gw = softmax_backward(ws, V, P, Wp_t, ic, p, gy, s, e)  # (m, k, G)
                    _weight_backward(ws, gw, u[s:e], s2, t2, W2, gW2, gs2, gt2, gu_c)
            return gs2, gt2, gW2, gV, gWp_t

        ranges = chunk_ranges(n, ctx.chunk)
        if nat:  # one slice per worker of each accumulated gradient, added in worker order
            workers = num_workers(V.device, len(ranges))
            grads = _per_worker(V, workers, {"gs2": (ns2, s2.shape), "gt2": (nt2, t2.shape), "gW2": (nW2, W2.shape),
                                             "gV": (nV, V.shape), "gWpT": (nWp, (d, c))})
            native.stage2_backward_chunks(idx, ctx.chunk, workers, grad_y, prob, V, P, Wp_t, u, s2, t2, W2,
                                          grads | {"gP": gP, "gu": gu})
            gs2, gt2, gW2, gV, gWp_t = _worker_sums(grads)
        else:
            parts = run_chunks(job, ranges, V.device)
            gs2, gt2, gW2, gV, gWp_t = (sum_parts([p[i] for p in parts]) for i in range(5))
        gWp = gWp_t.t().contiguous() if gWp_t is not None else None
        return None, None, None, gu, gs2, gt2, gW2, gb2, gV, gP, gWp, gbp
