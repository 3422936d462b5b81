"""Serialization of packed point clouds along space-filling curves (Point Transformer V3).

Points are first put on an integer grid (per cloud, origin at the cloud's minimum corner,
edge ``grid_size``); each grid cell ``(x, y, z)`` in ``[0, 2^depth)^3`` gets a code along
one of four curves:

- ``"z"``: Z-order (Morton): the bits of x, y, z interleaved, x most significant in each
  triple: ``code = sum_i x_i 2^(3i+2) + y_i 2^(3i+1) + z_i 2^(3i)``;
- ``"hilbert"``: the Hilbert curve (Skilling's transpose algorithm, "Programming the
  Hilbert curve", AIP Conf. Proc. 707, 2004): consecutive codes are face-adjacent cells;
- ``"z-trans"`` / ``"hilbert-trans"``: the same curves with x and y swapped.

:func:`serialize` puts the cloud index above the curve bits, so sorting the codes of a
packed batch sorts cloud by cloud, each cloud along its curve (as Pointcept does).
"""

from __future__ import annotations

import torch

from sciformer.errors import ConfigError, DataError
from sciformer.geometry._validate import check_points
from sciformer.geometry.batch import offset_to_batch

ORDERS = ("z", "z-trans", "hilbert", "hilbert-trans")
MAX_DEPTH = 20  # 3 * 20 curve bits + cloud bits must fit in int64


def grid_coordinates(coord: torch.Tensor, grid_size: float, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Integer grid cell of every point, per cloud, origin at the cloud's minimum corner.

    ``cell = floor((p - min_b) / grid_size)`` computed in float64.

    Shapes:
        coord: (N, 3), offset: (B,) -> (N, 3) int64 >= 0
    """
    if not grid_size > 0:
        raise ConfigError(f"grid_size: expected a positive voxel edge, got {grid_size}")
    if coord.is_floating_point():  # a NaN would become cell -2^63 and move its cloud's corner
        check_points(coord, "coord", 3)
    c64 = coord.detach().to(torch.float64)
    if offset is None or offset.numel() <= 1:
        lo = c64.min(dim=0, keepdim=True).values  # (1, 3)
    else:
        batch = offset_to_batch(offset).to(coord.device)  # (N,)
        lo = torch.full((offset.numel(), 3), float("inf"), dtype=torch.float64, device=coord.device)
        lo = lo.scatter_reduce(0, batch.unsqueeze(1).expand(-1, 3), c64, "amin")[batch]  # (N, 3)
    return torch.floor((c64 - lo) / grid_size).to(torch.int64)  # (N, 3)


def curve_depth(grid: torch.Tensor) -> int:
    """Bits per axis needed for the grid cells (at least 1)."""
    top = int(grid.max()) if grid.numel() else 0
    low = int(grid.min()) if grid.numel() else 0
    depth = max(1, top.bit_length())
    if depth > MAX_DEPTH or low < 0:
        raise DataError(
            f"grid: expected cells in [0, 2^{MAX_DEPTH}) per axis, got min {low} and max {top}; use a larger grid_size"
        )
    return depth


def morton_encode(grid: torch.Tensor, depth: int) -> torch.Tensor:
    """Z-order code of integer cells (x most significant in each bit triple).

    Shapes:
        grid: (N, 3) int64 in [0, 2^depth) -> (N,) int64
    """
    g = grid.to(torch.int64)
    code = torch.zeros(g.shape[0], dtype=torch.int64, device=g.device)  # (N,)
    for i in range(depth):
        for axis in range(3):
            bit = (g[:, axis] >> i) & 1  # (N,)
            code |= bit << (3 * i + 2 - axis)
    return code


def hilbert_encode(grid: torch.Tensor, depth: int) -> torch.Tensor:
    """Hilbert code of integer cells (Skilling's algorithm, vectorised over points).

    Shapes:
        grid: (N, 3) int64 in [0, 2^depth) -> (N,) int64
    """
    x = [grid[:, a].to(torch.int64).clone() for a in range(3)]  # 3 x (N,)
    q = 1 << (depth - 1)
    while q > 1:  # inverse undo
        p = q - 1
        for i in range(3):
            hit = (x[i] & q) != 0  # (N,)
            t = (x[0] ^ x[i]) & p
            x0_new = torch.where(hit, x[0] ^ p, x[0] ^ t)
            if i > 0:
                x[i] = torch.where(hit, x[i], x[i] ^ t)
            x[0] = x0_new
        q >>= 1
    for i in range(1, 3):  # Gray encode
        x[i] = x[i] ^ x[i - 1]
    t = torch.zeros_like(x[0])
    q = 1 << (depth - 1)
    while q > 1:
        t = torch.where((x[2] & q) != 0, t ^ (q - 1), t)
        q >>= 1
    x = [xi ^ t for xi in x]
    return morton_encode(torch.stack(x, dim=1), depth)  # interleave the transposed bits


def encode(grid: torch.Tensor, order: str, depth: int) -> torch.Tensor:
    """Curve code of integer cells for one of :data:`ORDERS`.

    Shapes:
        grid: (N, 3) int64 -> (N,) int64
    """
    if order not in ORDERS:
        raise ConfigError(f"order: expected one of {ORDERS}, got {order!r}")
    if order.endswith("-trans"):
        grid = grid[:, [1, 0, 2]]  # (N, 3) x and y swapped
    return (hilbert_encode if order.startswith("hilbert") else morton_encode)(grid, depth)


def serialize(grid: torch.Tensor, offset: torch.Tensor, order: str, depth: int | None = None) -> torch.Tensor:
    """Codes of a packed batch: ``cloud << 3 depth | curve code`` (clouds never interleave).

    Without ``depth``, each cloud is coded at its own depth (the bits its cells need), so a
    cloud's order does not depend on the other clouds of its batch: a Hilbert curve of
    another depth orders the same cells differently.

    Shapes:
        grid: (N, 3) int64 >= 0, offset: (B,) -> (N,) int64
    """
    top = curve_depth(grid) if depth is None else depth
    batch = offset_to_batch(offset).to(grid.device)  # (N,)
    if offset.numel() > 1 and (offset.numel() - 1).bit_length() + 3 * top > 62:
        raise DataError(f"serialize: {offset.numel()} clouds with depth {top} overflow int64 codes")
    if depth is not None or offset.numel() <= 1 or order in ("z", "z-trans"):  # Z-order codes nest across depths
        return (batch << (3 * top)) | encode(grid, order, top)  # (N,)
    cloud_top = torch.zeros(offset.numel(), dtype=torch.int64, device=grid.device)
    cloud_top = cloud_top.scatter_reduce(0, batch, grid.amax(dim=1), "amax")  # (B,) largest cell per cloud
    point_depth = torch.tensor([max(1, int(v).bit_length()) for v in cloud_top.tolist()], device=grid.device)[batch]  # (N,)
    code = torch.empty_like(batch)  # (N,)
    for d in point_depth.unique().tolist():
        rows = (point_depth == d).nonzero().squeeze(1)  # (n_d,)
        code[rows] = encode(grid[rows], order, d)
    return (batch << (3 * top)) | code  # (N,)


def serialization_order(grid: torch.Tensor, offset: torch.Tensor, order: str, depth: int | None = None) -> torch.Tensor:
    """Permutation sorting the points cloud by cloud along the curve (stable on ties).

    Shapes:
        grid: (N, 3), offset: (B,) -> (N,) int64, positions of the points in serialized order
    """
    return torch.argsort(serialize(grid, offset, order, depth), stable=True)  # (N,)
