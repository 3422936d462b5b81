"""Reuse of large CPU blocks across training steps (the cache behind ``empty_large``).

A point layer allocates the same per-edge blocks, tens of MB each, on every training step
and frees them at the end of the backward pass. Blocks above glibc's largest mmap threshold
(32 MiB) go back to the system when freed, so every step pays page faults and the
kernel's zeroing of fresh pages again; on a busy machine that cost grows to several times
the work done on the block. Smaller ones fare little better: as a step's temporaries come
and go, glibc trims the top of its heap, and a v1 layer step at 16k points took 3,400-7,200
page faults. This cache keeps freed blocks of 2 MiB and more and hands them out again, as
PyTorch's CUDA caching allocator does on a GPU:

- a block is free when nothing uses its storage any more: its C++ reference count (tensors
  and views) and the Python reference count of its storage object (``untyped_storage()``
  or ``storage()`` kept by a caller) are back to the cache's own. A block whose storage was
  resized, reallocated or moved to shared memory (``share_memory_``, sent to another
  process) leaves the cache for good: its memory is no longer the cache's to hand out;
- a request takes the smallest free block that holds it and wastes at most a quarter of
  its size (otherwise a new block, a multiple of 2 MiB on a private mapping of its own,
  starting on a 2 MiB boundary and advised onto huge pages; its storage cannot be resized);
- the blocks held stay within ``max_held`` times the peak of the blocks in use at one time
  (least recently taken free blocks go first), and a free block not taken again for
  ``max_idle`` requests is returned to the system, so memory held for sizes no longer
  used (growing or varying cloud sizes, evaluation after training) goes back on its own;
  :func:`release_cached_blocks` returns all free blocks now.

Contents of a block handed out are undefined (as ``torch.empty``); blocks are never
inference tensors. Where the reference counts are unavailable (another PyTorch build) or
``enabled`` is False, every request allocates afresh.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import weakref
from dataclasses import dataclass

import torch

ALIGN = 2 << 20  # bytes: blocks start on, and are sized in, 2 MiB (a huge page)
enabled = True  # False: no reuse (every request allocates a new block)
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
_libc: ctypes.CDLL | None = None


def _refs(block: torch.Tensor) -> tuple[int, int]:
    """(C++ references to the block's storage, Python references to its storage object),
    each including the temporaries of this call."""
    storage = block.untyped_storage()
    return int(torch._C._storage_Use_Count(storage._cdata)), sys.getrefcount(storage)


def _supported() -> bool:
    try:
        return _refs(torch.empty(1))[0] > 0
    except (AttributeError, RuntimeError, TypeError):
        return False


@dataclass(eq=False)  # identity: blocks hold tensors
class _Block:
    data: torch.Tensor  # (capacity,) uint8, 2 MiB aligned
    own: tuple[int, int]  # _refs while only the cache holds it
    address: int  # data_ptr and storage size at creation: a change means the storage
    storage_bytes: int  # was resized, reallocated or shared, and the block is not ours
    last_taken: int  # request counter at the last hand-out

    @classmethod
    def new(cls, nbytes: int) -> _Block:
        """A block on a fresh mapping of ``nbytes`` (a multiple of 2 MiB)."""
        data = _mapped(nbytes)
        storage = data.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        del storage
        return cls(data, _refs(data), address, size, 0)

    def state(self) -> str:
        """'free', 'busy' or 'gone' (storage changed: dropped from the cache)."""
        storage = self.data.untyped_storage()
        if storage.data_ptr() != self.address or storage.nbytes() != self.storage_bytes or storage.is_shared():
            return "gone"
        del storage
        refs = _refs(self.data)
        return "free" if refs[0] <= self.own[0] and refs[1] <= self.own[1] else "busy"


class BlockCache:
    """Free-block cache for large CPU tensors; see the module docstring.

    ``min_bytes``: smaller requests are allocated afresh; ``max_idle``: requests after which
    an untaken free block is released; ``max_waste``: largest unused fraction of a block
    that may serve a request; ``max_held``: bound on the bytes held, as a multiple of the
    peak bytes of blocks in use at one time.
    """

    def __init__(
        self, min_bytes: int = ALIGN, max_idle: int = 4096, max_waste: float = 0.25, max_held: float = 1.25
    ) -> None:
        self.min_bytes = min_bytes
        self.max_idle = max_idle
        self.max_waste = max_waste
        self.max_held = max_held
        self._blocks: list[_Block] = []
        self._requests = 0
        self._peak = 0
        self._lock = threading.Lock()
        self._supported: bool | None = None
        if hasattr(os, "register_at_fork"):  # a fork while another thread holds the lock
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _reset_lock(ref))

    def take(self, nbytes: int) -> torch.Tensor:
        """A (nbytes,) uint8 CPU tensor starting on a 2 MiB boundary and advised onto huge
        pages: from a free block if one fits, else newly allocated (and kept for reuse once
        freed); below ``min_bytes`` always newly allocated, not kept."""
        if self._supported is None:
            self._supported = _supported()
        if not (enabled and self._supported) or nbytes < self.min_bytes:
            return _aligned(nbytes)
        with self._lock:
            self._requests += 1
            best: _Block | None = None
            busy: list[_Block] = []
            free: list[_Block] = []
            for block in self._blocks:
                state = block.state()
                if state == "busy":
                    busy.append(block)
                elif state == "free" and self._requests - block.last_taken <= self.max_idle:
                    free.append(block)  # (idle too long or gone: dropped, freed by the last user)
                    cap = block.data.numel()
                    fits = nbytes <= cap and cap - nbytes <= self.max_waste * cap
                    if fits and (best is None or cap < best.data.numel()):
                        best = block
            if best is None:
                best = _Block.new(-(-nbytes // ALIGN) * ALIGN)
            else:
                free.remove(best)
            best.last_taken = self._requests
            busy.append(best)
            in_use = sum(b.data.numel() for b in busy)
            self._peak = max(self._peak, in_use)
            free.sort(key=lambda b: b.last_taken)  # least recently taken first
            held = in_use + sum(b.data.numel() for b in free)
            while free and held > self.max_held * self._peak:
                held -= free.pop(0).data.numel()
            self._blocks = busy + free
            return best.data[:nbytes]

    def release(self) -> int:
        """Return every free block to the system; the number of bytes released."""
        with self._lock:
            states = [(b, b.state()) for b in self._blocks]
            self._blocks = [b for b, state in states if state == "busy"]
            return sum(b.data.numel() for b, state in states if state == "free")

    def cached_bytes(self) -> tuple[int, int]:
        """(bytes of all blocks held, bytes of the free ones among them)."""
        with self._lock:
            states = [(b.data.numel(), b.state()) for b in self._blocks]
            total = sum(n for n, state in states if state != "gone")
            return total, sum(n for n, state in states if state == "free")


def _reset_lock(ref: weakref.ref) -> None:
    cache = ref()
    if cache is not None:
        cache._lock = threading.Lock()


def _advise_huge(address: int, nbytes: int) -> None:
    """Ask Linux to back the whole 2 MiB pages inside [address, address + nbytes) with huge
    pages when first touched; silently nothing where unsupported."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    start = -(-address // ALIGN) * ALIGN
    end = (address + nbytes) // ALIGN * ALIGN
    if end > start:
        _libc.madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failures are harmless


def _aligned(nbytes: int) -> torch.Tensor:
    """A fresh (nbytes,) uint8 CPU tensor from torch's allocator, starting on a 2 MiB
    boundary and advised onto huge pages (never an inference tensor, whatever mode the
    caller is in)."""
    with torch.inference_mode(False):
        raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
        skip = -raw.data_ptr() % ALIGN
        out = raw[skip : skip + nbytes]
    _advise_huge(out.data_ptr(), nbytes)
    return out


def _mapped(nbytes: int) -> torch.Tensor:
    """A (nbytes,) uint8 tensor on a fresh private anonymous mapping of its own, starting on
    a 2 MiB boundary and advised onto transparent huge pages (unmapped once nothing uses
    it). Its own mapping, not glibc's heap: never pages another allocation faulted in
    before, and its storage cannot be resized. ``_aligned`` where mmap lacks the flags.
    A mapping the system refuses raises MemoryError naming the size."""
    if not all(hasattr(mmap, f) for f in ("MAP_PRIVATE", "MAP_ANONYMOUS")):
        return _aligned(nbytes)
    try:
        mapping = mmap.mmap(-1, nbytes + ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as exc:  # ENOMEM: as torch's own allocator, an allocation that failed
        raise MemoryError(f"Tried to allocate {nbytes} bytes ({exc.strerror})") from exc
    with torch.inference_mode(False):
        raw = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
        skip = -raw.data_ptr() % ALIGN
        out = raw[skip : skip + nbytes]
    _advise_huge(out.data_ptr(), nbytes)
    return out


CACHE = BlockCache()


def release_cached_blocks() -> int:
    """Return the free blocks kept by ``empty_large`` to the system (e.g. after training,
    before a memory-hungry job); the number of bytes released."""
    return CACHE.release()
