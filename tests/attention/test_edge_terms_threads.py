"""The position passes of ``_edge_terms`` with their queries split over threads.

``position_sums`` and the ``rel_*`` passes split the queries of a large index into one
range per thread; sums over all edges and scatters to source rows go through one buffer
per range (one per intra-op thread), added in range order. Oracles: the same pass on one
thread (one range, the function itself) and float64 torch formulas. Per-query outputs must
not change at all with the thread count; sums only by rounding; a thread count must give
the same bits every time, also where fewer OpenMP threads start. The index is large enough to be split (2^18 values or more) and leaves sources
unread, one of them NaN (never to be read).
"""

from __future__ import annotations

import pytest
import torch
from kernel_paths import close, needs_lib

from sciformer.attention import _edge_terms as et
from sciformer.attention import _neighborhood_parallel as par

pytestmark = needs_lib
THREADS = [2, 3, 4, 11]  # 11: more than the 8 ranges of the scattering passes
N, K, D, M = 5501, 16, 3, 6400  # 264,048 offsets and position terms: split


@pytest.fixture(scope="module")
def data() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    read = torch.randperm(M, generator=gen)[: M - 300]  # 300 sources no edge reads
    idx = read[torch.randint(0, len(read), (N, K), generator=gen)]
    for i in range(N):  # every query is also a source (pos[:N] are the queries)
        idx[i, 0] = i
    unread = torch.ones(M, dtype=torch.bool)
    unread[idx.reshape(-1)] = False
    pos = torch.rand(M, D, generator=gen) * 5 + 2
    pos[int(unread.nonzero()[0])] = float("nan")
    h = 5
    WT, b = torch.randn(D, h, generator=gen) / D**0.5, torch.randn(h, generator=gen) * 0.3
    P = torch.randn(N, K, D, generator=gen)
    return {"idx": idx, "pos": pos, "WT": WT, "b": b, "W": WT.t().contiguous(), "gout": torch.randn(N, K, h, generator=gen),
            "P": P, "mP": P.reshape(-1, D).mean(0), "gm": torch.randn(D, generator=gen), "Gs": torch.eye(D) * 0.7,
            "mean": torch.randn(D, generator=gen), "shift": torch.tensor([0.1, -0.2, 0.05], dtype=torch.float64)}


def run_all(x: dict[str, torch.Tensor], threads: int, granted: int | None = None) -> dict[str, torch.Tensor]:
    """Every pass with ``threads`` intra-op threads (the ranges), on ``granted`` OpenMP threads
    (default: as many)."""
    before, probe = torch.get_num_threads(), par.openmp_threads
    try:
        torch.set_num_threads(threads)
        if granted is not None:
            par.openmp_threads = lambda count: granted
        return _passes(x)
    finally:
        torch.set_num_threads(before)
        par.openmp_threads = probe


def _passes(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = et.rel_linear_relu(x["pos"], x["idx"], x["WT"], x["b"])
    s, cross = et.rel_moments(x["pos"], x["idx"], x["shift"], cross=True)
    gWT, gb = et.rel_grad_params(x["pos"], x["idx"], out, x["gout"])
    gpos = et.rel_grad_pos(x["pos"], x["idx"], out, x["gout"], x["W"], (x["gm"], x["Gs"], x["mean"]))
    pscat, psum, gram, total = et.position_sums(x["P"], x["mP"], x["idx"], M, torch.float64)
    return {"out": out, "sum": s, "cross": cross, "gWT": gWT, "gb": gb, "gpos": gpos,
            "pscat": pscat, "psum": psum, "gram": gram, "total": total}


PER_QUERY = ("out", "psum")


@pytest.mark.parametrize("threads", THREADS)
def test_split_queries_match_one_thread(data, threads):
    one = run_all(data, 1)
    many = run_all(data, threads)
    again = run_all(data, threads)
    alone = run_all(data, threads, granted=1)  # no thread could start: the ranges in turn
    for name, want in one.items():
        got = many[name]
        assert torch.equal(got, again[name]), f"{name}: not the same bits twice at {threads} threads"
        assert torch.equal(got, alone[name]), f"{name}: depends on the threads granted"
        if name in PER_QUERY:
            assert torch.equal(got, want), f"{name} changed with the thread count"
        else:
            close(got, want, 1e-5 if got.dtype == torch.float32 else 1e-9, name)
    assert not any(torch.isnan(t).any() for t in many.values())  # the NaN source is never read


def test_split_queries_against_float64(data):
    got = run_all(data, 3)
    idx, n = data["idx"], data["idx"].shape[0]
    pos64 = data["pos"].double().requires_grad_()
    r = pos64[idx] - pos64[:n, None]  # (n, k, D) offsets
    hidden = (r @ data["WT"].double() + data["b"].double()).relu()
    rm = r - data["mean"].double()
    loss = (hidden * data["gout"].double()).sum() + (r @ data["gm"].double()).sum() + 0.5 * ((rm @ data["Gs"].double()) * rm).sum()
    (gpos,) = torch.autograd.grad(loss, [pos64])
    rs = (r.detach() - data["shift"]).reshape(-1, D)
    close(got["out"], hidden.detach(), 2e-5, "out")
    close(got["sum"], rs.sum(0), 1e-6, "sum", scale=rs.abs().sum(0).max())
    close(got["cross"], rs.t() @ rs, 1e-6, "cross")
    mask = (hidden > 0).double() * data["gout"].double()  # (n, k, H) ReLU gradient
    close(got["gWT"], r.detach().reshape(-1, D).t() @ mask.reshape(-1, mask.shape[-1]), 1e-5, "gWT")
    close(got["gb"], mask.reshape(-1, mask.shape[-1]).sum(0), 1e-5, "gb")
    close(got["gpos"][torch.isfinite(data["pos"]).all(1)], gpos[torch.isfinite(data["pos"]).all(1)], 5e-5, "gpos")
    Pc = (data["P"].double() - data["mP"].double()).reshape(-1, D)
    close(got["pscat"], torch.zeros(M, D, dtype=torch.float64).index_add_(0, idx.reshape(-1), Pc), 2e-5, "pscat")
    close(got["psum"], Pc.view(n, -1, D).sum(1), 2e-5, "psum")
    close(got["gram"], Pc.t() @ Pc, 1e-6, "gram")
    close(got["total"], Pc.sum(0), 1e-6, "total", scale=Pc.abs().sum(0).max())
