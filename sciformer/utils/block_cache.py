"""Reuse of large CPU blocks across training steps (the cache behind ``empty_large``).

A point layer allocates the same per-edge blocks, tens of MB each, on every training step
and frees them at the end of the backward pass. Blocks above glibc's largest mmap threshold
(32 MiB) go back to the system when freed, so every step pays page faults and the
kernel's zeroing of fresh pages again; on a busy machine that cost grows to several times
the work done on the block. This cache keeps freed blocks and hands them out again, as
PyTorch's CUDA caching allocator does on a GPU:

- a block is free when no tensor uses its storage any more (the storage's reference count
  is back to the cache's own);
- a request takes the smallest free block that holds it and wastes at most a quarter of
  its size (otherwise a new block, a multiple of 2 MiB, starting on a 2 MiB boundary);
- a free block not taken again for ``max_idle`` requests is returned to the system, so
  memory held for sizes no longer used (a different cloud size, evaluation after
  training) goes back on its own; :func:`release_cached_blocks` returns all free blocks now.

What the cache holds is at most about the peak of the blocks in use at one time, which
the process has already needed. Contents of a block handed out are undefined (as
``torch.empty``). Where the reference count is unavailable (another PyTorch build) or
``enabled`` is False, every request allocates afresh.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

ALIGN = 2 << 20  # bytes: blocks start on, and are sized in, 2 MiB (a huge page)
enabled = True  # False: no reuse (every request allocates a new block)


def _use_count(block: torch.Tensor) -> int:
    """References to the block's storage (tensors and views on it, plus the temporary here)."""
    return int(torch._C._storage_Use_Count(block.untyped_storage()._cdata))


def _supported() -> bool:
    try:
        return _use_count(torch.empty(1)) > 0
    except (AttributeError, RuntimeError, TypeError):
        return False


@dataclass
class _Block:
    data: torch.Tensor  # (capacity,) uint8, 2 MiB aligned
    own_refs: int  # use count while only the cache holds it
    last_taken: int  # request counter at the last hand-out


class BlockCache:
    """Free-block cache for large CPU tensors; see the module docstring.

    ``max_idle``: requests after which an untaken free block is released;
    ``max_waste``: largest unused fraction of a block that may serve a request.
    """

    def __init__(self, min_bytes: int = 32 << 20, max_idle: int = 4096, max_waste: float = 0.25) -> None:
        self.min_bytes = min_bytes
        self.max_idle = max_idle
        self.max_waste = max_waste
        self._blocks: list[_Block] = []
        self._requests = 0
        self._lock = threading.Lock()
        self._supported: bool | None = None

    def take(self, nbytes: int) -> torch.Tensor:
        """A (nbytes,) uint8 CPU tensor starting on a 2 MiB boundary, from a free block if
        one fits, else newly allocated (and kept for reuse once freed)."""
        if self._supported is None:
            self._supported = _supported()
        if not (enabled and self._supported) or nbytes < self.min_bytes:
            return _aligned(nbytes)
        with self._lock:
            self._requests += 1
            best: _Block | None = None
            kept = []
            for block in self._blocks:
                if _use_count(block.data) > block.own_refs:
                    kept.append(block)  # in use
                    continue
                if self._requests - block.last_taken > self.max_idle:
                    continue  # idle too long: dropped from the cache, freed
                kept.append(block)
                cap = block.data.numel()
                fits = nbytes <= cap and cap - nbytes <= self.max_waste * cap
                if fits and (best is None or cap < best.data.numel()):
                    best = block
            self._blocks = kept
            if best is None:
                data = _aligned(-(-nbytes // ALIGN) * ALIGN)
                best = _Block(data, _use_count(data), 0)
                self._blocks.append(best)
            best.last_taken = self._requests
            return best.data[:nbytes]

    def release(self) -> int:
        """Return every free block to the system; the number of bytes released."""
        with self._lock:
            free = [b for b in self._blocks if _use_count(b.data) <= b.own_refs]
            self._blocks = [b for b in self._blocks if _use_count(b.data) > b.own_refs]
            return sum(b.data.numel() for b in free)

    def cached_bytes(self) -> tuple[int, int]:
        """(bytes of all blocks held, bytes of the free ones among them)."""
        with self._lock:
            total = sum(b.data.numel() for b in self._blocks)
            free = sum(b.data.numel() for b in self._blocks if _use_count(b.data) <= b.own_refs)
            return total, free


def _aligned(nbytes: int) -> torch.Tensor:
    """A fresh (nbytes,) uint8 CPU tensor starting on a 2 MiB boundary."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    skip = -raw.data_ptr() % ALIGN
    return raw[skip : skip + nbytes]


CACHE = BlockCache()


def release_cached_blocks() -> int:
    """Return the free blocks kept by ``empty_large`` to the system (e.g. after training,
    before a memory-hungry job); the number of bytes released."""
    return CACHE.release()
