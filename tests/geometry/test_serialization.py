"""Space-filling-curve serialization against plain-Python Morton / Hilbert encoders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sciformer.errors import ConfigError, DataError
from sciformer.geometry import (
    grid_coordinates,
    serialization_order,
    serialize,
    sizes_to_offset,
)
from sciformer.geometry.serialization import (
    ORDERS,
    encode,
    hilbert_encode,
    morton_encode,
)


def morton_reference(x: int, y: int, z: int, depth: int) -> int:
    """Bit by bit: for bit i from the top, append x_i, y_i, z_i."""
    code = 0
    for i in range(depth - 1, -1, -1):
        for v in (x, y, z):
            code = (code << 1) | ((v >> i) & 1)
    return code


def hilbert_reference(x: int, y: int, z: int, depth: int) -> int:
    """Skilling (2004), AxesToTranspose on one point, then the transposed bits read out."""
    X = [x, y, z]
    m = 1 << (depth - 1)
    q = m
    while q > 1:
        p = q - 1
        for i in range(3):
            if X[i] & q:
                X[0] ^= p
            else:
                t = (X[0] ^ X[i]) & p
                X[0] ^= t
                X[i] ^= t
        q >>= 1
    for i in range(1, 3):
        X[i] ^= X[i - 1]
    t = 0
    q = m
    while q > 1:
        if X[2] & q:
            t ^= q - 1
        q >>= 1
    X = [v ^ t for v in X]
    code = 0
    for i in range(depth - 1, -1, -1):
        for v in X:
            code = (code << 1) | ((v >> i) & 1)
    return code


@pytest.mark.parametrize("depth", [1, 3, 7, 16])
def test_morton_and_hilbert_match_plain_python(depth: int) -> None:
    gen = torch.Generator().manual_seed(depth)
    grid = torch.randint(0, 1 << depth, (300, 3), generator=gen)
    m, h = morton_encode(grid, depth).tolist(), hilbert_encode(grid, depth).tolist()
    for (x, y, z), mc, hc in zip(grid.tolist(), m, h):
        assert mc == morton_reference(x, y, z, depth)
        assert hc == hilbert_reference(x, y, z, depth)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_curves_visit_every_cell_once(order: str, depth: int) -> None:
    side = 1 << depth
    axes = torch.arange(side)
    grid = torch.cartesian_prod(axes, axes, axes)  # (side^3, 3)
    codes = encode(grid, order, depth)
    assert sorted(codes.tolist()) == list(range(side**3))  # a bijection onto [0, 8^depth)
    path = grid[torch.argsort(codes)]  # cells in curve order
    steps = (path[1:] - path[:-1]).abs().sum(dim=1)  # L1 step between consecutive cells
    if order.startswith("hilbert"):
        assert bool((steps == 1).all())  # the Hilbert curve moves to a face neighbour
    else:
        assert int(steps.max()) > 1  # the Z-order curve jumps
        # z-order: the first 8 cells are the unit cube in x-major bit order
        first = path[:8].tolist()
        expect = [[(c >> 2) & 1, (c >> 1) & 1, c & 1] for c in range(8)]
        if order == "z-trans":
            expect = [[b, a, c] for a, b, c in expect]
        assert first == expect


def test_trans_orders_swap_x_and_y() -> None:
    grid = torch.randint(0, 64, (50, 3), generator=torch.Generator().manual_seed(1))
    swapped = grid[:, [1, 0, 2]]
    for base in ("z", "hilbert"):
        assert torch.equal(encode(grid, f"{base}-trans", 6), encode(swapped, base, 6))


def test_serialize_keeps_clouds_apart_and_orders_each_cloud_alone() -> None:
    gen = torch.Generator().manual_seed(2)
    sizes = [40, 7, 25]
    grid = torch.randint(0, 32, (sum(sizes), 3), generator=gen)
    offset = sizes_to_offset(sizes)
    for order in ORDERS:
        perm = serialization_order(grid, offset, order)
        cloud = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
        assert torch.equal(cloud[perm], cloud)  # cloud by cloud, in batch order
        start = 0
        for size in sizes:
            alone = serialization_order(grid[start : start + size], sizes_to_offset([size]), order, depth=5)
            assert torch.equal(perm[start : start + size] - start, alone)
            start += size
        codes = serialize(grid, offset, order)
        assert bool((codes[perm][1:] >= codes[perm][:-1]).all())


@pytest.mark.parametrize("order", ORDERS)
def test_a_clouds_order_does_not_depend_on_the_other_clouds_extent(order: str) -> None:
    """A small cloud batched with a far larger one is ordered as it is alone (the larger cloud
    needs more curve bits; a Hilbert curve of more bits orders the small cloud's cells differently)."""
    gen = torch.Generator().manual_seed(3)
    small, large = torch.randint(0, 8, (60, 3), generator=gen), torch.randint(0, 1000, (50, 3), generator=gen)
    for first, second in ((small, large), (large, small)):
        grid = torch.cat([first, second])
        perm = serialization_order(grid, sizes_to_offset([len(first), len(second)]), order)
        assert torch.equal(perm[: len(first)], serialization_order(first, sizes_to_offset([len(first)]), order))
        alone = serialization_order(second, sizes_to_offset([len(second)]), order)
        assert torch.equal(perm[len(first) :] - len(first), alone)


def test_grid_coordinates_per_cloud_origin() -> None:
    gen = torch.Generator().manual_seed(3)
    coord = torch.rand(30, 3, generator=gen) * 5
    offset = sizes_to_offset([12, 18])
    grid = grid_coordinates(coord, 0.5, offset)
    c = coord.double().numpy()
    for lo, hi in ((0, 12), (12, 30)):
        expect = np.floor((c[lo:hi] - c[lo:hi].min(0)) / 0.5).astype(np.int64)
        assert np.array_equal(grid[lo:hi].numpy(), expect)


def test_bad_input_raises() -> None:
    grid = torch.zeros(4, 3, dtype=torch.int64)
    with pytest.raises(ConfigError, match="order"):
        encode(grid, "peano", 2)
    with pytest.raises(DataError, match="larger grid_size"):
        serialize(torch.full((2, 3), 1 << 22), sizes_to_offset([2]), "z")
    with pytest.raises(ConfigError, match="grid_size"):
        grid_coordinates(torch.rand(3, 3), 0.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_grid_coordinates_refuse_non_finite_coordinates(bad: float) -> None:
    coord = torch.rand(5, 3)
    coord[2, 1] = bad
    with pytest.raises(DataError, match="non-finite.*row 2"):
        grid_coordinates(coord, 0.1)

