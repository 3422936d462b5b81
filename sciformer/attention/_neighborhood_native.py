"""Compiled stages of the fused v1 vector attention, one call per chunk (``_vector_attention.cpp``).

The same library holds the edge sums of ``_edge_terms.cpp`` and ``_edge_terms_rows.cpp`` (wrapped by
:mod:`~sciformer.attention._edge_terms`); this module loads it and declares every signature.

:mod:`~sciformer.attention._neighborhood_fused` calls these for float32 CPU tensors when
the library was compiled at install; otherwise it runs torch operations per chunk. Each
call runs one stage of the weight MLP over a chunk of points, forward or backward,
elementwise passes and matrix products alike, tile by tile in cache. Every function takes
one chunk's rows (contiguous slices), whole source arrays (indexed by the chunk's
neighbour index) and whole weights; ``None`` outputs are skipped. The formulas are in
:mod:`~sciformer.attention._neighborhood_fused` (the autograd functions these mirror).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from sciformer.attention._neighborhood_parallel import openmp_threads
from sciformer.utils.native import load_library, pointer

enabled = True  # False: always use the torch operations (tests compare both paths)

_SIGNATURES = {  # name: (integer arguments, pointer arguments)
    "sf_va_stage1_forward": (5, 9),
    "sf_va_stage2_forward": (5, 10),
    "sf_va_stage2_backward": (5, 17),
    "sf_va_stage1_backward": (5, 15),
    "sf_va_stage1_forward_chunks": (8, 9),
    "sf_va_stage2_forward_chunks": (8, 10),
    "sf_va_stage2_backward_chunks": (9, 17),
    "sf_va_stage1_backward_chunks": (9, 15),
    "sf_va_matmul": (4, 3),
    "sf_va_wide_products": (1, 1),
    # _edge_terms.cpp (wrapped by _edge_terms.py); its other functions are called through
    # _edge_terms_rows.cpp, which splits their rows over threads
    "sf_et_scatter_rows": (3, 3),
    "sf_et_gather_sum_mt": (4, 3),
    "sf_et_rows_dot_mt": (4, 4),
    "sf_et_row_affine_mt": (4, 11),
    "sf_et_edge_affine_mt": (4, 7),
    "sf_et_position_sums_mt": (6, 7),  # queries split over threads, sums per range
    "sf_et_rel_moments_mt": (5, 5),
    "sf_et_rel_linear_relu_mt": (5, 5),
    "sf_et_rel_grad_params_mt": (6, 6),
    "sf_et_rel_grad_pos_mt": (7, 9),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled library, or ``None`` where the package was installed without it."""
    return load_library(Path(__file__).parent, "_vector_attention", _SIGNATURES)


def usable(idx: Tensor | None, *tensors: Tensor) -> bool:
    """Whether the compiled passes apply: library present, enabled, float32 CPU tensors and a
    contiguous int64 index (``None`` for functions without one; its range is the caller's
    check: ``check_neighbor_index``)."""
    index_ok = idx is None or (idx.dtype == torch.int64 and idx.device.type == "cpu" and idx.is_contiguous())
    return (
        enabled
        and library() is not None
        and index_ok
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    )


def lib() -> ctypes.CDLL:
    lib = library()
    assert lib is not None
    return lib


def stage1_forward(
    idx: Tensor, A: Tensor, B: Tensor, P: Tensor, WaT: Tensor, W1t: Tensor, u: Tensor,
    moments: tuple[Tensor, Tensor] | None,
) -> None:
    """``u = ReLU(A[idx] - B_i + P WaT) W1t`` per edge; the chunk's column mean and sum of
    squared deviations of u into ``moments`` (float64) unless None.

    Shapes:
        idx: (m, k); A: (M, C); B: (m, C); P: (m, k, d); WaT: (d, C); W1t: (C, G)
        -> u: (m, k, G); moments: (G,), (G,)
    """
    (m, k), (c, d), g = idx.shape, WaT.shape[::-1], W1t.shape[1]
    mean, m2 = moments if moments is not None else (None, None)
    lib().sf_va_stage1_forward(m, k, c, g, d, *map(pointer, (idx, A, B, P, WaT, W1t, u, mean, m2)))


