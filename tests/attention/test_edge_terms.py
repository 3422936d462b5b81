"""Sums over neighbour edges (``_edge_terms``) against float64 torch formulas.

gather_sum, scatter_rows, position_sums and edge_affine on both paths (the compiled
library for float32 CPU tensors, torch operations otherwise, chosen by toggling
``_neighborhood_native.enabled``) and in float64; the compiled-only ``rel_*`` passes
(offsets ``r_ij = pos[idx_ij] - pos[i]`` recomputed per edge) against the explicit
offsets, their gradients against autograd. Shapes cover d = 3 (compiled with a fixed
size), other sizes up to 16 (and 17, past the compiled limit), H != D, more or fewer
sources than queries, k = 1, and sources no edge reads (NaN there must not be read).
"""

from __future__ import annotations

import pytest
import torch
from kernel_paths import PATHS, close, needs_lib, select_path

from sciformer.attention import _edge_terms as et
from sciformer.attention import _neighborhood_native as native

NAN = float("nan")
# the path under test: compiled (float32, library enabled), torch (float32, disabled), float64
# (n queries, k, C or d, M sources)
SHAPES = [(1, 1, 1, 1), (5, 1, 3, 9), (40, 7, 16, 60), (30, 4, 33, 10), (17, 16, 2, 17), (23, 5, 4, 31)]


def tol_of(dt):
    return 1e-12 if dt == torch.float64 else 2e-5


def neighbours(n, k, m, gen, unread=0):
    """Index (n, k) into m sources; ``unread`` randomly chosen sources never appear (m > unread)."""
    read = torch.randperm(m, generator=gen)[: m - unread]  # sources edges may read
    idx = read[torch.randint(0, len(read), (n, k), generator=gen)]
    return idx, torch.ones(m, dtype=torch.bool).index_fill_(0, read, False)  # (n, k), (M,) unread mask


def rand(gen, dt, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dt)


def check_path(path, idx, *tensors):
    """The compiled functions apply exactly on the compiled path."""
    assert et.compiled(idx, *tensors) == (path == "compiled")


