"""Grid pooling against a numpy voxel-dictionary oracle, per cloud of packed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from geometry_oracles import grid_oracle, random_batch

from sciformer.errors import DataError
from sciformer.geometry import grid_pool, grid_unpool, offset_to_batch, offset_to_sizes, segment_mean

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("origin", ["min", "zero"])
def test_grid_pool_matches_numpy_oracle(origin):
    rng = np.random.default_rng(0)
    pts, off = random_batch(rng, [500, 40, 1300])
    pts[600:610] = pts[0:10]  # cloud 2 reuses cloud 0's places: its voxels must stay separate
    feat = rng.normal(size=(len(pts), 5))
    size = 0.7
    got = grid_pool(torch.from_numpy(pts), size, torch.from_numpy(off), torch.from_numpy(feat), origin=origin)
    keys, groups, coord, fmax, fmean = grid_oracle(pts, off, size, feat, origin=origin)
    assert got.coord.shape == (len(keys), 3)
    voxel_cloud = np.array([key[0] for key in keys])
    assert got.offset.tolist() == np.cumsum(np.bincount(voxel_cloud, minlength=3)).tolist()
    np.testing.assert_allclose(got.coord.numpy(), coord, atol=1e-12)  # same (cloud, voxel) order
    np.testing.assert_allclose(got.feat.numpy(), fmax, atol=0)
    assert got.count.tolist() == [len(groups[key]) for key in keys]
    assert got.index.tolist() == [min(groups[key]) for key in keys]
    for v, key in enumerate(keys):  # the inverse map sends every member to its voxel
        assert set(torch.nonzero(got.cluster == v).flatten().tolist()) == set(groups[key])
    mean = grid_pool(torch.from_numpy(pts), size, torch.from_numpy(off), torch.from_numpy(feat), reduce="mean", origin=origin)
    np.testing.assert_allclose(mean.feat.numpy(), fmean, atol=1e-12)


def test_grid_pool_anisotropic_voxels_and_float32():
    rng = np.random.default_rng(1)
    pts = rng.random((2000, 3)).astype(np.float32) * np.array([10, 1, 1], dtype=np.float32)
    got = grid_pool(torch.from_numpy(pts), [1.0, 0.25, 0.5])
    keys, _, coord, _, _ = grid_oracle(pts.astype(np.float64), np.array([2000]), np.array([1.0, 0.25, 0.5]))
    assert len(keys) == got.coord.shape[0]
    np.testing.assert_allclose(got.coord.numpy(), coord, atol=1e-5)
    assert got.feat is None and got.coord.dtype == torch.float32


def test_grid_unpool_and_gradients():
    rng = np.random.default_rng(2)
    pts, off = random_batch(rng, [200, 300])
    x = torch.from_numpy(pts)
    feat = torch.randn(500, 4, dtype=torch.float64, requires_grad=True)
    pooled = grid_pool(x, 1.0, torch.from_numpy(off), feat, reduce="max")
    back = grid_unpool(pooled.feat, pooled.cluster)  # (N, C)
    assert back.shape == (500, 4)
    assert torch.equal(back, pooled.feat[pooled.cluster])
    back.sum().backward()
    assert feat.grad is not None and float(feat.grad.abs().sum()) > 0
    # gradient of max goes to each voxel's maximum, once per feature column
    expected = torch.zeros_like(feat)
    for v in range(pooled.count.shape[0]):
        members = torch.nonzero(pooled.cluster == v).flatten()
        winner = members[feat.detach()[members].argmax(dim=0)]
        expected[winner, torch.arange(4)] += pooled.count[v].to(feat.dtype)
    torch.testing.assert_close(feat.grad, expected)


def test_grid_pool_huge_lattice_path_matches_oracle():
    rng = np.random.default_rng(4)
    pts, off = random_batch(rng, [300, 200])
    pts[::7] += 1e7  # spread: (cloud, voxel) keys no longer fit one int64
    pts[1::7] -= 1e7
    got = grid_pool(torch.from_numpy(pts), 0.5, torch.from_numpy(off))
    keys, groups, coord, _, _ = grid_oracle(pts, off, 0.5)
    np.testing.assert_allclose(got.coord.numpy(), coord, rtol=1e-12)
    assert got.count.tolist() == [len(groups[key]) for key in keys]
    assert got.index.tolist() == [min(groups[key]) for key in keys]


def test_grid_pool_single_voxel_and_single_point():
    x = torch.tensor([[0.0, 0, 0], [0.1, 0.1, 0.1], [5.0, 5, 5]])
    got = grid_pool(x, 100.0, torch.tensor([2, 3]))
    assert got.offset.tolist() == [1, 2] and got.cluster.tolist() == [0, 0, 1]
    torch.testing.assert_close(got.coord, torch.tensor([[0.05, 0.05, 0.05], [5.0, 5, 5]]))


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((torch.rand(10, 3), 0.0), {}, "voxel_size"),
        ((torch.rand(10, 3), [1.0, 1.0]), {}, "voxel_size"),
        ((torch.rand(10, 3), float("nan")), {}, "voxel_size"),
        ((torch.rand(10, 3), 0.5), {"reduce": "min"}, "reduce must be"),
        ((torch.rand(10, 3), 0.5), {"feat": torch.rand(9, 2)}, "feat must"),
        ((torch.rand(10, 3), 0.5, torch.tensor([0, 10])), {}, "cloud 0 of coord is empty"),
    ],
)
def test_grid_pool_bad_input(args, kwargs, message):
    with pytest.raises(DataError, match=message):
        grid_pool(*args, **kwargs)


@cuda
@pytest.mark.cuda
def test_grid_pool_cuda_matches_cpu():
    rng = np.random.default_rng(3)
    pts, off = random_batch(rng, [3000, 1000])
    x, o = torch.from_numpy(pts).float(), torch.from_numpy(off)
    feat = torch.randn(4000, 8)
    cpu = grid_pool(x, 0.3, o, feat)
    gpu = grid_pool(x.cuda(), 0.3, o.cuda(), feat.cuda())
    assert gpu.coord.is_cuda and torch.equal(gpu.cluster.cpu(), cpu.cluster)
    torch.testing.assert_close(gpu.coord.cpu(), cpu.coord)
    torch.testing.assert_close(gpu.feat.cpu(), cpu.feat)
    assert torch.equal(gpu.offset.cpu(), cpu.offset)


@pytest.mark.parametrize("channels", [3, 12])  # both accumulation paths
def test_segment_mean_matches_numpy_per_segment(channels: int) -> None:
    rng = np.random.default_rng(channels)
    x = rng.normal(size=(50, channels))
    segment = rng.integers(0, 7, size=50)
    segment[segment == 4] = 5  # segment 4 empty
    count = np.bincount(segment, minlength=7)
    got = segment_mean(torch.from_numpy(x), torch.from_numpy(segment), torch.from_numpy(count)).numpy()
    expected = np.stack([x[segment == s].mean(axis=0) if count[s] else np.zeros(channels) for s in range(7)])
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_segment_mean_per_cloud_and_gradient() -> None:
    x = torch.arange(12.0, dtype=torch.float64).reshape(6, 2).requires_grad_()
    offset = torch.tensor([2, 2, 6])  # the middle cloud is empty
    out = segment_mean(x, offset_to_batch(offset), offset_to_sizes(offset))
    torch.testing.assert_close(out, torch.tensor([[1.0, 2.0], [0.0, 0.0], [7.0, 8.0]], dtype=torch.float64))
    out.sum().backward()
    torch.testing.assert_close(x.grad[:, 0], torch.tensor([0.5, 0.5, 0.25, 0.25, 0.25, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("far", [1e20, 1e38, 1e300])
def test_grid_pool_keeps_voxels_apart_beyond_int64(far):
    """Voxel coordinates past int64 (a FLT_MAX no-data point 1e38 away) once wrapped in the
    cast and merged every point of the cloud into one voxel; oracle: numpy's unique voxels."""
    rng = np.random.default_rng(2)
    c = rng.random((300, 3)) * 10
    c[0], c[1] = far, -far
    pooled = grid_pool(torch.from_numpy(c), 0.5, reduce="mean")
    cell = np.floor((c - c.min(axis=0)) / 0.5)
    _, oracle = np.unique(cell, axis=0, return_inverse=True)
    ours = pooled.cluster.numpy()
    assert len(pooled.count) == oracle.max() + 1
    pairs = set(zip(ours.tolist(), oracle.reshape(-1).tolist()))
    assert len(pairs) == len(pooled.count)  # the same partition of the points


