"""The chunk loops of the compiled v1 stages (``sf_va_*_chunks``: OpenMP threads).

Oracle: the per-chunk entry points called chunk by chunk from Python, worker w taking chunks
w, w + workers, ... into its own accumulators (the schedule the stages used before the loops
moved into the library). Every output must be equal bit for bit: set outputs per chunk,
accumulated ones per worker slice, moments per chunk; also when fewer OpenMP threads run
than workers (each thread then runs several workers' shares in turn), for any number of
chunks (one, fewer than workers, a remainder), and with outputs left out.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from sciformer.attention import _neighborhood_native as native
from sciformer.attention import _neighborhood_parallel as par

pytestmark = pytest.mark.skipif(native.library() is None, reason="compiled vector attention not built")

# (N, k, C, G, d, M, chunk): a remainder chunk; one chunk; fewer chunks than workers would
# be; G % 8 and d != 3 paths; many one-point chunks
CASES = [(70, 16, 32, 8, 3, 90, 16), (9, 5, 12, 4, 1, 11, 9), (10, 4, 16, 16, 2, 12, 7), (33, 3, 24, 24, 3, 40, 1)]


def inputs(case: tuple[int, ...], seed: int) -> dict[str, Tensor]:
    n, k, c, g, d, m, _ = case
    gen = torch.Generator().manual_seed(seed)
    sizes = {"A": (m, c), "B": (n, c), "P": (n, k, d), "WaT": (d, c), "W1": (g, c), "u": (n, k, g), "grad": (n, k, g),
             "cv": (g,), "cst": (g,), "s2": (g,), "t2": (g,), "W2": (g, g), "V": (m, c), "WpT": (d, c), "gy": (n, c)}
    x = {name: torch.randn(*s, generator=gen) for name, s in sizes.items()}
    x["idx"] = torch.randint(0, m, (n, k), generator=gen)
    x["W1t"], x["W2t"] = x["W1"].t().contiguous(), x["W2"].t().contiguous()
    return x


def shares(n: int, chunk: int, workers: int) -> list[list[tuple[int, int, int]]]:
    ranges = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    return [[(c, *ranges[c]) for c in range(w, len(ranges), workers)] for w in range(workers)]


@pytest.fixture(params=[2, 3], ids=lambda w: f"{w}workers")
def workers(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture(params=["threads", "one thread"])
def threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """All workers' threads, or one thread running every worker's share in turn."""
    if request.param == "one thread":
        monkeypatch.setattr(native, "openmp_threads", lambda count: 1)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.usefixtures("threads")
def test_forward_chunks_equal_per_chunk_calls(case: tuple[int, ...], workers: int) -> None:
    n, k, _, g, _, _, chunk = case
    x = inputs(case, seed=n)
    nchunks = -(-n // chunk)
    u = torch.full((n, k, g), float("nan"))
    mom = (torch.full((nchunks, g), float("nan"), dtype=torch.float64), torch.full((nchunks, g), float("nan"), dtype=torch.float64))
    native.stage1_forward_chunks(x["idx"], chunk, workers, x["A"], x["B"], x["P"], x["WaT"], x["W1t"], u, mom)
    want_u, want_mom = torch.empty_like(u), (torch.empty_like(mom[0]), torch.empty_like(mom[1]))
    for share in shares(n, chunk, workers):
        for c, s, e in share:
            native.stage1_forward(x["idx"][s:e], x["A"], x["B"][s:e], x["P"][s:e], x["WaT"], x["W1t"], want_u[s:e],
                                  (want_mom[0][c], want_mom[1][c]))
    assert torch.equal(u, want_u) and torch.equal(mom[0], want_mom[0]) and torch.equal(mom[1], want_mom[1])

    for keep in (True, False):  # the softmax kept, or only per chunk (no backward pass)
        p = torch.full((n, k, g), float("nan")) if keep else None
        y = torch.full((n, x["V"].shape[1]), float("nan"))
        args = (x["u"], x["s2"], x["t2"], x["W2t"], x["V"], x["P"], x["WpT"])
        native.stage2_forward_chunks(x["idx"], chunk, workers, *args, p, y)
        want_p, want_y = torch.empty(n, k, g), torch.empty_like(y)
        for s, e in ((s, e) for share in shares(n, chunk, workers) for _, s, e in share):
            native.stage2_forward(x["idx"][s:e], x["u"][s:e], *args[1:5], x["P"][s:e], x["WpT"], want_p[s:e], want_y[s:e])
        assert torch.equal(y, want_y) and (p is None or torch.equal(p, want_p))


ACC1 = {"gW1": "W1", "gA": "A", "gWaT": "WaT"}  # accumulated per worker; the others are set per chunk
ACC2 = {"gV": "V", "gWpT": "WpT", "gs2": "s2", "gt2": "t2", "gW2": "W2"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("left_out", [(), ("gA", "gP", "gV", "gu"), ("gW1", "gB", "gW2", "gs2", "gWpT")])
@pytest.mark.usefixtures("threads")
def test_backward_chunks_equal_per_chunk_calls(case: tuple[int, ...], workers: int, left_out: tuple[str, ...]) -> None:
    n, k, c, g, d, _, chunk = case
    x = inputs(case, seed=n + 1)

    def buffers(acc: dict[str, str], rows: dict[str, tuple[int, ...]]) -> dict[str, Tensor | None]:
        out: dict[str, Tensor | None] = {name: torch.zeros(workers, *x[src].shape) for name, src in acc.items()}
        out |= {name: torch.full(shape, float("nan")) for name, shape in rows.items()}
        return {name: None if name in left_out else t for name, t in out.items()}

    got1 = buffers(ACC1, {"gB": (n, c), "gP": (n, k, d)})
    want1 = buffers(ACC1, {"gB": (n, c), "gP": (n, k, d)})
    args1 = (x["u"], x["cv"], x["cst"], x["A"], x["B"], x["P"], x["WaT"], x["W1"])
    native.stage1_backward_chunks(x["idx"], chunk, workers, x["grad"], *args1, got1)
    got2 = buffers(ACC2, {"gP": (n, k, d), "gu": (n, k, g)})
    want2 = buffers(ACC2, {"gP": (n, k, d), "gu": (n, k, g)})
    p = torch.softmax(torch.randn(n, k, g), 1)
    args2 = (x["V"], x["P"], x["WpT"], x["u"], x["s2"], x["t2"], x["W2"])
    native.stage2_backward_chunks(x["idx"], chunk, workers, x["gy"], p, *args2, got2)

    def part(t: Tensor | None, w: int, s: int, e: int, per_worker: bool) -> Tensor | None:
        return None if t is None else (t[w] if per_worker else t[s:e])

    for w, share in enumerate(shares(n, chunk, workers)):
        for _, s, e in share:
            native.stage1_backward(x["idx"][s:e], x["grad"][s:e], x["u"][s:e], x["cv"], x["cst"], x["A"], x["B"][s:e],
                                   x["P"][s:e], x["WaT"], x["W1"], {n_: part(t, w, s, e, n_ in ACC1) for n_, t in want1.items()})
            native.stage2_backward(x["idx"][s:e], x["gy"][s:e], p[s:e], x["V"], x["P"][s:e], x["WpT"], x["u"][s:e], x["s2"],
                                   x["t2"], x["W2"], {n_: part(t, w, s, e, n_ in ACC2) for n_, t in want2.items()})
    for got, want in ((got1, want1), (got2, want2)):
        for name, t in got.items():
            assert (t is None) == (want[name] is None), name
            assert t is None or torch.equal(t, want[name]), name


def test_openmp_threads_fall_back_to_one_where_no_thread_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenMP runtime ends the process where it cannot start a thread: a count whose
    threads cannot be started now is 1 (and tried again next time); one that started is kept."""
    import threading

    monkeypatch.setattr(par, "_openmp_started", set())
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("can't start new thread")))
    assert par.openmp_threads(3) == 1 and par.openmp_threads(1) == 1
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert par.openmp_threads(3) == 3
    monkeypatch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("can't start new thread")))
    assert par.openmp_threads(3) == 3  # its threads exist in the runtime now
