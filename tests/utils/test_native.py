"""ctypes helpers: optional compiled libraries and glibc's malloc settings for training."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from sciformer.utils.native import load_library

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")

# A child that, like a training step, allocates three 64 MB tensors (above glibc's largest
# dynamic mmap threshold, 32 MB), writes every page and frees them, round after round; it
# prints the page faults of the last rounds (the heap settles within a few rounds).
_CHILD = """
import resource, sys
import torch
from sciformer.utils.native import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensors = [torch.empty(16 * 2**20) for _ in range(3)]
    for t in tensors:
        t.fill_(1.0)
    del tensors, t
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, max(faults[-3:]))
"""


def _child(mode: str, env_extra: dict[str, str] | None = None) -> tuple[bool, int]:
    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, env=env, check=True).stdout
    applied, faults = out.split()
    return applied == "True", int(faults)


@glibc
def test_keep_freed_memory_stops_refaulting_large_blocks():
    applied, kept = _child("keep")
    assert applied
    _, system = _child("system")
    pages = 3 * 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert system >= pages // 2  # glibc's default maps the blocks anew every round
    assert kept < pages // 20  # kept in the heap: reused without touching the kernel


@glibc
def test_keep_freed_memory_opt_out():
    applied, faults = _child("keep", {"SCIFORMER_MALLOC": "system"})
    assert not applied
    assert faults >= 3 * 64 * 2**20 // os.sysconf("SC_PAGE_SIZE") // 2


def test_load_library_absent_is_none(tmp_path: Path):
    assert load_library(tmp_path, "_no_such_kernel") is None


def test_pointer_refuses_non_contiguous_and_maps_none_to_null():
    import torch

    from sciformer.utils.native import pointer

    t = torch.zeros(4, 3)
    assert pointer(t) == t.data_ptr()
    assert pointer(None) is None
    with pytest.raises(ValueError, match="contiguous"):
        pointer(t.t())
