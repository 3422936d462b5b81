"""Input checks shared by the geometry functions.

Every check raises :class:`~sciformer.errors.DataError` with a one-line message that names
the argument and what was expected, so bad input never reaches a backend's assertion.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sciformer.errors import DataError


def check_points(x: object, name: str, dim: int | None = None) -> torch.Tensor:
    """Check ``x`` is a finite floating tensor of shape (N, D); return it unchanged.

    Shapes:
        x: (N, D) floating, D >= 1 (D == ``dim`` when given).
    """
    if not isinstance(x, torch.Tensor):
        raise DataError(f"{name} must be a torch.Tensor of shape (N, D), got {type(x).__name__}")
    if x.ndim != 2 or x.shape[1] < 1:
        raise DataError(f"{name} must have shape (N, D) with D >= 1, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise DataError(f"{name} must be a floating tensor (float16/32/64), got dtype {x.dtype}")
    if dim is not None and x.shape[1] != dim:
        raise DataError(f"{name} must have D={dim} columns to match, got shape {tuple(x.shape)}")
    if x.numel() and not _all_finite(x):
        bad = (~torch.isfinite(x).all(dim=1)).nonzero()
        raise DataError(
            f"{name} has {bad.numel()} rows with non-finite (nan/inf) coordinates "
            f"(first at row {int(bad[0, 0])})"
        )
    return x


def _all_finite(x: torch.Tensor) -> bool:
    """min and max propagate nan and inf: two cheap reductions instead of a (N, D) mask."""
    lo, hi = value_range(x)
    return bool(np.isfinite(lo) and np.isfinite(hi))


def value_range(x: torch.Tensor) -> tuple[float, float]:
    """Smallest and largest value of ``x`` (nan if any is nan), as Python floats.

    CPU tensors go through numpy: its single-threaded reductions stay fast on a loaded
    machine where torch's thread pool can stall, and a torch reduction this large wakes
    that pool, whose threads then spin on the cores for milliseconds and slow the compiled
    kNN that usually comes next (``benchmarks/bench_thread_spin.py``: 1.27x at 2 threads).

    Shapes:
        x: any non-empty floating tensor
    """
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.float32, torch.float64):
        a = x.detach().numpy()
        return float(a.min()), float(a.max())
    lo, hi = x.detach().aminmax()
    return float(lo), float(hi)


def check_offset(offset: object, n: int, name: str, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Validate a packed-batch ``offset`` (cumulative ends) for ``n`` points.

    ``None`` means one cloud holding all ``n`` points. Returns the offset as an int64 tensor
    on ``device`` and the per-cloud sizes as a Python list (for per-cloud loops).

    Shapes:
        offset: (B,) int64, non-decreasing, offset[-1] == n.
    """
    if offset is None:
        return torch.tensor([n], dtype=torch.int64, device=device), [n]
    if isinstance(offset, torch.Tensor):
        if offset.is_floating_point() or offset.is_complex() or offset.dtype == torch.bool:
            raise DataError(f"{name} must be an integer tensor (int64), got dtype {offset.dtype}")
        if offset.ndim != 1:
            raise DataError(f"{name} must have shape (B,), got shape {tuple(offset.shape)}")
        ends = offset.tolist()
    elif isinstance(offset, Sequence) and all(isinstance(v, int) and not isinstance(v, bool) for v in offset):
        ends = list(offset)
    else:
        raise DataError(f"{name} must be an int64 tensor of cumulative cloud ends, got {type(offset).__name__}")
    if not ends:
        raise DataError(f"{name} is empty: a packed batch needs at least one cloud")
    sizes = [ends[0]] + [b - a for a, b in zip(ends[:-1], ends[1:])]
    if min(sizes) < 0:
        raise DataError(f"{name} must be non-decreasing and start >= 0, got {_short(ends)}")
    if ends[-1] != n:
        raise DataError(f"{name}[-1] must equal the number of points {n}, got {_short(ends)}")
    return torch.tensor(ends, dtype=torch.int64, device=device), sizes


def check_nonempty(sizes: list[int], name: str) -> None:
    """Raise if any cloud of a packed batch is empty."""
    if 0 in sizes:
        b = sizes.index(0)
        raise DataError(f"cloud {b} of {name} is empty (sizes {_short(sizes)}); drop empty clouds first")


def check_positive_int(value: object, name: str, minimum: int = 1) -> int:
    """Return ``value`` as int, or raise unless it is an integer >= ``minimum``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_choice(value: object, name: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``; raise naming the options otherwise."""
    if value not in choices:
        raise DataError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value  # type: ignore[return-value]


def same_device(a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    if a.device != b.device:
        raise DataError(f"{names} must be on the same device, got {a.device} and {b.device}")


def _short(values: list[int], limit: int = 8) -> str:
    if len(values) <= limit:
        return str(values)
    return "[" + ", ".join(map(str, values[:limit])) + f", ... ({len(values)} entries)]"
