"""Compiled stages of the fused v1 vector attention (``_vector_attention.cpp``).

The tile product (``matmul``: set, and transposed accumulate) on shapes reaching every
register block, and each stage, forward and backward, against float64 torch formulas
(autograd for the gradients) on chunks of one tile, several tiles with a remainder, or one
point per tile: accumulated outputs add onto ones, set outputs overwrite NaN, absent
outputs and gradient terms are skipped, the moments of u are centred, far logits give
exact zeros, a NaN reaches what it reaches in torch. Then the whole layer (float32,
compiled stages) against the float64 plain gather implementation, as accurate as the
float32 torch operations it replaces; every combination of wanted gradients; threads;
NaN propagation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree
from torch import Tensor

from sciformer.attention import _neighborhood_native as native
from sciformer.attention.neighborhood import PointTransformerLayer

pytestmark = pytest.mark.skipif(native.library() is None, reason="compiled vector attention not built")

NAN = float("nan")
ACCUMULATED = {"gA", "gWaT", "gW1", "gV", "gWpT", "gW2", "gs2", "gt2"}  # the other outputs are set
STAGE1_GRADS = ("gW1", "gA", "gB", "gWaT", "gP")
STAGE2_GRADS = ("gV", "gWpT", "gP", "gu", "gs2", "gt2", "gW2")
# (m, k, C, G, d, M); a tile holds max(1, 32768 // (C k)) points: one tile; 64 + 6; 32 + 5;
# one tile; five tiles of one point; one tile
SHAPES = [(1, 1, 1, 1, 1, 1), (70, 16, 32, 32, 3, 90), (37, 16, 64, 8, 3, 50), (9, 5, 12, 4, 1, 11), (5, 64, 1024, 128, 3, 7), (3, 2, 6, 6, 5, 4),
          (11, 7, 48, 24, 4, 20), (6, 3, 16, 16, 2, 9)]  # G % 8: matrix-product or loop P^T p; d = 3 or not: gP sums
TOL = 5e-5  # float32 against float64, sums of up to 1024 products


@pytest.fixture(autouse=True)
def _compiled_enabled_after() -> Iterator[None]:
    """Tests switch the compiled passes off; every test ends with them on."""
    yield
    native.enabled = True


@pytest.fixture(autouse=True, params=["wide products", "8-lane products"])
def _products(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test with the tile products on 16-lane blocks (where the CPU has AVX-512, the
    default there) and on 8-lane blocks."""
    native.wide_products(request.param == "wide products")
    yield
    native.wide_products(True)


def f64(*ts: Tensor) -> list[Tensor]:
    return [t.double() for t in ts]


def close(got: Tensor, want: Tensor, tol: float = 2e-5, what: str = "") -> None:
    """Largest difference relative to the largest |want| under ``tol`` (NaN fails)."""
    scale = want.abs().max().clamp_min(1e-6)
    err = ((got.double() - want).abs().max() / scale).item()
    assert err < tol, (what, err)


# ------------------------------------------------------------------ the compiled stages


def inputs(shape: tuple[int, ...], seed: int) -> dict[str, Tensor]:
    """Random float32 inputs of both stages for (m, k, C, G, d, M); u is stage 2's own input
    (stage 1's backward pass takes it as an input too), W1 is (G, C), W2 (G, G)."""
    m, k, c, g, d, msrc = shape
    gen = torch.Generator().manual_seed(seed)
    sizes = {"A": (msrc, c), "B": (m, c), "P": (m, k, d), "WaT": (d, c), "W1": (g, c), "u": (m, k, g)}
    sizes |= {"s2": (g,), "t2": (g,), "W2": (g, g), "V": (msrc, c), "WpT": (d, c)}
    x = {"idx": torch.randint(0, msrc, (m, k), generator=gen)}
    x |= {n: torch.randn(*s, generator=gen) for n, s in sizes.items()}
    x["W2"] *= 30 / g**0.5  # logits of spread ~30: the softmax's exponent under- and overflows
    return x


