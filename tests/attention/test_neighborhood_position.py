"""``position_hidden`` (``ReLU(bn(lin(pos[idx_ij] - pos_i)))`` per edge) against
``nn.Sequential(Linear, BatchNorm1d, ReLU)`` applied to the explicit float64 offsets.

The output, the BatchNorm's running statistics and counter after each training step
(momentum and cumulative), and the gradients in pos and every parameter, on the compiled
passes (float32, ``_neighborhood_native.enabled``), the torch operations (float32 with it
toggled off) and float64: training and eval, BatchNorm without affine parameters or
without running statistics, Linear without bias, several D and H (H > 16 falls back to
torch), more positions than queries, a large common offset, NaN in one position.
"""

from __future__ import annotations

import copy

import pytest
import torch
from kernel_paths import PATHS, close, select_path
from torch import nn

from sciformer.attention._neighborhood_position import position_hidden
from sciformer.errors import DataError

NAN = float("nan")
TOL = {"float64": 1e-10, "compiled": 1e-5, "torch": 1e-5}  # float32 errors are ~1e-6 here
# (N queries, k, D, H, M positions >= N); D = 1 only in eval: with batch statistics the
# output does not depend on the weight's size, whose gradient is then rounding (and eps)
SHAPES = [(20, 4, 3, 3, 20), (30, 8, 3, 16, 40), (15, 5, 2, 5, 15), (12, 1, 3, 8, 12), (10, 6, 16, 4, 14), (9, 3, 4, 20, 9)]
PARAMS = ("lin.weight", "lin.bias", "bn.weight", "bn.bias")


def modules(d, h, seed, bias=True, **bn_kwargs):
    """A float32 Linear(d, h) and BatchNorm1d(h) with random parameters and running statistics."""
    torch.manual_seed(seed)
    lin, bn = nn.Linear(d, h, bias=bias), nn.BatchNorm1d(h, **bn_kwargs)
    with torch.no_grad():
        if bn.affine:
            bn.weight.uniform_(-1.5, 1.5)  # negative scales too
            bn.bias.normal_()
        if bn.track_running_stats:
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
    return lin, bn


def cloud(shape, seed):
    n, k, d, _, m = shape
    gen = torch.Generator().manual_seed(seed)
    pos = torch.rand(m, d, generator=gen, dtype=torch.float64) * 3
    idx = torch.randint(0, m, (n, k), generator=gen)
    gout = torch.randn(n, k, shape[3], generator=gen, dtype=torch.float64)
    return pos, idx, gout


def run_tested(lin, bn, pos, idx, gout, dt, steps=1):
    """position_hidden on copies in ``dt``; outputs, gradients of the last step, the modules."""
    lin, bn = copy.deepcopy(lin).to(dt), copy.deepcopy(bn).to(dt)
    for pos_s in pos if steps > 1 else [pos]:
        lin.zero_grad(set_to_none=True)
        bn.zero_grad(set_to_none=True)
        p = pos_s.to(dt).requires_grad_()
        out = position_hidden(lin, bn, p, idx)
        out.backward(gout.to(dt))
    return out.detach(), grads_of(p, lin, bn), type(out.grad_fn).__name__, bn


def run_oracle(lin, bn, pos, idx, gout, dt, steps=1):
    """The module oracle in float64 on the same (``dt``-rounded) values."""
    seq = nn.Sequential(copy.deepcopy(lin), copy.deepcopy(bn), nn.ReLU()).double()
    n, k = idx.shape
    for pos_s in pos if steps > 1 else [pos]:
        seq.zero_grad(set_to_none=True)
        p = pos_s.to(dt).double().requires_grad_()
        rel = (p[idx] - p[:n, None]).reshape(n * k, -1)  # (N*k, D)
        out = seq(rel).view(n, k, -1)
        out.backward(gout.to(dt).double())
    return out.detach(), grads_of(p, seq[0], seq[1]), seq[1]


