"""Chunk workers of the point attention (``sciformer.attention._neighborhood_parallel``)."""

from __future__ import annotations

import pytest


def _cannot_start(self: object) -> None:
    raise RuntimeError("can't start new thread")  # what CPython raises where pthread_create fails


@pytest.mark.parametrize("compiled", [False, True], ids=["torch operations", "compiled stages"])
def test_workers_that_cannot_be_started_leave_the_chunks_to_the_calling_thread(
        compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no thread can be started (a process or memory limit), forward and backward run
    the workers' shares in the calling thread and give exactly the two-worker result instead
    of waiting forever for workers (torch operations); the compiled stages, whose OpenMP
    runtime would end the process where it cannot start a thread, run on one thread and give
    the same result. Thread start failure is simulated where CPython reports it (a real
    address-space limit also stops torch's own OpenMP threads, which end the process)."""
    import threading

    import torch

    from sciformer.attention import PointTransformerLayer
    from sciformer.attention import _neighborhood_native as native
    from sciformer.attention import _neighborhood_parallel as par
    from sciformer.geometry import knn

    if compiled and native.library() is None:
        pytest.skip("compiled stages not built")
    monkeypatch.setattr(native, "enabled", compiled)
    before = torch.get_num_threads()
    torch.manual_seed(0)
    x, pos = torch.randn(3000, 32), torch.rand(3000, 3)
    idx = knn(pos, pos, 16).index
    layer = PointTransformerLayer(32, 32, share_planes=4, chunk_size=128).train()

    def step() -> list[torch.Tensor]:
        xg = x.clone().requires_grad_()
        layer.zero_grad()
        y = layer(xg, pos, idx)
        y.square().sum().backward()
        return [y.detach(), xg.grad, *(p.grad.clone() for p in layer.parameters())]

    try:
        torch.set_num_threads(2)
        pooled = step()  # the oracle: two workers in their own threads (or two OpenMP threads)
        if par._pool is not None:
            par._pool.shutdown()
        monkeypatch.setattr(par, "_pool", None)  # the next call must start new threads
        monkeypatch.setattr(par, "_openmp_started", set())  # and probe them again
        monkeypatch.setattr(threading.Thread, "start", _cannot_start)
        limited = step()
        assert par._pool is None and par.openmp_threads(2) == 1 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(pooled, limited, strict=True))


def test_a_pool_that_failed_to_grow_is_never_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old pool is shut down before a pool of another size starts; where that start fails,
    a later call of the old size must start afresh, not get the shut-down pool back."""
    import threading

    import torch

    from sciformer.attention import _neighborhood_parallel as par

    def job(part: list[tuple[int, int]]) -> int:
        return sum(e - s for s, e in part)

    ranges = [(i, i + 1) for i in range(8)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert sum(par.run_chunks(job, ranges, torch.device("cpu"))) == 8  # a pool of 2
        torch.set_num_threads(3)
        real_start = threading.Thread.start
        monkeypatch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("can't start new thread")))
        assert par.run_chunks(job, ranges, torch.device("cpu")) == [3, 3, 2]  # no pool of 3: its shares in the calling thread
        monkeypatch.setattr(threading.Thread, "start", real_start)
        torch.set_num_threads(2)
        assert sum(par.run_chunks(job, ranges, torch.device("cpu"))) == 8  # a fresh pool of 2
    finally:
        torch.set_num_threads(before)


def test_chunk_workers_run_their_operations_single_threaded() -> None:
    """torch's lazy per-thread start gave each worker the process's count, whatever it set
    before (oversubscribing the cores). While the workers
    run, torch's count is 1 in each of them; afterwards the caller's count is back."""
    import torch

    from sciformer.attention import _neighborhood_parallel as par

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = par.run_chunks(lambda part: (torch.get_num_threads(), torch.is_grad_enabled()), [(0, 1), (1, 2), (2, 3)],
                              torch.device("cpu"))
        assert seen == [(1, False), (1, False)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_callers_in_several_threads_leave_the_thread_count_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads running chunk jobs at once: the count is 1 while any workers run and the
    caller's count afterwards (one saving 1 as 'the previous count' would leave it at 1)."""
    import threading
    import time

    import torch

    from sciformer.attention import _neighborhood_parallel as par

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(par, "num_workers", lambda device, chunks: 2)  # callers that came in while others run pool too
    seen: list[int] = []

    def job(part):
        time.sleep(0.002)
        seen.append(torch.get_num_threads())
        return len(part)

    def caller() -> None:
        for _ in range(40):
            par.run_chunks(job, [(0, 1), (1, 2)], torch.device("cpu"))

    try:
        threads = [threading.Thread(target=caller) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert torch.get_num_threads() == 2
        assert set(seen) == {1}
    finally:
        torch.set_num_threads(previous)


def test_a_pool_shut_down_by_another_caller_leaves_the_call_to_its_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread asking for a pool of another size shuts down the one this call got, before
    this call submits: the call works alone and gives the whole answer."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from sciformer.attention import _neighborhood_parallel as par

    gone = ThreadPoolExecutor(max_workers=2)
    gone.shutdown()
    monkeypatch.setattr(par, "num_workers", lambda device, chunks: 2)
    monkeypatch.setattr(par, "_start_pool", lambda size: gone)
    parts = par.run_chunks(lambda part: sum(b - a for a, b in part), [(0, 3), (3, 5), (5, 9)], torch.device("cpu"))
    assert parts == [3 + 4, 2]  # the two workers' shares, as the pool would have given them