def stage1_64(idx: Tensor, A: Tensor, B: Tensor, P: Tensor, WaT: Tensor, W1: Tensor) -> tuple[Tensor]:
    return ((A[idx] - B[:, None] + P @ WaT).relu() @ W1.t(),)  # u (m, k, G)


def stage2_64(idx: Tensor, u: Tensor, s2: Tensor, t2: Tensor, W2: Tensor, V: Tensor, P: Tensor, WpT: Tensor) -> tuple[Tensor, Tensor]:
    m, k, g = u.shape
    p = torch.softmax((s2 * u + t2).relu() @ W2.t(), dim=1)  # (m, k, G)
    y = ((V[idx] + P @ WpT).view(m, k, -1, g) * p[:, :, None]).sum(1).flatten(1)  # channel c: group c % G
    return p, y


def autograd64(x: dict[str, Tensor], names: str, formula: Callable[..., tuple[Tensor, ...]], grad: Tensor) -> dict[str, Tensor]:
    """``formula``'s outputs in float64 ("out0", ...) and the gradients ("g" + name) of the
    inputs ``names`` for the gradient ``grad`` of its last output."""
    leaves = {n: x[n].double().requires_grad_() for n in names.split()}
    outs = formula(x["idx"], *leaves.values())
    outs[-1].backward(grad)
    return {f"out{i}": o.detach() for i, o in enumerate(outs)} | {"g" + n: t.grad for n, t in leaves.items()}


def buffers(x: dict[str, Tensor], names: Iterable[str]) -> dict[str, Tensor]:
    """Gradient buffers: ones where they accumulate, NaN where they are set (to be overwritten)."""
    return {n: torch.full_like(x[n[1:]], 1.0 if n in ACCUMULATED else NAN) for n in names}


def check(got: dict[str, Tensor], want: dict[str, Tensor], tol: float = TOL) -> None:
    for n, t in got.items():
        close(t, want[n] + (1.0 if n in ACCUMULATED else 0.0), tol, n)


def forward1(x: dict[str, Tensor], moments: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None]:
    m, k = x["idx"].shape
    g = x["W1"].shape[0]
    u = torch.full((m, k, g), NAN)
    mom = (torch.full((g,), NAN, dtype=torch.float64), torch.full((g,), NAN, dtype=torch.float64)) if moments else None
    native.stage1_forward(x["idx"], x["A"], x["B"], x["P"], x["WaT"], x["W1"].t().contiguous(), u, mom)
    return (u, *mom) if mom is not None else (u, None, None)


def backward1(x: dict[str, Tensor], grad: Tensor | None, cv: Tensor | None, cst: Tensor | None, grads: dict[str, Tensor]) -> None:
    native.stage1_backward(x["idx"], grad, x["u"], cv, cst, x["A"], x["B"], x["P"], x["WaT"], x["W1"], grads)