def test_pool_cells_matches_grid_pool_and_numpy_oracle():
    """Given integer cells, ``pool_cells`` pools exactly as ``grid_pool`` on those cells with
    unit voxels (numpy voxel dictionary as the oracle of the partition and the max)."""
    from sciformer.geometry.grid import pool_cells

    rng = np.random.default_rng(5)
    pts, off = random_batch(rng, [120, 1, 77])
    cell = torch.from_numpy(np.floor(pts / 0.7).astype(np.int64))
    cell -= cell.min(dim=0).values
    coord = torch.from_numpy(pts)
    feat = torch.randn(len(pts), 3, dtype=torch.float64)
    got = pool_cells(cell, torch.from_numpy(off), coord, feat)
    ref = grid_pool(cell.to(torch.float64), 1.0, torch.from_numpy(off), feat, origin="zero")
    for a, b in [(got.cluster, ref.cluster), (got.count, ref.count), (got.index, ref.index), (got.offset, ref.offset), (got.feat, ref.feat)]:
        assert torch.equal(a, b)
    keys, groups, _, _, _ = grid_oracle(cell.numpy().astype(np.float64), off, 1.0, origin="zero")
    np.testing.assert_allclose(got.coord.numpy(), [pts[groups[k]].mean(axis=0) for k in keys], rtol=1e-12)
    np.testing.assert_array_equal(got.feat.numpy(), [feat.numpy()[groups[k]].max(axis=0) for k in keys])
    with pytest.raises(DataError, match="cell must be"):
        pool_cells(cell.to(torch.float64), torch.from_numpy(off), coord)


def test_segment_max_gradient_equals_scatter_reduce_amax_with_ties():
    """The fast backward of the voxel max equals torch's ``scatter_reduce("amax")`` gradient,
    ties (duplicate points) sharing their segment's gradient."""
    from sciformer.geometry.grid import segment_max

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 5, dtype=torch.float64, generator=gen)
    segment = torch.randint(0, 9, (40,), generator=gen)
    segment[segment == 4] = 5  # an empty segment
    x[3] = 10.0  # the maximum of its segment in every column
    x[7], segment[7] = x[3], segment[3]  # and a tie
    grad = torch.randn(9, 5, dtype=torch.float64, generator=gen)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = a.new_zeros((9, 5)).scatter_reduce(0, segment.unsqueeze(1).expand_as(a), a, "amax", include_self=False)
    got = segment_max(b, segment, 9)
    assert torch.equal(got, ref) and float(got[4].abs().sum()) == 0.0
    ref.backward(grad)
    got.backward(grad)
    torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-15)
    assert float(b.grad[3].abs().sum()) > 0 and torch.equal(b.grad[3], b.grad[7])
