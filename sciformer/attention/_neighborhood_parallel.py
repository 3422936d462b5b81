"""Chunk-level CPU parallelism for the fused neighbourhood-attention passes.

A chunked pass issues a few dozen tensor operations per chunk of points. With intra-op
(OpenMP) threading every one of them is a parallel region ending in a barrier, and on a
loaded machine a barrier waits for a descheduled thread (measured here: a layer 5-10x
slower with 2 threads than with 1 while other processes ran). Instead, chunks are spread
over worker threads that each run their operations single-threaded: no barrier per
operation, and each worker's chunk stays in its own core's cache. The workers run with one
intra-op thread. torch gives a thread the process-wide count at that thread's first parallel
operation (a lazy per-thread start), which overrode a worker's own earlier
``set_num_threads(1)``; so the process-wide count is 1 while workers run (the calling threads
only wait for them), the count a worker takes then, and is restored when they are done.

Chunks are assigned statically (worker w takes chunks w, w + T, ...) and per-worker
partial sums are combined in worker order, so results are reproducible for a given
thread count.

The compiled stages (``_neighborhood_native``) do not use these threads: their chunk loops
run inside the library on the OpenMP threads torch's own operations use. Threads of our own
beside those left torch's idle OpenMP threads spinning on the same cores (measured: a
v1 layer step 8 % slower at 2 threads). :func:`openmp_threads` only checks that threads
can be started, since the OpenMP runtime ends the process where it cannot start one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = -1


def _start_pool(size: int) -> ThreadPoolExecutor | None:
    """A pool of ``size`` threads, each with one intra-op thread; None where the threads
    cannot be started (a process or memory limit), so that the caller works alone."""
    global _pool, _pool_size, _pool_pid
    with _lock:
        if _pool is not None and _pool_size == size and _pool_pid == os.getpid():
            return _pool
        if _pool is not None and _pool_pid == os.getpid():
            _pool.shutdown(wait=False)
        _pool, _pool_size = None, 0  # never handed out again, whether the new pool starts or not
        started = threading.Barrier(size + 1)

        def init() -> None:
            started.wait()

        pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="sciformer-chunks")
        try:
            futures = [pool.submit(init) for _ in range(size)]  # one per thread: all block
        except RuntimeError:  # "can't start new thread": release those that did start
            started.abort()
            pool.shutdown(wait=True)
            return None
        started.wait()
        for f in futures:
            f.result()
        _pool, _pool_size, _pool_pid = pool, size, os.getpid()
        return pool


_openmp_started: set[tuple[int, int]] = set()  # (pid, threads) whose threads could start


def openmp_threads(count: int) -> int:
    """``count``, or 1 where ``count - 1`` threads besides the caller cannot be started now:
    for the compiled functions' OpenMP regions, whose runtime ends the process where it cannot
    start a thread. Tried once per process and count by starting (and joining) as many
    Python threads, which the same stack-size and process limits govern; a count that
    started once keeps its OpenMP threads, so it is not tried again."""
    if count <= 1 or (os.getpid(), count) in _openmp_started:
        return max(1, count)
    threads = [threading.Thread(target=lambda: None) for _ in range(count - 1)]
    started = []
    try:
        for t in threads:
            t.start()
            started.append(t)
    except RuntimeError:  # "can't start new thread"
        return 1
    finally:
        for t in started:
            t.join()
    _openmp_started.add((os.getpid(), count))
    return count


def ranges_and_threads() -> tuple[int, int]:
    """Row ranges of a compiled pass that sums over rows (one per intra-op thread; they set
    its result) and the OpenMP threads that run them (fewer where no more can start: the
    result is the same)."""
    workers = torch.get_num_threads()
    return workers, openmp_threads(workers)


def num_workers(device: torch.device, num_chunks: int) -> int:
    """Workers for ``num_chunks`` chunks: intra-op thread count on CPU, else 1."""
    if device.type != "cpu" or num_chunks < 2:
        return 1
    return max(1, min(torch.get_num_threads(), num_chunks))


def run_chunks(
    job: Callable[[list[tuple[int, int]]], R],
    ranges: list[tuple[int, int]],
    device: torch.device,
) -> list[R]:
    """Run ``job(ranges_of_worker)`` per worker without autograd; results in worker order.

    With one worker (GPU, one thread, one chunk) the job runs in the calling thread. Where
    the worker threads cannot be had (none can be started, or another caller's call replaced
    the pool), the calling thread runs each worker's share in turn, single-threaded as a
    worker would: the same parts, so the same sums as the pooled run, bit for bit.
    """
    workers = num_workers(device, len(ranges))
    if workers == 1:
        with torch.no_grad():
            return [job(ranges)]
    pool = _start_pool(workers)
    if pool is None:
        return _worker_shares_in_turn(job, ranges, workers)

    def run(part: list[tuple[int, int]]) -> R:
        with torch.no_grad():  # grad mode is per thread
            return job(part)

    with _single_threaded():  # each worker's operations single-threaded (a process-wide count, see above)
        futures = []
        try:
            for w in range(workers):
                futures.append(pool.submit(run, ranges[w::workers]))
        except RuntimeError:  # another thread's call replaced the pool meanwhile: this call works alone
            for f in futures:
                f.result()
            return _worker_shares_in_turn(job, ranges, workers)
        return [f.result() for f in futures]


def _worker_shares_in_turn(job: Callable[[list[tuple[int, int]]], R], ranges: list[tuple[int, int]], workers: int) -> list[R]:
    """Each worker's share of ``ranges`` run in the calling thread, one after another."""
    with _single_threaded(), torch.no_grad():
        return [job(ranges[w::workers]) for w in range(workers)]


_count_lock = threading.Lock()
_running = 0  # run_chunks calls (from any thread) with workers running
_saved_threads = 0  # the count before the first of them


@contextlib.contextmanager
def _single_threaded() -> Iterator[None]:
    """torch's thread count 1 while any caller's workers run; the first caller saves the count
    and the last one restores it (calls from several threads at once never leave it at 1)."""
    global _running, _saved_threads
    with _count_lock:
        if _running == 0:
            _saved_threads = torch.get_num_threads()
            torch.set_num_threads(1)
        _running += 1
    try:
        yield
    finally:
        with _count_lock:
            _running -= 1
            if _running == 0:
                torch.set_num_threads(_saved_threads)


def sum_parts(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Add per-worker partial results in worker order (None when not computed)."""
    if parts[0] is None:
        return None
    total = parts[0]
    for p in parts[1:]:
        assert p is not None
        total = total.add_(p)
    return total
