"""``edge_moments`` (mean and biased variance over all edges of
``a_ij = K[idx_ij] - Q_i + P_ij Wp^T + bp``) against the explicit float64 edge tensor.

Outputs against ``a.mean(0)`` / ``a.var(0, unbiased=False)``, gradients against autograd
through that formula for random output gradients: float64 inputs (tight), float32 inputs
on the compiled sums and on the torch ones (``_neighborhood_native.enabled`` toggled);
without Q or bp, more sources than queries (transition down), k = 1, every subset of
inputs wanting a gradient, NaN in sources no edge reads, a large common offset (centred
sums), one output unused, and gradcheck on a tiny case.
"""

from __future__ import annotations

from functools import partial

import kernel_paths
import pytest
import torch
from kernel_paths import PATHS, select_path

from sciformer.attention import _edge_terms as et
from sciformer.attention._neighborhood_moments import edge_moments

NAN = float("nan")
NAMES = ("K", "Q", "P", "Wp", "bp")
TOL = {"float64": 1e-10, "compiled": 2e-5, "torch": 2e-5}  # float32 errors are ~2e-7 here
# (N queries, k, C, d, M sources)
close = partial(kernel_paths.close, floor=1e-8)
SHAPES = [(1, 2, 1, 1, 2), (20, 4, 8, 3, 20), (15, 5, 6, 2, 40), (30, 1, 5, 3, 30), (12, 6, 16, 4, 25), (8, 3, 4, 16, 10), (7, 4, 3, 17, 9), (25, 16, 32, 3, 60)]


@pytest.fixture
def spy(monkeypatch):
    """Whether each call of ``_edge_terms.compiled`` chose the compiled library."""
    calls = []
    real = et.compiled

    def compiled(*args):
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(et, "compiled", compiled)
    return calls


def make(shape, seed, dt, with_q=True, with_bp=True, unread=0):
    """Inputs (a dict of K, Q, P, Wp, bp; absent ones None), the index, the unread sources."""
    n, k, c, d, m = shape
    gen = torch.Generator().manual_seed(seed)
    read = torch.randperm(m, generator=gen)[: m - unread]
    idx = read[torch.randint(0, len(read), (n, k), generator=gen)]
    unread_mask = torch.ones(m, dtype=torch.bool).index_fill_(0, read, False)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {"K": r(m, c) + 0.3, "Q": r(n, c) - 0.2 if with_q else None, "P": r(n, k, d) * 0.7 + 0.4, "Wp": r(c, d), "bp": r(c) if with_bp else None}
    return {n_: None if t is None else t.to(dt) for n_, t in x.items()}, idx, unread_mask


def oracle(K, Q, P, Wp, bp, idx):
    """Mean and biased variance of the explicit edge tensor (N*k, C)."""
    a = K[idx] + P @ Wp.t()  # (N, k, C)
    if Q is not None:
        a = a - Q[:, None]
    if bp is not None:
        a = a + bp
    a = a.reshape(-1, a.shape[-1])
    return a.mean(0), a.var(0, unbiased=False)


def run(fn, x, idx, gm, gv, wrt, cast=None):
    """``fn``'s mean and var, and the gradients of ``(gm mean + gv var).sum()`` for ``wrt``
    (None where absent, not wanted, or not reached); ``cast`` converts the inputs first.
    ``gm`` / ``gv`` None leave that output out of the loss."""
    leaves = {n: None if t is None else (t if cast is None else t.to(cast)).clone().requires_grad_(n in wrt) for n, t in x.items()}
    mean, var = fn(*leaves.values(), idx)
    loss = sum((g * o).sum() for g, o in ((gm, mean), (gv, var)) if g is not None)
    wanted = [t for n, t in leaves.items() if t is not None and n in wrt]
    grads = dict(zip([id(t) for t in wanted], torch.autograd.grad(loss, wanted, allow_unused=True)))
    return mean.detach(), var.detach(), {n: None if t is None else grads.get(id(t)) for n, t in leaves.items()}


def compare(x, idx, path, gm, gv, wrt=NAMES, tol=None):
    """edge_moments against the float64 oracle: outputs and every gradient."""
    tol = TOL[path] if tol is None else tol
    mean, var, grads = run(edge_moments, x, idx, gm, gv, wrt)
    w_mean, w_var, w_grads = run(oracle, x, idx, gm, gv, wrt, cast=torch.float64)
    assert mean.dtype == var.dtype == torch.float64
    close(mean, w_mean, tol, "mean")
    close(var, w_var, tol, "var")
    floor = 1e-3 * max(g.abs().max().item() for g in w_grads.values() if g is not None)  # for gradients zero up to rounding
    for n in NAMES:
        if w_grads[n] is None:
            assert grads[n] is None or not grads[n].any(), n
            continue
        assert grads[n] is not None and grads[n].dtype == x[n].dtype, n
        close(grads[n], w_grads[n], tol, "g" + n, floor=floor)
    return mean, var, grads