def forward2(x: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    m, c = x["idx"].shape[0], x["V"].shape[1]
    p, y = torch.full_like(x["u"], NAN), torch.full((m, c), NAN)
    native.stage2_forward(x["idx"], x["u"], x["s2"], x["t2"], x["W2"].t().contiguous(), x["V"], x["P"], x["WpT"], p, y)
    return p, y


def backward2(x: dict[str, Tensor], gy: Tensor, p: Tensor, grads: dict[str, Tensor]) -> None:
    native.stage2_backward(x["idx"], gy, p, x["V"], x["P"], x["WpT"], x["u"], x["s2"], x["t2"], x["W2"], grads)


# (R, K, N): R % 6 (row blocks of the product) and K % 6 (those of the transposed one) take
# every value; N: 64-column panels (16 lanes) with and without a rest, 16-column panels, an
# 8-column panel, a padded panel of 4-7 columns, scalar columns; R = 300: row blocks of 64
# (four whole, one of 44)
@pytest.mark.parametrize(
    "r,kk,n",
    [(1, 1, 1), (2, 5, 3), (3, 64, 8), (4, 6, 16), (5, 3, 24), (6, 2, 70), (7, 64, 64), (13, 3, 1), (300, 64, 70), (300, 7, 24), (10, 1, 31),
     (9, 32, 4), (300, 4, 5), (11, 5, 12), (7, 2, 20), (13, 64, 64), (7, 5, 136), (300, 3, 129)],
)
def test_matmul_matches_torch(r: int, kk: int, n: int) -> None:
    gen = torch.Generator().manual_seed(r * 10000 + kk * 100 + n)
    a, b, y = torch.randn(r, kk, generator=gen), torch.randn(kk, n, generator=gen), torch.randn(r, n, generator=gen)
    acc = torch.randn(kk, n, generator=gen)  # the transposed product adds onto it
    a64, b64, y64, acc64 = f64(a, b, y, acc)
    close(native.matmul(a, b, out=torch.full((r, n), NAN)), a64 @ b64, what="a @ b")
    close(native.matmul(a, y, transpose_a=True, out=acc.clone()), acc64 + a64.t() @ y64, what="acc + a.t() @ y")


@pytest.mark.parametrize("shape", SHAPES)
def test_stage1_matches_formula(shape: tuple[int, ...]) -> None:
    x = inputs(shape, seed=sum(shape))
    m, k, _, g, _, _ = shape
    grad, cv, cst = torch.randn(m, k, g), torch.randn(g), torch.randn(g)
    gu = grad.double() + cv.double() * x["u"].double() + cst.double()
    want = autograd64(x, "A B P WaT W1", stage1_64, gu)
    u, _, _ = forward1(x)
    close(u, want["out0"], TOL, "u")
    got = buffers(x, STAGE1_GRADS)
    backward1(x, grad, cv, cst, got)
    check(got, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_stage1_moments_are_centred(shape: tuple[int, ...]) -> None:
    x = inputs(shape, seed=sum(shape) + 1)
    x["B"] -= 1000  # pre-activations near 1000: u far from 0 against its spread
    u, mean, m2 = forward1(x)
    u64 = u.double().flatten(0, 1)  # (m k, G)
    assert u64.mean(0).abs().median() > 100 * u64.std(0, correction=0).max()
    close(mean, u64.mean(0), 1e-12, "mean")
    close(m2, (u64 - u64.mean(0)).square().sum(0), 1e-12, "m2")  # sum u^2 - m mean^2 in double: ~1e-10
    assert torch.equal(forward1(x, moments=False)[0], u)


@pytest.mark.parametrize("terms", [("grad", "cv", "cst"), ("cst",), ("cv", "cst"), ("grad",), ("cv",), ()])
@pytest.mark.parametrize("outs", [("gW1",), ("gA", "gP"), ("gB", "gWaT")])
def test_stage1_backward_skips_absent_terms_and_outputs(terms: tuple[str, ...], outs: tuple[str, ...]) -> None:
    x = inputs(shape := (37, 16, 64, 8, 3, 50), seed=len(terms) * 7 + len(outs[0]))
    m, k, _, g, _, _ = shape
    given = {n: torch.randn(*s) if n in terms else None for n, s in (("grad", (m, k, g)), ("cv", (g,)), ("cst", (g,)))}
    gu = torch.zeros(m, k, g, dtype=torch.float64)
    for n, t in given.items():
        gu += 0.0 if t is None else t.double() * (x["u"].double() if n == "cv" else 1.0)
    want = autograd64(x, "A B P WaT W1", stage1_64, gu)
    got = buffers(x, outs)
    backward1(x, *given.values(), got)
    check(got, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_stage2_matches_formula(shape: tuple[int, ...]) -> None:
    x = inputs(shape, seed=sum(shape) + 2)
    gy = torch.randn(shape[0], shape[2])
    want = autograd64(x, "u s2 t2 W2 V P WpT", stage2_64, gy.double())
    p, y = forward2(x)
    close(p, want["out0"], TOL, "p")
    close(y, want["out1"], TOL, "y")
    got = buffers(x, STAGE2_GRADS)
    backward2(x, gy, p, got)
    check(got, want)


@pytest.mark.parametrize("outs", [("gW2",), ("gV",), ("gu", "gs2"), ("gP", "gWpT", "gt2")])
def test_stage2_backward_skips_absent_outputs(outs: tuple[str, ...]) -> None:
    x = inputs(shape := (70, 16, 32, 32, 3, 90), seed=len(outs))
    gy = torch.randn(shape[0], shape[2])
    want = autograd64(x, "u s2 t2 W2 V P WpT", stage2_64, gy.double())
    got = buffers(x, outs)
    backward2(x, gy, forward2(x)[0], got)
    check(got, want)


def test_softmax_weights_far_below_the_maximum_are_zero() -> None:
    # G = 1, W2 = [[-1]], s2 = 1, t2 = 0: logits -ReLU(u) = [0, -200, -inf]
    x = {"idx": torch.zeros(1, 3, dtype=torch.int64), "u": torch.tensor([[[0.0], [200.0], [float("inf")]]])}
    x |= {"s2": torch.ones(1), "t2": torch.zeros(1), "W2": -torch.ones(1, 1), "V": torch.full((1, 1), 1e30)}
    x |= {"P": torch.zeros(1, 3, 1), "WpT": torch.zeros(1, 1)}
    p, y = forward2(x)
    assert p.flatten().tolist() == [1.0, 0.0, 0.0]
    assert y.item() == x["V"].item()


@pytest.mark.parametrize("with_cv", [False, True])
def test_nan_in_a_source_row_reaches_what_it_reaches_in_torch(with_cv: bool) -> None:
    """Without cv the NaN reaches u and gW1 only; with cv, gu too (ReLU backward lets NaN through)."""
    x = inputs(shape := (37, 16, 64, 8, 3, 50), seed=9)
    m, k, _, g, _, _ = shape
    x["A"][x["idx"][3, 2], 5] = NAN
    grad, cv, cst = torch.randn(m, k, g), torch.randn(g) if with_cv else None, torch.randn(g)
    u, mean, m2 = forward1(x)
    x["u"] = u
    gu = grad.double() + cst.double() + (0.0 if cv is None else cv.double() * u.double())
    want = autograd64(x, "A B P WaT W1", stage1_64, gu)
    got = buffers(x, STAGE1_GRADS)
    backward1(x, grad, cv, cst, got)
    assert torch.isnan(mean).all() and torch.isnan(m2).all()
    for n, t in {"u": u, **got}.items():
        w = want["out0"] if n == "u" else want[n] + (1.0 if n in ACCUMULATED else 0.0)
        nan = torch.isnan(w)
        assert nan.any() == (n in ("u", "gW1") or with_cv), n
        assert torch.equal(torch.isnan(t), nan), n
        if not nan.all():
            close(t[~nan], w[~nan], TOL, n)


# ------------------------------------------------------------------ the whole layer


def cloud(n: int, k: int, seed: int):
    pts = np.random.default_rng(seed).random((n, 3))
    _, idx = cKDTree(pts).query(pts, k=k)
    return torch.tensor(pts), torch.from_numpy(idx).long()


def run(layer, x, pos, idx, gout, wants=("x", "pos")):
    x = x.detach().clone().requires_grad_("x" in wants)
    pos = pos.detach().clone().requires_grad_("pos" in wants)
    layer.zero_grad(set_to_none=True)
    y = layer(x, pos, idx)
    if y.requires_grad:
        y.backward(gout)
    grads = [x.grad, pos.grad] + [p.grad for _, p in layer.named_parameters()]
    return [y.detach()] + grads


def errors(got, exact):
    out = []
    for g, e in zip(got, exact):
        if e is None or e.abs().max() < 1e-9:  # e.g. key/query biases: zero up to rounding
            continue
        out.append(((g.double() - e).abs().max() / e.abs().max()).item())
    return out


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kwargs", [dict(share_planes=1), dict(share_planes=8), dict(share_planes=4, position_encoding="linear")])
def test_layer_float32_compiled_as_accurate_as_torch_ops(kwargs, train):
    n, k, c = 700, 16, 32
    pos, idx = cloud(n, k, seed=4)
    torch.manual_seed(0)
    ref = PointTransformerLayer(c, memory_efficient=False, **kwargs).double().train(train)
    for mod in ref.modules():
        if isinstance(mod, torch.nn.BatchNorm1d):
            with torch.no_grad():
                mod.weight.uniform_(-1.5, 1.5)  # negative scales too
                mod.running_var.uniform_(0.5, 2.0)
    x, gout = torch.randn(n, c, dtype=torch.float64), torch.randn(n, c, dtype=torch.float64)
    exact = run(copy.deepcopy(ref), x, pos, idx, gout)
    errs = {}
    for compiled in (True, False):
        native.enabled = compiled
        layer = copy.deepcopy(ref).float()
        layer.memory_efficient, layer.chunk_size = True, 97
        got = run(layer, x.float(), pos.float(), idx, gout.float())
        assert [g is None for g in got] == [e is None for e in exact]
        errs[compiled] = errors(got, exact)
    assert errs[True][0] < 1e-4, errs  # the output; gradients of a float32 run can lose more
    for a, b in zip(errs[True], errs[False]):
        assert a <= 3 * b + 2e-6, errs


@pytest.mark.parametrize("wants", [(), ("x",), ("pos",), ("x", "pos")])
def test_every_subset_of_gradients(wants):
    n, k, c = 200, 8, 16
    pos, idx = cloud(n, k, seed=5)
    torch.manual_seed(1)
    ref = PointTransformerLayer(c, share_planes=2, memory_efficient=False).double()
    x, gout = torch.randn(n, c, dtype=torch.float64), torch.randn(n, c, dtype=torch.float64)
    for p in ref.linear_w.parameters():
        p.requires_grad_(False)  # weights without gradient: their outputs are skipped
    exact = run(copy.deepcopy(ref), x, pos, idx, gout, wants)
    layer = copy.deepcopy(ref).float()
    layer.memory_efficient, layer.chunk_size = True, 33
    got = run(layer, x.float(), pos.float(), idx, gout.float(), wants)
    assert [g is None for g in got] == [e is None for e in exact]
    assert max(errors(got, exact)) < 1e-4


def test_two_threads_match_one_and_nan_propagates():
    n, k, c = 900, 16, 32
    pos, idx = cloud(n, k, seed=6)
    torch.manual_seed(2)
    layer = PointTransformerLayer(c, share_planes=4, chunk_size=50)
    x, gout = torch.randn(n, c), torch.randn(n, c)
    one = run(layer, x, pos.float(), idx, gout)
    torch.set_num_threads(2)
    two = run(layer, x, pos.float(), idx, gout)
    for a, b in zip(one, two):
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.set_num_threads(1)
    bad = x.clone()
    bad[10, 3] = float("nan")
    y = layer.eval()(bad, pos.float(), idx)
    assert torch.isnan(y).any()  # not hidden by the softmax's clamped exponent


@pytest.mark.parametrize("train", [True, False])
def test_nan_reaches_the_same_gradients_as_torch_ops(train):
    """A NaN input poisons the same outputs and gradients on both paths (ReLU backward lets NaN through)."""
    n, k, c = 60, 6, 8
    pos, idx = cloud(n, k, seed=8)
    torch.manual_seed(3)
    layer = PointTransformerLayer(c, share_planes=2, chunk_size=16).train(train)
    x, gout = torch.randn(n, c), torch.randn(n, c)
    x[10, 3] = float("nan")
    nans = {}
    for compiled in (True, False):
        native.enabled = compiled
        got = run(copy.deepcopy(layer), x, pos.float(), idx, gout)
        nans[compiled] = [None if g is None else int(torch.isnan(g).sum()) for g in got]
    assert nans[True] == nans[False]