def stage2_forward(
    idx: Tensor, u: Tensor, s2: Tensor, t2: Tensor, W2t: Tensor, V: Tensor, P: Tensor,
    WpT: Tensor, p: Tensor, y: Tensor,
) -> None:
    """``p = softmax_j(ReLU(s2 u + t2) W2t)``, ``y = sum_j p (V[idx] + P WpT)`` (group c % G).

    Shapes:
        idx: (m, k); u, p: (m, k, G); s2, t2: (G,); W2t: (G, G); V: (M, C); P: (m, k, d);
        WpT: (d, C) -> y: (m, C)
    """
    (m, k), c, g, d = idx.shape, V.shape[1], u.shape[-1], P.shape[-1]
    lib().sf_va_stage2_forward(m, k, c, g, d, *map(pointer, (idx, u, s2, t2, W2t, V, P, WpT, p, y)))


def stage2_backward(
    idx: Tensor, gy: Tensor, p: Tensor, V: Tensor, P: Tensor, WpT: Tensor, u: Tensor,
    s2: Tensor, t2: Tensor, W2: Tensor, grads: dict[str, Tensor | None],
) -> None:
    """Gradients of :func:`stage2_forward` from ``gy`` into ``grads`` (keys gV, gWpT, gW2,
    gs2, gt2 accumulate; gP, gu are set; None entries are skipped).

    Shapes:
        as :func:`stage2_forward`; gy: (m, C); W2: (G, G); grads like their tensors
    """
    (m, k), c, g, d = idx.shape, V.shape[1], u.shape[-1], P.shape[-1]
    outs = [grads.get(n) for n in ("gV", "gWpT", "gP", "gu", "gs2", "gt2", "gW2")]
    lib().sf_va_stage2_backward(
        m, k, c, g, d, *map(pointer, (idx, gy, p, V, P, WpT, u, s2, t2, W2, *outs))
    )


def stage1_backward(
    idx: Tensor, grad: Tensor | None, u: Tensor, cv: Tensor | None, cst: Tensor | None,
    A: Tensor, B: Tensor, P: Tensor, WaT: Tensor, W1: Tensor, grads: dict[str, Tensor | None],
) -> None:
    """Gradients of :func:`stage1_forward` for the gradient of u ``grad + cv * u + cst``
    (absent terms are zero) into ``grads`` (gW1, gA, gWaT accumulate; gB, gP are set).

    Shapes:
        as :func:`stage1_forward`; grad: (m, k, G); cv, cst: (G,); W1: (G, C)
    """
    (m, k), (c, d), g = idx.shape, WaT.shape[::-1], W1.shape[0]
    outs = [grads.get(n) for n in ("gW1", "gA", "gB", "gWaT", "gP")]
    lib().sf_va_stage1_backward(
        m, k, c, g, d, *map(pointer, (idx, grad, u, cv, cst, A, B, P, WaT, W1, *outs))
    )


def stage1_forward_chunks(
    idx: Tensor, chunk: int, workers: int, A: Tensor, B: Tensor, P: Tensor, WaT: Tensor,
    W1t: Tensor, u: Tensor, moments: tuple[Tensor, Tensor] | None,
) -> None:
    """:func:`stage1_forward` over all N points in chunks of ``chunk`` points on up to
    ``workers`` OpenMP threads
    (:func:`~sciformer.attention._neighborhood_parallel.openmp_threads`), each taking the next
    chunk as it finishes one (no output depends on which thread ran a chunk); chunk c's
    moments in row c.

    Shapes:
        idx: (N, k); B: (N, C); P: (N, k, d); u: (N, k, G); moments: (chunks, G) twice;
        the rest as :func:`stage1_forward`
    """
    (n, k), (c, d), g = idx.shape, WaT.shape[::-1], W1t.shape[1]
    mean, m2 = moments if moments is not None else (None, None)
    args = (idx, A, B, P, WaT, W1t, u, mean, m2)
    lib().sf_va_stage1_forward_chunks(n, k, c, g, d, chunk, workers, openmp_threads(workers), *map(pointer, args))


