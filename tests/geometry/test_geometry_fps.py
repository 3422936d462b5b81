"""Farthest point sampling against a textbook numpy reference, per cloud of packed batches."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from geometry_oracles import clouds, fps_is_valid, fps_reference, random_batch

from sciformer.errors import DataError
from sciformer.geometry import fps
from sciformer.geometry.knn import has_module

fps_module = importlib.import_module("sciformer.geometry.fps")  # the package attribute is the function
EXACT = ["numpy", "torch"]
BACKENDS = EXACT + (["fpsample"] if has_module("fpsample") else [])
needs_fpsample = pytest.mark.skipif(not has_module("fpsample"), reason="fpsample not installed")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def reference(pts, off, counts, starts):
    out = []
    for (s0, s1), m, st in zip(clouds(off), counts, starts):
        out += [s0 + j for j in fps_reference(pts[s0:s1], m, st)]
    return out


@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fps_matches_reference_on_packed_batch(backend, dtype):
    rng = np.random.default_rng(0)
    pts, off = random_batch(rng, [300, 1200, 57, 800])
    pts = pts.astype(np.float32).astype(np.float64)  # same points in both dtypes
    counts, starts = [75, 300, 14, 200], [0, 17, 56, 799]
    got = fps(torch.from_numpy(pts).to(dtype), torch.from_numpy(off), n=counts, start=starts, backend=backend)
    assert got.index.dtype == torch.int64
    assert got.offset.tolist() == np.cumsum(counts).tolist()
    assert got.index.tolist() == reference(pts, off, counts, starts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fps_by_ratio_and_default_start(backend):
    rng = np.random.default_rng(1)
    pts, off = random_batch(rng, [10, 3, 1, 400])
    got = fps(torch.from_numpy(pts), torch.from_numpy(off), ratio=0.25, backend=backend)
    counts = [2, 1, 1, 100]  # floor(size * ratio), at least 1
    assert got.offset.tolist() == np.cumsum(counts).tolist()
    assert got.index.tolist() == reference(pts, off, counts, [0, 0, 0, 0])


@needs_fpsample
def test_fpsample_backend_honours_every_start_index():
    rng = np.random.default_rng(2)
    pts = rng.random((3000, 3)).astype(np.float32)
    for start in [0, 1, 1234, 2999]:
        got = fps(torch.from_numpy(pts), n=300, start=start, backend="fpsample").index.tolist()
        assert got == fps_reference(pts, 300, start)


@needs_fpsample
def test_fpsample_backend_is_exact_on_larger_cloud():
    rng = np.random.default_rng(3)
    pts = rng.random((10_000, 3)).astype(np.float32)
    got = fps(torch.from_numpy(pts), ratio=0.25, start=77, backend="fpsample").index.tolist()
    assert len(got) == 2500 and fps_is_valid(pts, got, 77)


@needs_fpsample
@pytest.mark.parametrize("replay", ["_kdline_position", "_kdline_position_numpy"])
def test_kdline_replay_finds_where_fpsample_puts_the_start(replay):
    """The replay itself is right (not rescued by the fallback), deep trees and scan order
    too; compiled (where built) and NumPy."""
    import fpsample

    rng = np.random.default_rng(5)
    xs, ys = np.meshgrid(np.linspace(0, 50, 120), np.linspace(0, 30, 100))
    scan = np.stack([xs.ravel(), ys.ravel(), rng.normal(size=xs.size)], axis=1).astype(np.float32)
    for pts in (rng.random((20_000, 3)).astype(np.float32), scan):
        for height in (1, 4, 7):
            for start in (0, 5, len(pts) // 2, len(pts) - 1):
                at = getattr(fps_module, replay)(pts, height, start)
                assert int(fpsample.bucket_fps_kdline_sampling(pts, 2, height, start_idx=at)[0]) == start


@needs_fpsample
def test_kdline_replay_compiled_equals_numpy_on_ties_and_dimensions():
    """Ties at the split (integer lattices, duplicates), 1-8 dimensions, anisotropic scales,
    leaves of one point (height past log2 n): the compiled replay gives the NumPy one's answer,
    and fpsample agrees with it."""
    import fpsample

    if fps_module._kdline_kernel() is None:
        pytest.skip("compiled geometry kernel not built")
    rng = np.random.default_rng(11)
    for trial in range(120):
        n, dim = int(rng.integers(2, 2000)), int(rng.integers(1, 9))
        pts = [rng.random((n, dim)), rng.integers(0, 4, (n, dim)).astype(float),
               np.repeat(rng.random((n // 7 + 1, dim)), 7, axis=0)[:n],
               rng.normal(size=(n, dim)) * np.array([1e4] + [1e-3] * (dim - 1))][trial % 4]
        pts = np.ascontiguousarray(pts, dtype=np.float32)
        for height in (1, 3, 7, 12):
            for start in (0, n - 1, int(rng.integers(n))):
                at = fps_module._kdline_position(pts, height, start)
                assert at == fps_module._kdline_position_numpy(pts, height, start)
                if 2**height <= n and trial % 6 == 0:
                    assert int(fpsample.bucket_fps_kdline_sampling(pts, 2, height, start_idx=at)[0]) == start


@needs_fpsample
def test_fpsample_start_fallback_when_replay_is_wrong(monkeypatch):
    rng = np.random.default_rng(4)
    pts = rng.random((500, 3)).astype(np.float32)
    monkeypatch.setattr(fps_module, "_kdline_position", lambda pts, h, start: (start + 1) % len(pts))
    got = fps(torch.from_numpy(pts), n=50, start=9, backend="fpsample").index.tolist()
    assert got == fps_reference(pts, 50, 9)


def degenerate_clouds():
    line = np.zeros((9, 3))
    line[:, 0] = np.arange(9)  # collinear, evenly spaced: many exact ties
    lattice = np.stack(np.meshgrid(np.arange(4), np.arange(4), np.arange(3), indexing="ij"), -1).reshape(-1, 3)
    dup = np.repeat(np.array([[0.0, 0, 0], [2, 0, 0], [0, 3, 0], [1, 1, 1]]), 5, axis=0)  # 4 places x 5
    same = np.ones((6, 3))
    return {"line": line, "lattice": lattice.astype(float), "duplicates": dup, "all_same": same}


@pytest.mark.parametrize("name", list(degenerate_clouds()))
@pytest.mark.parametrize("backend", BACKENDS)
def test_fps_degenerate_inputs(name, backend):
    pts = degenerate_clouds()[name]
    n = len(pts)
    for m in (1, n // 2, n):  # up to every point: no index repeats, even past the distinct places
        got = fps(torch.from_numpy(pts), n=m, start=1, backend=backend).index.tolist()
        assert len(got) == m and len(set(got)) == m
        assert fps_is_valid(pts, got, 1)
        if backend in EXACT:  # integer coordinates: exact ties, lowest index wins
            assert got == fps_reference(pts, m, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fps_single_point_and_two_points(backend):
    one = torch.tensor([[1.0, 2.0, 3.0]])
    assert fps(one, n=1, backend=backend).index.tolist() == [0]
    two = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [5.0, 5, 5], [5.0, 5, 6]])
    got = fps(two, torch.tensor([2, 4]), n=2, start=[1, 0], backend=backend)
    assert got.index.tolist() == [1, 0, 2, 3] and got.offset.tolist() == [2, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fps_oversample_policies(backend):
    pts = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [3.0, 0, 0], [10.0, 0, 0], [11.0, 0, 0]])
    off = torch.tensor([3, 5])
    with pytest.raises(DataError, match="4 samples requested from cloud 0, which has 3 points"):
        fps(pts, off, n=4, backend=backend)
    clamp = fps(pts, off, n=4, oversample="clamp", backend=backend)
    assert clamp.index.tolist() == [0, 2, 1, 3, 4] and clamp.offset.tolist() == [3, 5]
    rep = fps(pts, off, n=4, oversample="repeat", backend=backend)
    assert rep.index.tolist() == [0, 2, 1, 0, 3, 4, 3, 4] and rep.offset.tolist() == [4, 8]


@needs_fpsample
def test_fpsample_repair_when_duplicates_exhaust_distinct_places():
    rng = np.random.default_rng(5)
    places = rng.random((50, 3)).astype(np.float32)
    pts = np.concatenate([places] * 3)  # 150 points at 50 places
    got = fps(torch.from_numpy(pts), n=120, backend="fpsample").index.tolist()
    assert len(set(got)) == 120 and fps_is_valid(pts, got, 0)
    places_first = {tuple(p) for p in pts[got[:50]].tolist()}
    assert len(places_first) == 50  # every place before any repeat


def test_fps_auto_uses_exact_loop_above_eight_dimensions():
    rng = np.random.default_rng(6)
    pts = rng.random((200, 9))
    assert fps(torch.from_numpy(pts), n=20).index.tolist() == fps_reference(pts, 20, 0)
    with pytest.raises(DataError, match="at most 8 dimensions"):
        fps(torch.from_numpy(pts), n=20, backend="fpsample")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 2, "ratio": 0.5}, "exactly one"),
        ({}, "exactly one"),
        ({"ratio": 0.0}, "ratio must be"),
        ({"ratio": 1.5}, "ratio must be"),
        ({"n": 0}, "n must be >= 1"),
        ({"n": [2, 2, 2]}, "3 entries for 2 clouds"),
        ({"n": 2.5}, "n must be an int"),
        ({"n": 2, "start": 7}, "start=7 is outside cloud 0"),
        ({"n": 2, "backend": "cuda"}, "backend must be"),
        ({"n": 2, "oversample": "pad"}, "oversample must be"),
    ],
)
def test_fps_bad_arguments(kwargs, message):
    with pytest.raises(DataError, match=message):
        fps(torch.rand(10, 3), torch.tensor([5, 10]), **kwargs)


def test_fps_keeps_device_and_no_autograd():
    x = torch.rand(100, 3, requires_grad=True)
    got = fps(x, ratio=0.1)
    assert got.index.device == x.device and not got.index.requires_grad


@cuda
@pytest.mark.cuda
def test_fps_cuda_torch_loop_matches_reference():
    rng = np.random.default_rng(7)
    pts, off = random_batch(rng, [500, 2000, 37])
    got = fps(torch.from_numpy(pts).cuda(), torch.from_numpy(off).cuda(), ratio=0.25)
    assert got.index.is_cuda and got.offset.is_cuda
    counts = [125, 500, 9]
    assert got.index.cpu().tolist() == reference(pts, off, counts, [0, 0, 0])