def grads_of(pos, lin, bn):
    ts = {"pos": pos, "lin.weight": lin.weight, "lin.bias": lin.bias, "bn.weight": bn.weight, "bn.bias": bn.bias}
    return {n: None if t is None else t.grad for n, t in ts.items()}


def compare(lin, bn, pos, idx, gout, path, steps=1, tol=None):
    dt = torch.float64 if path == "float64" else torch.float32
    tol = TOL[path] if tol is None else tol
    out, grads, fn, bn_t = run_tested(lin, bn, pos, idx, gout, dt, steps)
    w_out, w_grads, bn_o = run_oracle(lin, bn, pos, idx, gout, dt, steps)
    compiled_path = path == "compiled" and max(lin.in_features, lin.out_features) <= 16
    assert (fn == "RelativePositionHiddenBackward") == compiled_path, fn
    assert out.dtype == dt
    close(out, w_out, tol, "out")
    floor = 1e-3 * max(w.abs().max().item() for w in w_grads.values() if w is not None)  # lin.bias: zero up to rounding in training
    for n, w in w_grads.items():
        assert (grads[n] is None) == (w is None), n
        if w is not None:
            assert grads[n].dtype == dt, n
            close(grads[n], w, tol, "g " + n, floor=floor)
    check_buffers(bn_t, bn_o, tol)
    return out, grads, bn_t


def check_buffers(bn_t, bn_o, tol):
    for name in ("running_mean", "running_var"):
        t, o = getattr(bn_t, name), getattr(bn_o, name)
        assert (t is None) == (o is None), name
        if o is not None:
            close(t, o, tol, name)
    if bn_o.num_batches_tracked is not None:
        assert bn_t.num_batches_tracked.item() == bn_o.num_batches_tracked.item()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_training_step_matches_modules(shape, path, monkeypatch):
    select_path(path, monkeypatch)
    lin, bn = modules(shape[2], shape[3], seed=sum(shape))
    pos, idx, gout = cloud(shape, seed=sum(shape))
    _, _, bn_t = compare(lin, bn, pos, idx, gout, path)
    assert bn_t.num_batches_tracked.item() == 1
    assert not torch.allclose(bn_t.running_mean.double(), bn.running_mean.double())  # updated


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    select_path(request.param, monkeypatch)
    return request.param


@pytest.mark.parametrize("momentum", [0.3, None])
def test_running_statistics_over_steps(momentum, path):
    """Three steps on different clouds: exponential (momentum) or cumulative (None) averages."""
    shape = (25, 6, 3, 8, 30)
    lin, bn = modules(3, 8, seed=1, momentum=momentum)
    clouds = [cloud(shape, seed=s) for s in (2, 3, 4)]
    pos = [c[0] * (1 + s) for s, c in enumerate(clouds)]  # different spreads: different statistics
    _, _, bn_t = compare(lin, bn, pos, clouds[0][1], clouds[0][2], path, steps=3)
    assert bn_t.num_batches_tracked.item() == 3


@pytest.mark.parametrize("shape", [(20, 4, 3, 3, 20), (15, 5, 2, 5, 18), (7, 3, 1, 2, 9), (9, 3, 4, 20, 9)])
def test_eval_uses_running_statistics(shape, path):
    lin, bn = modules(shape[2], shape[3], seed=5)
    bn.eval()
    pos, idx, gout = cloud(shape, seed=6)
    _, _, bn_t = compare(lin, bn, pos, idx, gout, path)
    assert torch.equal(bn_t.running_mean, bn.running_mean.to(bn_t.running_mean.dtype))  # untouched
    assert bn_t.num_batches_tracked.item() == 0


@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_without_affine(train, path):
    lin, bn = modules(3, 6, seed=7, affine=False)
    pos, idx, gout = cloud((18, 5, 3, 6, 20), seed=8)
    compare(lin, bn.train(train), pos, idx, gout, path)


