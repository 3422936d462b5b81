"""The block cache behind ``empty_large``: reuse only of blocks no tensor uses, bounded
waste and idle time, release, and the fallbacks."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from sciformer.utils import block_cache
from sciformer.utils.block_cache import ALIGN, BlockCache
from sciformer.utils.native import empty_large

MB = 1 << 20


@pytest.fixture
def cache() -> BlockCache:
    return BlockCache(min_bytes=2 * MB, max_idle=1000, max_held=100.0)  # bound tested apart


def span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def test_blocks_are_aligned_sized_and_reused_only_once_free(cache: BlockCache) -> None:
    a = cache.take(5 * MB + 3)
    assert a.dtype == torch.uint8 and a.numel() == 5 * MB + 3
    assert a.data_ptr() % ALIGN == 0
    b = cache.take(5 * MB + 3)  # a is alive: another block
    assert span(a)[1] <= span(b)[0] or span(b)[1] <= span(a)[0]
    pa = a.data_ptr()
    del a
    c = cache.take(5 * MB)
    assert c.data_ptr() == pa  # a's block, free again
    assert cache.cached_bytes() == (12 * MB, 0)  # two blocks of 6 MiB, both in use


def test_any_view_or_saved_tensor_keeps_a_block_in_use(cache: BlockCache) -> None:
    a = cache.take(4 * MB)
    view = a[MB:].view(torch.float32)[7:100]
    pa = a.data_ptr()
    del a
    assert cache.take(4 * MB).data_ptr() != pa  # the view still reads the block

    class Saves(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            buf = cache.take(4 * MB).view(torch.float32)[: x.numel()]
            buf.copy_(x)
            ctx.save_for_backward(buf)
            return x * 2

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            (buf,) = ctx.saved_tensors
            return g * buf

    x = torch.randn(100, requires_grad=True)
    y = Saves.apply(x)
    free_before = cache.cached_bytes()[1]
    busy = [cache.take(4 * MB).fill_(0) for _ in range(3)]  # none of them may be the saved block
    y.sum().backward()
    assert torch.equal(x.grad, x.detach())  # the saved copy was not overwritten
    assert free_before == 0 and len({t.data_ptr() for t in busy}) == 3
    del view


def test_a_block_serves_only_requests_it_does_not_waste_a_quarter_of(cache: BlockCache) -> None:
    big = cache.take(40 * MB)
    p = big.data_ptr()
    del big
    small = cache.take(20 * MB)  # half of the 40 MiB block would be wasted: a new block
    assert small.data_ptr() != p
    near = cache.take(31 * MB)  # 9 of 40 MiB unused: within a quarter
    assert near.data_ptr() == p


def test_the_smallest_fitting_free_block_is_taken(cache: BlockCache) -> None:
    blocks = [cache.take(n * MB) for n in (10, 8, 9)]
    ptrs = [b.data_ptr() for b in blocks]
    del blocks
    assert cache.take(7 * MB).data_ptr() == ptrs[1]  # the 8 MiB block


def test_idle_free_blocks_go_back_and_busy_ones_stay() -> None:
    cache = BlockCache(min_bytes=2 * MB, max_idle=3)
    busy = cache.take(6 * MB)
    idle = cache.take(4 * MB)
    del idle
    for _ in range(4):  # four requests for another size: the 4 MiB block is never taken
        t = cache.take(10 * MB)
        del t
    total, free = cache.cached_bytes()
    assert total == 16 * MB and free == 10 * MB  # the 6 MiB in use, the 10 MiB just freed
    assert busy.numel() == 6 * MB


def test_release_returns_free_blocks_only(cache: BlockCache) -> None:
    keep = cache.take(6 * MB)
    for n in (4, 8):
        t = cache.take(n * MB)
        del t
    assert cache.release() == 12 * MB
    assert cache.cached_bytes() == (6 * MB, 0)
    del keep
    assert cache.release() == 6 * MB and cache.cached_bytes() == (0, 0)


def test_small_requests_disabled_cache_and_missing_counter_allocate_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BlockCache(min_bytes=8 * MB)
    t = cache.take(4 * MB)
    assert t.numel() == 4 * MB and t.data_ptr() % ALIGN == 0 and cache.cached_bytes() == (0, 0)
    monkeypatch.setattr(block_cache, "enabled", False)
    assert cache.take(16 * MB).numel() == 16 * MB and cache.cached_bytes() == (0, 0)
    monkeypatch.setattr(block_cache, "enabled", True)
    unsupported = BlockCache(min_bytes=MB)
    monkeypatch.setattr(torch._C, "_storage_Use_Count", None, raising=False)  # another PyTorch build
    assert unsupported.take(4 * MB).numel() == 4 * MB and unsupported.cached_bytes() == (0, 0)


def test_random_traffic_never_hands_out_a_block_in_use_and_stays_bounded() -> None:
    """Property: over random takes and frees of varying sizes from four threads, live
    tensors never overlap, each keeps what was written into it, and the cache holds at
    most about the peak of what was in use at once."""
    cache = BlockCache(min_bytes=2 * MB, max_idle=50)
    live: list[tuple[torch.Tensor, int]] = []
    lock = threading.Lock()
    peak = [0]
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[tuple[torch.Tensor, int]] = []
        for step in range(150):
            if mine and rng.random() < 0.45:
                t, mark = mine.pop(rng.randrange(len(mine)))
                if int(t[0]) != mark or int(t[-1]) != mark:
                    errors.append(f"block overwritten while in use (seed {seed}, step {step})")
                with lock:
                    del live[next(i for i, (x, _) in enumerate(live) if x is t)]
                continue
            t = cache.take(rng.randint(2 * MB, 12 * MB))
            mark = rng.randrange(1, 255)
            t[0], t[-1] = mark, mark
            with lock:
                for other, _ in live:
                    a, b = span(t), span(other)
                    if a[0] < b[1] and b[0] < a[1]:
                        errors.append("two live tensors share memory")
                live.append((t, mark))
                peak[0] = max(peak[0], sum(x.numel() for x, _ in live))
            mine.append((t, mark))

    def guarded(seed: int) -> None:
        try:
            worker(seed)
        except Exception as exc:  # noqa: BLE001 - any failure in a thread fails the test
            errors.append(repr(exc))

    threads = [threading.Thread(target=guarded, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    total, _ = cache.cached_bytes()
    # blocks are rounded up to 2 MiB and may be up to 4/3 of a request; idle ones go back
    assert total <= 4 / 3 * peak[0] + 8 * ALIGN


def test_empty_large_reuses_the_block_of_a_freed_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    from sciformer.utils import native

    monkeypatch.setattr(native, "CACHE", BlockCache())
    like = torch.empty(0)
    n = (40 * MB) // 4
    a = empty_large(like, (n // 8, 8))
    assert a.shape == (n // 8, 8) and a.dtype == torch.float32 and a.data_ptr() % ALIGN == 0
    pa = a.data_ptr()
    a.fill_(1.0)
    b = empty_large(like, (n // 8, 8))
    assert b.data_ptr() != pa
    b.fill_(2.0)
    assert bool((a == 1.0).all())
    del a
    c = empty_large(like, (n,))
    assert c.data_ptr() == pa
    d = empty_large(torch.empty(0, dtype=torch.float64), (n // 2,))
    assert d.dtype == torch.float64 and d.data_ptr() not in (pa, b.data_ptr())  # both in use


@pytest.mark.parametrize("mib", [2, 3, 31])
def test_the_default_cache_reuses_blocks_from_2_mib(mib: int) -> None:
    """Blocks of 2 MiB and more are kept (glibc's heap gave such blocks back to the system
    between steps too, and each step faulted them in again); smaller ones are not."""
    cache = BlockCache()
    a = cache.take(mib * MB)
    pa = a.data_ptr()
    del a
    assert cache.take(mib * MB).data_ptr() == pa
    assert cache.cached_bytes()[0] == -(-mib * MB // ALIGN) * ALIGN
    small = cache.take(ALIGN - 1)
    assert small.numel() == ALIGN - 1 and cache.cached_bytes()[0] == -(-mib * MB // ALIGN) * ALIGN  # not kept


@pytest.mark.parametrize("keep", ["untyped_storage", "storage"])
def test_a_kept_storage_object_keeps_its_block_in_use(cache: BlockCache, keep: str) -> None:
    a = cache.take(4 * MB)
    a.fill_(1)
    with pytest.warns(UserWarning) if keep == "storage" else _no_warning():
        held = getattr(a, keep)()
    pa, off = a.data_ptr(), a.storage_offset()
    del a
    b = cache.take(4 * MB)
    assert b.data_ptr() != pa
    b.fill_(7)
    assert held[off] == 1 and held[off + 4 * MB - 1] == 1


def _no_warning():
    import contextlib

    return contextlib.nullcontext()


def test_shared_blocks_leave_the_cache_and_blocks_cannot_be_resized(cache: BlockCache) -> None:
    shared = cache.take(4 * MB)
    shared.share_memory_()  # e.g. sent to another process, which may still read it
    p_shared = shared.data_ptr()
    fixed = cache.take(4 * MB).fill_(5)
    with pytest.raises(RuntimeError, match="not resizable"):
        fixed.untyped_storage().resize_(0)
    assert int(fixed[0]) == 5 and int(fixed[-1]) == 5  # still the cache's block, intact
    p_fixed = fixed.data_ptr()
    reader = shared[:]  # the other process's view: the shared block stays mapped (were it unmapped,
    del shared, fixed  # a fresh block could be mapped at its address again, rightly)
    assert cache.cached_bytes() == (4 * MB, 4 * MB)  # the shared one is not the cache's any more
    fresh = [cache.take(4 * MB) for _ in range(2)]
    assert p_shared not in {t.data_ptr() for t in fresh} and p_fixed in {t.data_ptr() for t in fresh}
    assert reader.data_ptr() == p_shared
    assert all(t.data_ptr() % ALIGN == 0 and int(t.fill_(3)[-1]) == 3 for t in fresh)


def test_held_bytes_stay_near_the_peak_in_use_for_growing_and_random_sizes() -> None:
    cache = BlockCache(min_bytes=2 * MB)  # default max_held 1.25, max_idle 4096
    peak = 0
    rng = random.Random(5)
    sizes = [2 * MB + 3 * MB * i for i in range(40)] + [rng.randint(2 * MB, 64 * MB) for _ in range(300)]
    for n in sizes:  # one block in use at a time
        t = cache.take(n)
        peak = max(peak, -(-n // ALIGN) * ALIGN)
        total, _ = cache.cached_bytes()
        assert total <= 1.25 * peak + ALIGN, (n, total, peak)
        del t


def test_blocks_made_in_inference_mode_serve_training(cache: BlockCache) -> None:
    with torch.inference_mode():
        t = cache.take(4 * MB)
        assert not t.is_inference()
    del t
    x = torch.randn(100, requires_grad=True)
    buf = cache.take(4 * MB).view(torch.float32)[:100]
    assert not buf.is_inference()
    (buf.copy_(x) * x).sum().backward()  # usable in autograd


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_fork_while_another_thread_holds_the_lock_leaves_the_child_usable(cache: BlockCache) -> None:
    import os

    cache.take(4 * MB)  # the cache is set up
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._lock:
            holding.set()
            release.wait(10)

    th = threading.Thread(target=hold)
    th.start()
    holding.wait(10)
    pid = os.fork()
    if pid == 0:  # child: the lock's holder does not exist here
        code = 0 if cache.take(4 * MB).numel() == 4 * MB else 1
        os._exit(code)
    release.set()
    th.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