def stage2_forward_chunks(
    idx: Tensor, chunk: int, workers: int, u: Tensor, s2: Tensor, t2: Tensor, W2t: Tensor,
    V: Tensor, P: Tensor, WpT: Tensor, p: Tensor | None, y: Tensor,
) -> None:
    """:func:`stage2_forward` over all N points in chunks on up to ``workers`` OpenMP threads,
    each taking the next chunk as it finishes one; ``p=None`` keeps no softmax (a chunk's own
    buffer).

    Shapes:
        idx: (N, k); u, p: (N, k, G); P: (N, k, d); y: (N, C); the rest as :func:`stage2_forward`
    """
    (n, k), c, g, d = idx.shape, V.shape[1], u.shape[-1], P.shape[-1]
    args = (idx, u, s2, t2, W2t, V, P, WpT, p, y)
    lib().sf_va_stage2_forward_chunks(n, k, c, g, d, chunk, workers, openmp_threads(workers), *map(pointer, args))


def stage2_backward_chunks(
    idx: Tensor, chunk: int, workers: int, gy: Tensor, p: Tensor, V: Tensor, P: Tensor,
    WpT: Tensor, u: Tensor, s2: Tensor, t2: Tensor, W2: Tensor, grads: dict[str, Tensor | None],
) -> None:
    """:func:`stage2_backward` over all N points in chunks on ``workers`` OpenMP threads;
    gV, gWpT, gs2, gt2, gW2 hold one slice per worker (leading dimension ``workers``).

    Shapes:
        idx: (N, k); gy: (N, C); p, u: (N, k, G); gV: (workers, M, C); gWpT: (workers, d, C);
        gs2, gt2: (workers, G); gW2: (workers, G, G); gP: (N, k, d); gu: (N, k, G)
    """
    (n, k), (m, c), g, d = idx.shape, V.shape, u.shape[-1], P.shape[-1]
    outs = [grads.get(name) for name in ("gV", "gWpT", "gP", "gu", "gs2", "gt2", "gW2")]
    args = (idx, gy, p, V, P, WpT, u, s2, t2, W2, *outs)
    lib().sf_va_stage2_backward_chunks(n, k, c, g, d, m, chunk, workers, openmp_threads(workers), *map(pointer, args))


def stage1_backward_chunks(
    idx: Tensor, chunk: int, workers: int, grad: Tensor | None, u: Tensor, cv: Tensor | None,
    cst: Tensor | None, A: Tensor, B: Tensor, P: Tensor, WaT: Tensor, W1: Tensor,
    grads: dict[str, Tensor | None],
) -> None:
    """:func:`stage1_backward` over all N points in chunks on ``workers`` OpenMP threads;
    gW1, gA, gWaT hold one slice per worker (leading dimension ``workers``).

    Shapes:
        idx: (N, k); grad, u: (N, k, G); B, gB: (N, C); P, gP: (N, k, d);
        gW1: (workers, G, C); gA: (workers, M, C); gWaT: (workers, d, C)
    """
    (n, k), (m, c), d, g = idx.shape, A.shape, WaT.shape[0], W1.shape[0]
    outs = [grads.get(name) for name in ("gW1", "gA", "gB", "gWaT", "gP")]
    args = (idx, grad, u, cv, cst, A, B, P, WaT, W1, *outs)
    lib().sf_va_stage1_backward_chunks(n, k, c, g, d, m, chunk, workers, openmp_threads(workers), *map(pointer, args))


def wide_products(use: bool | None = None) -> bool:
    """Whether the tile products run on 16-lane (AVX-512) blocks, which they do by default
    where the CPU is x86-64-v4; ``use=False`` keeps them on 8-lane blocks, ``True`` restores
    the default (tests compare both)."""
    active = torch.zeros(1, dtype=torch.int64)
    lib().sf_va_wide_products(-1 if use is None else int(use), pointer(active))
    return bool(active.item())


def matmul(a: Tensor, b: Tensor, transpose_a: bool = False, out: Tensor | None = None) -> Tensor:
    """The compiled tile product: ``a @ b`` (set), or ``out += a.t() @ b`` (transpose_a).

    Shapes:
        a: (R, K); b: (K, N) -> (R, N); transpose_a: a (R, K), b (R, N) -> out (K, N)
    """
    r, kk = a.shape
    n = b.shape[1]
    if out is None:
        out = a.new_zeros((kk, n) if transpose_a else (r, n))
    lib().sf_va_matmul(r, kk, n, int(transpose_a), *map(pointer, (a, b, out)))
    return out