@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_without_running_statistics_uses_batch_statistics(train, path):
    lin, bn = modules(3, 5, seed=9, track_running_stats=False)
    pos, idx, gout = cloud((18, 5, 3, 5, 20), seed=10)
    _, _, bn_t = compare(lin, bn.train(train), pos, idx, gout, path)
    assert bn_t.running_mean is None


@pytest.mark.parametrize("train", [True, False])
def test_linear_without_bias(train, path):
    lin, bn = modules(3, 7, seed=11, bias=False)
    pos, idx, gout = cloud((22, 4, 3, 7, 22), seed=12)
    compare(lin, bn.train(train), pos, idx, gout, path)


@pytest.mark.parametrize("train", [True, False])
def test_large_common_offset(train, path):
    """Positions near 1e4 (float32 spacing ~1e-3): offsets stay exact, the statistics centred."""
    shape = (30, 8, 3, 8, 30)
    lin, bn = modules(3, 8, seed=13)
    pos, idx, gout = cloud(shape, seed=14)
    compare(lin, bn.train(train), pos + 1e4, idx, gout, path)


def test_single_edge_in_training_raises_like_batchnorm(path):
    lin, bn = modules(3, 4, seed=15)
    pos, idx, _ = cloud((1, 1, 3, 4, 1), seed=16)
    dt = torch.float64 if path == "float64" else torch.float32
    with pytest.raises(ValueError):
        nn.Sequential(lin, bn)(pos.float()[idx[0]] - pos.float()[:1])
    with pytest.raises(DataError, match="more than 1 edge"):  # a ValueError too, one line
        position_hidden(copy.deepcopy(lin).to(dt), copy.deepcopy(bn).to(dt), pos.to(dt), idx)
    empty = idx[:0]
    with pytest.raises(DataError, match="more than 1 edge, got 0"):
        position_hidden(copy.deepcopy(lin).to(dt), copy.deepcopy(bn).to(dt), pos.to(dt), empty)


def test_more_queries_than_positions_raise(path):
    """Queries are pos[:N]: N > M would read past the end of pos on the compiled path."""
    lin, bn = modules(3, 4, seed=17)
    pos, idx, _ = cloud((6, 2, 3, 4, 6), seed=18)
    dt = torch.float64 if path == "float64" else torch.float32
    with pytest.raises(DataError, match="6 queries but 5 positions"):
        position_hidden(lin.to(dt), bn.to(dt), pos[:5].to(dt), idx.clamp_max(4))


def test_empty_cloud_in_eval(path):
    lin, bn = modules(3, 4, seed=15)
    pos, idx, _ = cloud((3, 2, 3, 4, 3), seed=16)
    dt = torch.float64 if path == "float64" else torch.float32
    out = position_hidden(lin.to(dt), bn.eval().to(dt), pos.to(dt), idx[:0])
    assert out.shape == (0, 2, 4)


@pytest.mark.parametrize("train", [True, False])
def test_nan_in_one_position_reaches_what_it_reaches_in_modules(train, path):
    """Same NaN pattern as the modules in the output and every gradient; the rest matches."""
    shape = (20, 5, 3, 6, 24)
    lin, bn = modules(3, 6, seed=17)
    bn.train(train)
    pos, idx, gout = cloud(shape, seed=18)
    pos[int(idx[3, 2])] = NAN  # read by some edges
    dt = torch.float64 if path == "float64" else torch.float32
    out, grads, _, bn_t = run_tested(lin, bn, pos, idx, gout, dt)
    w_out, w_grads, bn_o = run_oracle(lin, bn, pos, idx, gout, dt)
    for n, got, want in [("out", out, w_out), *((n, grads[n], w) for n, w in w_grads.items())]:
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), (n, int(torch.isnan(got).sum()), int(nan.sum()))
        if not nan.all():
            close(got[~nan], want[~nan], TOL[path], n)
    for name in ("running_mean", "running_var"):
        assert torch.equal(torch.isnan(getattr(bn_t, name)), torch.isnan(getattr(bn_o, name))), name