def out_grads(c, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(c, generator=gen, dtype=torch.float64), torch.randn(c, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_explicit_edges(shape, path, monkeypatch, spy):
    dt = select_path(path, monkeypatch)
    x, idx, _ = make(shape, seed=sum(shape), dt=dt)
    compare(x, idx, path, *out_grads(shape[2], sum(shape)))
    assert any(spy) == (path == "compiled"), spy  # the compiled sums ran exactly on that path


@pytest.mark.parametrize("path", PATHS)
def test_float64_default_dtype(path, monkeypatch):
    """Constants handed to the compiled passes keep float32 whatever torch's default dtype."""
    dt = select_path(path, monkeypatch)
    shape = (20, 4, 8, 3, 20)
    x, idx, _ = make(shape, seed=21, dt=dt)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        compare(x, idx, path, *out_grads(8, 22))
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("with_q,with_bp", [(False, True), (True, False), (False, False)])
def test_without_query_or_bias(with_q, with_bp, path, monkeypatch):
    dt = select_path(path, monkeypatch)
    shape = (18, 5, 12, 3, 18)
    x, idx, _ = make(shape, seed=3 + 2 * with_q + with_bp, dt=dt, with_q=with_q, with_bp=with_bp)
    compare(x, idx, path, *out_grads(12, 5))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(10, 8, 6, 3, 40), (5, 16, 9, 2, 33)])
def test_transition_down_use(shape, path, monkeypatch):
    """As ``_edge_select`` calls it: M sources (features) > N queries, no Q, no bp."""
    dt = select_path(path, monkeypatch)
    x, idx, _ = make(shape, seed=sum(shape) + 1, dt=dt, with_q=False, with_bp=False)
    compare(x, idx, path, *out_grads(shape[2], 2))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("wrt", [("K",), ("Q",), ("P",), ("Wp",), ("bp",), ("K", "P"), ("Q", "Wp", "bp")])
def test_every_subset_of_gradients(wrt, path, monkeypatch):
    dt = select_path(path, monkeypatch)
    x, idx, _ = make((16, 6, 10, 3, 21), seed=len(wrt) * 11 + len(wrt[0]), dt=dt)
    _, _, grads = compare(x, idx, path, *out_grads(10, 7), wrt=wrt)
    assert [n for n in NAMES if grads[n] is not None] == list(wrt)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("with_q", [True, False])
def test_unread_sources_holding_nan_take_no_part(with_q, path, monkeypatch):
    dt = select_path(path, monkeypatch)
    shape = (14, 5, 7, 3, 30)
    x, idx, unread = make(shape, seed=8 + with_q, dt=dt, with_q=with_q, unread=12)
    assert unread.sum() == 12
    x["K"][unread] = NAN
    mean, var, grads = compare(x, idx, path, *out_grads(7, 9))
    assert torch.isfinite(mean).all() and torch.isfinite(var).all()
    for n, g in grads.items():
        assert g is None or torch.isfinite(g).all(), n
    assert (grads["K"][unread] == 0).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("with_q", [True, False])
def test_large_common_offset_keeps_the_variance_accurate(with_q, path, monkeypatch):
    """K + 1000 (spread ~1): uncentred sums (E[a^2] - mean^2) would lose the variance in float32."""
    dt = select_path(path, monkeypatch)
    shape = (40, 8, 16, 3, 50)
    x, idx, _ = make(shape, seed=10 + with_q, dt=dt, with_q=with_q)
    x["K"] = x["K"] + 1000.0
    # gradients of float32 inputs: K - mean(K) carries the rounding of a mean near 1000 (~6e-5)
    mean, var, _ = compare(x, idx, path, *out_grads(16, 11), tol=None if path == "float64" else 2e-4)
    assert mean.abs().min() > 900
    w_mean, w_var = oracle(*(None if t is None else t.double() for t in x.values()), idx)
    tol = 1e-12 if path == "float64" else 1e-5
    assert ((var - w_var).abs() / w_var).max() < tol  # per channel, not only the largest
    assert ((mean - w_mean).abs() / w_mean.abs()).max() < tol


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("used", ["mean", "var"])
def test_one_output_unused(used, path, monkeypatch):
    dt = select_path(path, monkeypatch)
    x, idx, _ = make((16, 4, 9, 3, 20), seed=12 + len(used), dt=dt)
    gm, gv = out_grads(9, 13)
    if used == "mean":
        _, _, grads = compare(x, idx, path, gm, None)
        assert torch.allclose(grads["bp"].double(), gm)  # the mean is linear in bp; no variance term
    else:
        _, _, grads = compare(x, idx, path, None, gv)
        assert grads["bp"].abs().max() < (1e-12 if path == "float64" else 1e-5)  # var does not depend on bp


@pytest.mark.parametrize("with_q,with_bp", [(True, True), (False, False)])
def test_gradcheck(with_q, with_bp):
    x, idx, unread = make((4, 3, 2, 2, 7), seed=14 + with_q, dt=torch.float64, with_q=with_q, with_bp=with_bp, unread=2)
    names = [n for n, t in x.items() if t is not None]
    gen = torch.Generator().manual_seed(15)
    gm, gv = torch.randn(2, generator=gen, dtype=torch.float64), torch.randn(2, generator=gen, dtype=torch.float64)

    def fn(*ts):
        given = dict(zip(names, ts))
        return edge_moments(*(given.get(n) for n in NAMES), idx)

    inputs = tuple(x[n].clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8)
    # a loss mixing both outputs: its gradient through both paths at once
    assert torch.autograd.gradcheck(lambda *ts: (gm * fn(*ts)[0] + gv * fn(*ts)[1]).sum(), inputs, eps=1e-6, atol=1e-8)


def test_single_edge_has_zero_variance():
    x, idx, _ = make((1, 1, 4, 3, 3), seed=16, dt=torch.float64)
    mean, var = edge_moments(*x.values(), idx)
    w_mean, _ = oracle(*x.values(), idx)
    close(mean, w_mean, 1e-12, "mean")
    assert torch.equal(var, torch.zeros(4, dtype=torch.float64))