# ----------------------------------------------------------------------- both paths


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_gather_sum(shape, path, monkeypatch):
    dt = select_path(path, monkeypatch)
    n, k, c, m = shape
    gen = torch.Generator().manual_seed(sum(shape))
    idx, unread = neighbours(n, k, m, gen, unread=m // 3)
    X = rand(gen, dt, m, c)
    X[unread] = NAN  # never read
    check_path(path, idx, X)
    want = X.double()[idx].sum(1)  # (n, C)
    out = et.gather_sum(X, idx)
    assert out.dtype == dt
    close(out, want, tol_of(dt), "gather_sum")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("rows, c, d", [(1, 1, 1), (40, 64, 3), (17, 33, 16), (9, 5, 17), (25, 8, 2)])
def test_rows_dot(rows, c, d, centred, path, monkeypatch):
    """(X - mX) WT^T for a narrow WT; d = 17 exceeds the compiled width (torch runs it)."""
    dt = select_path(path, monkeypatch)
    gen = torch.Generator().manual_seed(rows + c + d)
    X, WT = rand(gen, dt, rows, c) + 100.0, rand(gen, dt, d, c)  # a common offset, centred away
    mX = X.mean(0) if centred else None
    want = (X.double() - (0.0 if mX is None else mX.double())) @ WT.double().t()
    out = et.rows_dot(X, mX, WT)
    assert out.dtype == dt and out.shape == (rows, d)
    close(out, want, tol_of(dt) * (1.0 if centred else 100.0), "rows_dot")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize("with_y", [True, False])
@pytest.mark.parametrize("rows, c, d", [(1, 1, 1), (30, 64, 3), (12, 17, 5)])
def test_row_affine(rows, c, d, with_y, per_row, path, monkeypatch):
    """sign (beta (wx (X - mX) + Pr WpT + ysign Y) + wa alpha), weights per row or constant."""
    dt = select_path(path, monkeypatch)
    gen = torch.Generator().manual_seed(rows * c + d + 2 * with_y + per_row)
    X, Y = rand(gen, dt, rows, c), rand(gen, dt, rows, c)
    mX, alpha, beta = rand(gen, dt, c), rand(gen, dt, c), rand(gen, dt, c)
    Pr, WpT = rand(gen, dt, rows, d), rand(gen, dt, d, c)
    wx, wa = (rand(gen, dt, rows), rand(gen, dt, rows)) if per_row else (-3.0, 2.5)
    if path == "compiled":
        assert et.compiled(None, X, mX, Pr, WpT, alpha, beta)
    f64 = [t.double() for t in (X, Y, mX, alpha, beta, Pr, WpT)]
    X6, Y6, m6, a6, b6, P6, W6 = f64
    wx6 = wx.double().unsqueeze(1) if per_row else wx
    wa6 = wa.double().unsqueeze(1) if per_row else wa
    inner = wx6 * (X6 - m6) + P6 @ W6 + (-1.0 * Y6 if with_y else 0.0)
    want = -1.0 * (b6 * inner + wa6 * a6)
    out = et.row_affine(X, mX, wx, wa, Pr, WpT, Y if with_y else None, alpha, beta, ysign=-1.0, sign=-1.0)
    assert out.dtype == dt and out.shape == (rows, c)
    close(out, want, tol_of(dt), "row_affine")


@pytest.mark.parametrize("path", PATHS)
def test_gather_sum_of_a_non_contiguous_tensor(path, monkeypatch):
    dt = select_path(path, monkeypatch)
    gen = torch.Generator().manual_seed(1)
    idx, _ = neighbours(20, 6, 30, gen)
    X = rand(gen, dt, 30, 14)[:, ::2]  # (30, 7) every other column
    assert not X.is_contiguous()
    close(et.gather_sum(X, idx), X.double()[idx].sum(1), tol_of(dt))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_scatter_rows(shape, path, monkeypatch):
    dt = select_path(path, monkeypatch)
    n, k, c, m = shape
    gen = torch.Generator().manual_seed(sum(shape) + 1)
    idx, unread = neighbours(n, k, m, gen, unread=m // 3)
    Y = rand(gen, dt, n, c)
    check_path(path, idx, Y)
    want = torch.zeros(m, c, dtype=torch.float64).index_add_(0, idx.reshape(-1), Y.double().repeat_interleave(k, 0))
    out = et.scatter_rows(Y, idx, m)
    assert out.dtype == dt
    close(out, want, tol_of(dt), "scatter_rows")
    assert (out[unread] == 0).all()


@pytest.mark.parametrize("path", PATHS)
def test_scatter_rows_of_a_non_contiguous_tensor(path, monkeypatch):
    dt = select_path(path, monkeypatch)
    gen = torch.Generator().manual_seed(2)
    idx, _ = neighbours(20, 6, 8, gen)
    Y = rand(gen, dt, 5, 20).t()  # (20, 5) transposed
    want = torch.zeros(8, 5, dtype=torch.float64).index_add_(0, idx.reshape(-1), Y.double().repeat_interleave(6, 0))
    close(et.scatter_rows(Y, idx, 8), want, tol_of(dt))


@pytest.mark.parametrize("sdt", [torch.float64, torch.float32])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (5, 1, 3, 9), (40, 7, 3, 60), (30, 4, 2, 10), (17, 16, 4, 17), (9, 3, 16, 12), (6, 2, 17, 6)])
def test_position_sums(shape, path, sdt, monkeypatch):
    dt = select_path(path, monkeypatch)
    n, k, d, m = shape
    gen = torch.Generator().manual_seed(sum(shape) + 2)
    idx, unread = neighbours(n, k, m, gen, unread=m // 4)
    P = rand(gen, dt, n, k, d) + 5.0  # mP removes the common offset
    mP = P.double().reshape(-1, d).mean(0).to(dt) + rand(gen, dt, d) * 0.1
    Pc = (P.double() - mP.double()).reshape(n * k, d)  # (n*k, d)
    pscat, psum, gram, total = et.position_sums(P, mP, idx, m, sdt)
    assert (pscat.dtype, psum.dtype, gram.dtype, total.dtype) == (dt, dt, sdt, sdt)
    tol = tol_of(dt if sdt == torch.float64 else torch.float32)
    close(pscat, torch.zeros(m, d, dtype=torch.float64).index_add_(0, idx.reshape(-1), Pc), tol, "pscat")
    assert (pscat[unread] == 0).all()
    close(psum, Pc.view(n, k, d).sum(1), tol, "psum")
    close(gram, Pc.t() @ Pc, tol, "gram")
    close(total, Pc.sum(0), tol, "total", scale=Pc.abs().sum(0).max())  # a sum near zero


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (5, 1, 3, 9), (40, 7, 3, 60), (30, 4, 2, 10), (17, 16, 4, 17), (9, 3, 16, 12), (6, 2, 17, 6)])
def test_edge_affine(shape, path, with_q, monkeypatch):
    dt = select_path(path, monkeypatch)
    n, k, d, m = shape
    gen = torch.Generator().manual_seed(sum(shape) + 3 + with_q)
    idx, unread = neighbours(n, k, m, gen, unread=m // 4)
    P, KW, QW = rand(gen, dt, n, k, d), rand(gen, dt, m, d), rand(gen, dt, n, d) if with_q else None
    D, c = rand(gen, dt, d, d).t(), rand(gen, dt, d)  # D non-contiguous for d > 1
    KW[unread] = NAN  # never read
    want = c.double() + KW.double()[idx] + P.double() @ D.double()  # (n, k, d)
    if QW is not None:
        want -= QW.double()[:, None]
    out = et.edge_affine(P, KW, QW, D, c, idx)
    assert out.dtype == dt
    close(out, want, tol_of(dt), "edge_affine")


@needs_lib
def test_compiled_and_torch_paths_agree_on_float32(monkeypatch):
    """Both float32 paths give the same sums (up to rounding) for the same inputs."""
    gen = torch.Generator().manual_seed(4)
    n, k, d, m = 50, 9, 3, 70
    idx, _ = neighbours(n, k, m, gen, unread=5)
    X, Y, P = rand(gen, torch.float32, m, 12), rand(gen, torch.float32, n, 12), rand(gen, torch.float32, n, k, d)
    KW, QW, D, c = (rand(gen, torch.float32, *s) for s in ((m, d), (n, d), (d, d), (d,)))
    mP = P.reshape(-1, d).mean(0)
    outs = {}
    for flag in (True, False):
        monkeypatch.setattr(native, "enabled", flag)
        outs[flag] = [et.gather_sum(X, idx), et.scatter_rows(Y, idx, m), *et.position_sums(P, mP, idx, m, torch.float64), et.edge_affine(P, KW, QW, D, c, idx)]
    for a, b in zip(outs[True], outs[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- compiled-only passes

# (n queries, k, D, H, M sources >= n)
REL_SHAPES = [(1, 1, 1, 1, 1), (12, 1, 3, 3, 12), (40, 8, 3, 3, 55), (25, 6, 3, 16, 25), (30, 5, 2, 5, 44), (16, 4, 16, 4, 20), (9, 7, 4, 3, 9), (11, 3, 16, 16, 15)]


def rel_inputs(shape, seed):
    """pos (M, D) float32 around a common offset, idx (n, k) leaving (M - n) // 2 sources unread."""
    n, k, d, h, m = shape
    gen = torch.Generator().manual_seed(seed)
    pos = (torch.rand(m, d, generator=gen, dtype=torch.float64) * 4 + 3).float()
    idx, _ = neighbours(n, k, m, gen, unread=(m - n) // 2)
    WT, b = torch.randn(d, h, generator=gen) / d**0.5, torch.randn(h, generator=gen) * 0.5
    return gen, pos, idx, WT, b


def offsets64(pos, idx):
    n = idx.shape[0]
    return pos.double()[idx] - pos.double()[:n, None]  # (n, k, D)


@needs_lib
@pytest.mark.parametrize("shift_kind", ["zero", "mean", "other"])
@pytest.mark.parametrize("shape", REL_SHAPES)
def test_rel_moments(shape, shift_kind):
    gen, pos, idx, _, _ = rel_inputs(shape, seed=sum(shape))
    d = pos.shape[1]
    r = offsets64(pos, idx).reshape(-1, d)  # (E, D)
    shift = {"zero": torch.zeros(d, dtype=torch.float64), "mean": r.mean(0), "other": torch.randn(d, generator=gen, dtype=torch.float64)}[shift_kind]
    rs = r - shift
    scale = rs.abs().sum(0).max().clamp_min(1e-6)  # sums near zero for shift = mean
    s, x = et.rel_moments(pos, idx, shift, cross=False)
    assert x is None and s.dtype == torch.float64
    close(s, rs.sum(0), 1e-6, "sum", scale=scale)
    s, x = et.rel_moments(pos, idx, shift, cross=True)
    close(s, rs.sum(0), 1e-6, "sum", scale=scale)
    assert x.dtype == torch.float64
    close(x, rs.t() @ rs, 1e-6, "cross")


@needs_lib
@pytest.mark.parametrize("shape", REL_SHAPES)
def test_rel_linear_relu(shape):
    _, pos, idx, WT, b = rel_inputs(shape, seed=sum(shape) + 1)
    want = (offsets64(pos, idx) @ WT.double() + b.double()).relu()  # (n, k, H)
    assert want.numel() < 10 or ((want == 0).any() and (want > 0).any())  # both sides of the ReLU
    out = et.rel_linear_relu(pos, idx, WT.t().contiguous().t(), b)  # WT non-contiguous
    assert out.dtype == torch.float32
    close(out, want, 2e-5, "out")
    assert torch.equal(out == 0, want == 0)


@needs_lib
def test_rel_linear_relu_keeps_nan():
    _, pos, idx, WT, b = rel_inputs((20, 5, 3, 8, 20), seed=5)
    pos[int(idx[4, 1])] = NAN
    want = (offsets64(pos, idx) @ WT.double() + b.double()).relu()
    out = et.rel_linear_relu(pos, idx, WT, b)
    assert torch.isnan(want).any()
    assert torch.equal(torch.isnan(out), torch.isnan(want))


def relu_loss_parts(pos64, idx, W64, b64, gout):
    """Edge offsets (n, k, D) and ``(ReLU(r W^T + b) * gout).sum()`` in float64."""
    r = pos64[idx] - pos64[: idx.shape[0], None]
    return r, ((r @ W64.t() + b64).relu() * gout.double()).sum()


@needs_lib
@pytest.mark.parametrize("shape", REL_SHAPES)
def test_rel_grad_params(shape):
    gen, pos, idx, WT, b = rel_inputs(shape, seed=sum(shape) + 2)
    n, k, _, h, _ = shape
    gout = torch.randn(n, k, h, generator=gen)
    out = et.rel_linear_relu(pos, idx, WT, b)
    W64, b64 = WT.double().t().requires_grad_(), b.double().requires_grad_()
    _, loss = relu_loss_parts(pos.double(), idx, W64, b64, gout)
    gW, gb = torch.autograd.grad(loss, [W64, b64])
    gWT, gbias = et.rel_grad_params(pos, idx, out, gout)
    assert gWT.dtype == gbias.dtype == torch.float64
    close(gWT, gW.t(), 1e-5, "gWT")
    close(gbias, gb, 1e-5, "gb")


@needs_lib
@pytest.mark.parametrize("moments", [True, False])
@pytest.mark.parametrize("shape", REL_SHAPES)
def test_rel_grad_pos(shape, moments):
    """gpos of sum over edges of (ReLU(r W^T + b) gout).sum() + gm.r + (r - mean)^T Gs (r - mean) / 2."""
    gen, pos, idx, WT, b = rel_inputs(shape, seed=sum(shape) + 3 + moments)
    n, k, d, h, m = shape
    W = WT.t().contiguous()  # (H, D)
    gout = torch.randn(n, k, h, generator=gen)
    A = torch.randn(d, d, generator=gen)
    gm, Gs, mean = (torch.randn(d, generator=gen), A + A.t(), torch.randn(d, generator=gen) + 0.5) if moments else (torch.zeros(d), torch.zeros(d, d), torch.zeros(d))
    pos64 = pos.double().requires_grad_()
    r, loss = relu_loss_parts(pos64, idx, W.double(), b.double(), gout)
    rm = r - mean.double()
    loss = loss + (r @ gm.double()).sum() + 0.5 * ((rm @ Gs.double()) * rm).sum()
    (want,) = torch.autograd.grad(loss, [pos64])
    out = et.rel_linear_relu(pos, idx, WT, b)
    gpos = et.rel_grad_pos(pos, idx, out, gout, W, (gm, Gs, mean) if moments else None)
    assert gpos.dtype == torch.float32 and gpos.shape == (m, d)
    close(gpos, want, 5e-5, "gpos")
    counts = torch.bincount(idx.reshape(-1), minlength=m)
    never = (counts == 0) & (torch.arange(m) >= n)  # neither a source nor a query
    assert (gpos[never] == 0).all()


@needs_lib
def test_rel_passes_match_over_a_large_common_offset():
    """Offsets of positions near 1e4 are exact in float32; the passes see the same offsets."""
    gen, pos, idx, WT, b = rel_inputs((30, 6, 3, 3, 30), seed=7)
    far = pos + 1e4
    r = offsets64(far, idx).reshape(-1, 3)
    s, x = et.rel_moments(far, idx, r.mean(0), cross=True)
    rc = r - r.mean(0)
    close(x, rc.t() @ rc, 1e-6, "cross")
    close(s, rc.sum(0), 1e-6, "sum", scale=rc.abs().sum(0).max())
    close(et.rel_linear_relu(far, idx, WT, b), (offsets64(far, idx) @ WT.double() + b.double()).relu(), 2e-5, "out")
