"""The package's calls into C libraries through ctypes.

- :func:`load_library`, :func:`pointer`: the optional compiled kernels. ``setup.py`` builds them as optional
  extensions: where no C++ compiler is present the package installs without them and every
  caller falls back to a torch / NumPy path.
- :func:`keep_freed_memory`: glibc's malloc settings for a training process.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import platform
from pathlib import Path
from typing import Any


def load_library(package_dir: Path, stem: str) -> ctypes.CDLL | None:
    """The compiled library ``<package_dir>/<stem><extension suffix>``, or ``None`` if absent.

    ctypes releases the GIL during every foreign call, so worker threads can run them at once.
    Callers cache the result and declare argument types.
    """
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package_dir / f"{stem}{suffix}"
        if path.is_file():
            return ctypes.CDLL(str(path))
    return None


def pointer(tensor: Any) -> int | None:
    """Address of a contiguous tensor's data for a C call (``None`` -> NULL). The caller keeps
    the tensor alive until the call returns (a temporary would be freed at once)."""
    if tensor is None:
        return None
    if not tensor.is_contiguous():
        raise ValueError("a compiled kernel needs contiguous tensors")
    return int(tensor.data_ptr())


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Make glibc's malloc keep freed blocks of up to ``limit`` bytes for reuse; returns whether it applied.

    A training step allocates and frees the same large tensors every time (edge tensors,
    saved activations, their gradients). By default glibc maps blocks above 32 MB fresh
    and unmaps them on free, so every step touches their pages anew: the v1 layer at 16k
    points, C = 64, spent 0.14 s of a 0.63 s step in 57,000 page faults; with this setting
    it has none after a few steps and takes 0.48 s (benchmarks/README.md). Freed blocks
    stay in the heap and are reused, like torch's caching allocator on CUDA. The cost:
    the heap keeps its high-water mark until the process ends and fragments a little (that
    layer's peak resident memory: 724 MB against 635 MB). ``sciformer train`` and ``pretrain`` apply it when
    the command is the process; ``SCIFORMER_MALLOC=system`` keeps the system's default.
    Not glibc (macOS, Windows, musl): nothing is changed.
    """
    if os.environ.get("SCIFORMER_MALLOC", "") == "system" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(libc.mallopt(m_mmap_threshold, limit)) and bool(libc.mallopt(m_trim_threshold, limit))
