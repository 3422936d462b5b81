"""Compiled per-chunk passes of the fused v1 vector attention (``_vector_attention.cpp``).

:mod:`~sciformer.attention._neighborhood_fused` keeps its matrix products in torch and
calls these for the edge-sized elementwise work between them (one pass each instead of a
few torch operations each), for float32 CPU tensors when the library was compiled at
install; otherwise it runs its torch operations. Every function takes one chunk's rows
(contiguous slices) and whole source arrays (indexed by the chunk's neighbour index);
``None`` outputs are skipped. The formulas are in the C++ file.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from sciformer.utils.native import load_library, pointer

enabled = True  # False: always use the torch operations (tests compare both paths)

_SIGNATURES = {  # name: (integer arguments, pointer arguments)
    "sf_va_pre": (4, 6),
    "sf_va_pre_backward": (4, 9),
    "sf_va_moments": (2, 3),
    "sf_va_grad_u": (2, 5),
    "sf_va_affine_relu": (2, 4),
    "sf_va_affine_relu_backward": (2, 7),
    "sf_va_softmax_aggregate": (5, 7),
    "sf_va_aggregate_backward": (5, 10),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled library, or ``None`` where the package was installed without it."""
    return load_library(Path(__file__).parent, "_vector_attention", _SIGNATURES)


def usable(idx: Tensor, *tensors: Tensor) -> bool:
    """Whether the compiled passes apply: library present, enabled, float32 CPU tensors and a
    contiguous int64 index (its range is the caller's check: ``check_neighbor_index``)."""
    return (
        enabled
        and library() is not None
        and idx.dtype == torch.int64
        and idx.device.type == "cpu"
        and idx.is_contiguous()
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    )


def _lib() -> ctypes.CDLL:
    lib = library()
    assert lib is not None
    return lib


def pre(idx: Tensor, A: Tensor, B: Tensor, P: Tensor, WaT: Tensor, out: Tensor) -> Tensor:
    """``ReLU(A[idx] - B_i + P WaT)`` into ``out``.

    Shapes:
        idx: (m, k); A: (M, C); B: (m, C); P: (m, k, d); WaT: (d, C) -> out (m*k, C)
    """
    (m, k), (c, d) = idx.shape, (A.shape[1], P.shape[-1])
    _lib().sf_va_pre(m, k, c, d, *map(pointer, (idx, A, B, P, WaT, out)))
    return out


def pre_backward(
    idx: Tensor, gz: Tensor, z: Tensor, P: Tensor, WaT: Tensor,
    gA: Tensor | None, gB: Tensor | None, gWaT: Tensor | None, gP: Tensor | None,
) -> None:
    """Gradients of :func:`pre` from ``gz`` (gA, gWaT accumulate; gB, gP are set).

    Shapes:
        idx: (m, k); gz, z: (m*k, C); P, gP: (m, k, d); WaT, gWaT: (d, C); gA: (M, C); gB: (m, C)
    """
    (m, k), (c, d) = idx.shape, (gz.shape[1], P.shape[-1])
    _lib().sf_va_pre_backward(m, k, c, d, *map(pointer, (idx, gz, z, P, WaT, gA, gB, gWaT, gP)))


def moments(u: Tensor) -> tuple[Tensor, Tensor]:
    """Per-column mean and sum of squared deviations, in float64.

    Shapes:
        u: (rows, G) -> (G,), (G,)
    """
    rows, g = u.shape
    mean = torch.empty(g, dtype=torch.float64)
    m2 = torch.empty(g, dtype=torch.float64)
    _lib().sf_va_moments(rows, g, *map(pointer, (u, mean, m2)))
    return mean, m2


def grad_u(grad: Tensor | None, u: Tensor, cv: Tensor | None, cst: Tensor | None, out: Tensor) -> Tensor:
    """``grad + cv * u + cst`` into ``out`` (absent terms are zero).

    Shapes:
        grad, u, out: (rows, G); cv, cst: (G,)
    """
    rows, g = u.shape
    _lib().sf_va_grad_u(rows, g, *map(pointer, (grad, u, cv, cst, out)))
    return out


def affine_relu(u: Tensor, s: Tensor, t: Tensor, out: Tensor) -> Tensor:
    """``ReLU(s * u + t)`` into ``out``.

    Shapes:
        u, out: (rows, G); s, t: (G,)
    """
    rows, g = u.shape
    _lib().sf_va_affine_relu(rows, g, *map(pointer, (u, s, t, out)))
    return out


def affine_relu_backward(
    gz: Tensor, z: Tensor, u: Tensor, s: Tensor, gu: Tensor | None, gs: Tensor | None, gt: Tensor | None
) -> None:
    """Gradients of :func:`affine_relu` (gu set, gs and gt accumulate).

    Shapes:
        gz, z, u, gu: (rows, G); s, gs, gt: (G,)
    """
    rows, g = u.shape
    _lib().sf_va_affine_relu_backward(rows, g, *map(pointer, (gz, z, u, s, gu, gs, gt)))


def softmax_aggregate(
    idx: Tensor, w: Tensor, V: Tensor, P: Tensor, WpT: Tensor, p: Tensor, y: Tensor
) -> None:
    """Softmax of ``w`` over neighbours into ``p``; ``sum_j p (V[idx] + P WpT)`` into ``y``.

    Shapes:
        idx: (m, k); w, p: (m, k, G); V: (M, C); P: (m, k, d); WpT: (d, C) -> y (m, C)
    """
    (m, k), c, g, d = idx.shape, V.shape[1], w.shape[-1], P.shape[-1]
    _lib().sf_va_softmax_aggregate(m, k, c, g, d, *map(pointer, (idx, w, V, P, WpT, p, y)))


def aggregate_backward(
    idx: Tensor, gy: Tensor, p: Tensor, V: Tensor, P: Tensor, WpT: Tensor,
    gV: Tensor | None, gWpT: Tensor | None, gP: Tensor | None, gw: Tensor | None,
) -> None:
    """Gradients of :func:`softmax_aggregate` (gV, gWpT accumulate; gP and gw of ``w`` are set).

    Shapes:
        idx: (m, k); gy: (m, C); p, gw: (m, k, G); V, gV: (M, C); P, gP: (m, k, d); WpT, gWpT: (d, C)
    """
    (m, k), c, g, d = idx.shape, V.shape[1], p.shape[-1], P.shape[-1]
    _lib().sf_va_aggregate_backward(m, k, c, g, d, *map(pointer, (idx, gy, p, V, P, WpT, gV, gWpT, gP, gw)))
