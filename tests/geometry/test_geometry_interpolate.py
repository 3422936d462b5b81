"""3-NN inverse-distance interpolation against a plain numpy loop, per cloud of packed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from geometry_oracles import interpolation_oracle, random_batch

from sciformer.errors import DataError
from sciformer.geometry import fps, interpolate, interpolation_weights
from sciformer.geometry.knn import available_backends

BACKENDS = ["brute", "scipy"] + (["pykdtree"] if available_backends()["pykdtree"] else [])
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("backend", BACKENDS)
def test_interpolate_matches_numpy_loop(backend):
    rng = np.random.default_rng(0)
    fine, f_off = random_batch(rng, [400, 90, 250])
    down = fps(torch.from_numpy(fine), torch.from_numpy(f_off), ratio=0.25)  # transition down, then up
    coarse, c_off = fine[down.index.numpy()], down.offset.numpy()
    feat = rng.normal(size=(len(coarse), 6))
    got = interpolate(
        torch.from_numpy(coarse), torch.from_numpy(feat), torch.from_numpy(fine),
        torch.from_numpy(c_off), torch.from_numpy(f_off), backend=backend,
    )
    want = interpolation_oracle(coarse, feat, fine, c_off, f_off)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)
    # fine points that were kept by FPS get (almost exactly) their own coarse feature
    np.testing.assert_allclose(got[down.index].numpy(), feat, atol=1e-6)


def test_interpolation_weights_sum_to_one_and_reuse():
    rng = np.random.default_rng(1)
    coarse, c_off = random_batch(rng, [30, 2])  # second coarse cloud smaller than k=3
    fine, f_off = random_batch(rng, [100, 20])
    c, f = torch.from_numpy(coarse), torch.from_numpy(fine)
    co, fo = torch.from_numpy(c_off), torch.from_numpy(f_off)
    index, weight = interpolation_weights(c, f, co, fo)
    assert index.shape == weight.shape == (120, 3)
    torch.testing.assert_close(weight.sum(dim=1), torch.ones(120, dtype=torch.float64))
    assert bool((weight[100:, 2] == 0).all()) and bool((index[100:, :2] >= 30).all())
    feat = torch.from_numpy(rng.normal(size=(32, 4)))
    reused = interpolate(c, feat, f, co, fo, weights=(index, weight))
    torch.testing.assert_close(reused, interpolate(c, feat, f, co, fo))
    want = interpolation_oracle(coarse, feat.numpy(), fine, c_off, f_off)
    np.testing.assert_allclose(reused.numpy(), want, rtol=1e-9, atol=1e-9)


def test_interpolate_is_differentiable_wrt_features():
    rng = np.random.default_rng(2)
    coarse, c_off = random_batch(rng, [12, 9])
    fine, f_off = random_batch(rng, [30, 25])
    c, f = torch.from_numpy(coarse), torch.from_numpy(fine)
    co, fo = torch.from_numpy(c_off), torch.from_numpy(f_off)
    feat = torch.randn(21, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: interpolate(c, x, f, co, fo), (feat,))
    out = interpolate(c, feat.float(), f, co, fo)
    assert out.dtype == torch.float32


def test_interpolate_bad_input():
    with pytest.raises(DataError, match="coarse_feat must have shape"):
        interpolate(torch.rand(5, 3), torch.rand(4, 2), torch.rand(9, 3))
    with pytest.raises(DataError, match="fine_coord must have D=3"):
        interpolate(torch.rand(5, 3), torch.rand(5, 2), torch.rand(9, 2))
    with pytest.raises(DataError, match="coarse_coord must be a torch.Tensor"):
        interpolate([[0.0, 0.0, 0.0]], torch.rand(1, 2), torch.rand(9, 3))
    with pytest.raises(DataError, match="k must be"):
        interpolation_weights(torch.rand(5, 3), torch.rand(9, 3), k=0)
    with pytest.raises(DataError, match="clouds"):
        interpolate(torch.rand(5, 3), torch.rand(5, 2), torch.rand(9, 3), torch.tensor([5]), torch.tensor([4, 9]))


@cuda
@pytest.mark.cuda
def test_interpolate_cuda_matches_cpu():
    rng = np.random.default_rng(3)
    coarse, c_off = random_batch(rng, [300, 100])
    fine, f_off = random_batch(rng, [1200, 400])
    args = [torch.from_numpy(a).float() for a in (coarse, rng.normal(size=(400, 8)), fine)]
    offs = [torch.from_numpy(c_off), torch.from_numpy(f_off)]
    cpu = interpolate(*args, *offs)
    gpu = interpolate(*[a.cuda() for a in args], *[o.cuda() for o in offs])
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)
