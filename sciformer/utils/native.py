"""The package's optional compiled kernels, called through ctypes: loading, pointers, and
large output blocks on huge pages, reused across steps (:func:`empty_large`).

``setup.py`` builds them as optional extensions: where no C++ compiler is present the
package installs without them and every caller falls back to a torch / NumPy path.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import math
from pathlib import Path
from typing import Any

import torch

from sciformer.utils.block_cache import ALIGN, CACHE


def load_library(
    package_dir: Path, stem: str, signatures: dict[str, tuple[int, int]] | None = None
) -> ctypes.CDLL | None:
    """The compiled library ``<package_dir>/<stem><extension suffix>``, or ``None`` if absent.

    ``signatures`` maps functions returning void to their argument counts: (int64 arguments,
    then pointer arguments). ctypes releases the GIL during every foreign call, so worker
    threads can run them at once. Callers cache the result.
    """
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package_dir / f"{stem}{suffix}"
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            for name, (ints, ptrs) in (signatures or {}).items():
                fn = getattr(lib, name)
                fn.argtypes = [ctypes.c_int64] * ints + [ctypes.c_void_p] * ptrs
                fn.restype = None
            return lib
    return None


def pointer(tensor: Any) -> int | None:
    """Address of a contiguous tensor's data for a C call (``None`` -> NULL). The caller keeps
    the tensor alive until the call returns (a temporary would be freed at once)."""
    if tensor is None:
        return None
    if not tensor.is_contiguous():
        raise ValueError("a compiled kernel needs contiguous tensors")
    return int(tensor.data_ptr())


def empty_large(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``like.new_empty(shape)``; a CPU block of 2 MiB or more starts on a 2 MiB boundary and
    is advised onto transparent huge pages, so that its first fill takes one page fault per
    2 MiB instead of one per 4 KiB, and is reused across training steps instead of
    faulted in and zeroed again each step (both
    :mod:`~sciformer.utils.block_cache`; a point layer allocates tens of MB of per-edge
    tensors per step)."""
    nbytes = math.prod(shape) * like.element_size()
    if like.device.type != "cpu" or nbytes < ALIGN:
        return like.new_empty(shape)
    return CACHE.take(nbytes).view(like.dtype).view(shape)
