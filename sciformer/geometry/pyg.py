"""PyTorch Geometric interop: neighbour indices <-> ``edge_index``, ``Data``/``Batch`` <-> packed batches.

sciformer's neighbourhood layers take a dense neighbour index ``idx`` (N, k), ``-1`` for
padding (see :mod:`sciformer.attention.neighbor_index`); PyG describes the same graph by
``edge_index`` (2, E) with ``edge_index[0]`` the neighbour (source, j) and
``edge_index[1]`` the centre (target, i), PyG's default ``flow="source_to_target"``, as
``torch_geometric.nn.knn_graph`` returns it. Point models take a packed batch dict
(``coord``, ``feat``, ``offset``); :func:`as_packed_batch` turns a PyG ``Data``/``Batch``
(``pos``, ``x``, ``batch``) into one, so ``model(pyg_batch)`` works.

torch_geometric is imported only where a PyG object is built (:class:`PyGDataset`,
:func:`batch_to_pyg`); reading PyG objects needs only their attributes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from sciformer.errors import DataError
from sciformer.geometry.batch import from_pyg, to_pyg

__all__ = ["EdgeIndexAdapter", "PyGDataset", "as_packed_batch", "batch_to_pyg", "edge_index_to_neighbors",
           "is_pyg_data", "neighbors_to_edge_index", "sample_to_pyg"]


def neighbors_to_edge_index(idx: Tensor) -> Tensor:
    """(N, k) neighbour index -> PyG ``edge_index`` (2, E), padding (-1) dropped.

    Edges run from neighbour j (row 0) to centre i (row 1), centre by centre in the
    order of ``idx``'s columns.

    Shapes:
        idx: (N, k) int -> edge_index: (2, E) int64, E = number of entries >= 0
    """
    if not isinstance(idx, Tensor) or idx.ndim != 2 or idx.dtype.is_floating_point:
        raise DataError(f"idx must be an integer tensor of shape (N, k), got {getattr(idx, 'shape', type(idx).__name__)}")
    n, k = idx.shape
    centre = torch.arange(n, device=idx.device).unsqueeze(1).expand(n, k)  # (N, k)
    keep = idx >= 0  # (N, k)
    return torch.stack([idx[keep].long(), centre[keep]], dim=0)  # (2, E)


def edge_index_to_neighbors(edge_index: Tensor, num_nodes: int, k: int | None = None) -> Tensor:
    """PyG ``edge_index`` (2, E) -> (N, k) neighbour index, rows padded with -1.

    Row i lists the sources j of the edges j -> i in the order they appear in
    ``edge_index``. ``k`` defaults to the largest in-degree; a node with more than ``k``
    incoming edges is an error (no neighbour is dropped silently).

    Shapes:
        edge_index: (2, E) int -> idx: (num_nodes, k) int64, -1 = padding
    """
    if not isinstance(edge_index, Tensor) or edge_index.ndim != 2 or edge_index.shape[0] != 2 or edge_index.dtype.is_floating_point:
        raise DataError(f"edge_index must be an integer tensor of shape (2, E), got {getattr(edge_index, 'shape', type(edge_index).__name__)}")
    src, dst = edge_index[0].long(), edge_index[1].long()  # (E,), (E,)
    if src.numel() and (int(torch.minimum(src.min(), dst.min())) < 0 or int(torch.maximum(src.max(), dst.max())) >= num_nodes):
        raise DataError(f"edge_index values must lie in [0, {num_nodes})")
    degree = torch.bincount(dst, minlength=num_nodes)  # (N,)
    width = int(degree.max()) if degree.numel() and dst.numel() else 0
    if k is None:
        k = max(width, 1)
    elif width > k:
        node = int(torch.argmax(degree))
        raise DataError(f"edge_index: node {node} has {width} incoming edges, more than k={k}")
    order = torch.sort(dst, stable=True).indices  # (E,) edges grouped by centre, original order kept
    dst_sorted = dst[order]
    starts = torch.cumsum(degree, 0) - degree  # (N,) first edge of each centre
    slot = torch.arange(dst.numel(), device=dst.device) - starts[dst_sorted]  # (E,) column in its row
    idx = torch.full((num_nodes, k), -1, dtype=torch.long, device=edge_index.device)  # (N, k)
    idx[dst_sorted, slot] = src[order]
    return idx


class EdgeIndexAdapter(nn.Module):
    """Use a sciformer neighbourhood layer (``layer(x, pos, idx)``) as a PyG-style ``(x, pos, edge_index)`` layer.

    Shapes:
        x: (N, C_in), pos: (N, 3), edge_index: (2, E) -> (N, C_out)
    """

    def __init__(self, layer: nn.Module, k: int | None = None) -> None:
        super().__init__()
        self.layer, self.k = layer, k

    def forward(self, x: Tensor, pos: Tensor, edge_index: Tensor) -> Tensor:
        idx = edge_index_to_neighbors(edge_index, x.shape[0], self.k)  # (N, k)
        return self.layer(x, pos, idx)  # (N, C_out)


def is_pyg_data(obj: Any) -> bool:
    """True for a ``torch_geometric.data.Data`` / ``Batch`` (or another PyG data object)."""
    return any(cls.__module__.startswith("torch_geometric.") for cls in type(obj).__mro__)


def as_packed_batch(batch: Any) -> dict[str, Any]:
    """A model's input as a packed batch dict: a dict unchanged, a PyG ``Data``/``Batch`` converted.

    ``pos`` -> ``coord``, ``x`` -> ``feat`` (the model's input channels; absent: none),
    ``batch`` -> ``offset``, ``y`` -> ``target`` and ``category`` kept (part segmentation).

    Shapes:
        Data(pos (N, 3), x (N, C), batch (N,), y) -> {coord (N, 3), feat (N, C), offset (B,), target}
    """
    if isinstance(batch, dict) or not is_pyg_data(batch):
        return batch
    packed = from_pyg(batch)
    out: dict[str, Any] = {"coord": packed.coord, "offset": packed.offset}
    out["feat"] = packed.feat if packed.feat is not None else packed.coord.new_zeros((packed.coord.shape[0], 0))
    y = getattr(batch, "y", None)
    if isinstance(y, Tensor):
        out["target"] = y
    category = getattr(batch, "category", None)
    if isinstance(category, Tensor):
        out["category"] = category.reshape(-1)
    return out


def batch_to_pyg(batch: dict[str, Any]) -> Any:
    """A packed batch dict -> ``torch_geometric.data.Batch`` (``pos``, ``x``, ``batch``, per-point ``y``).

    Shapes:
        {coord (N, 3), feat (N, C), offset (B,), target (N,) or (B,)} -> Batch
    """
    coord, offset, feat = batch["coord"], batch["offset"], batch.get("feat")
    target = batch.get("target")
    fields = {"y": target} if isinstance(target, Tensor) and target.shape[:1] == coord.shape[:1] else {}
    out = to_pyg(coord, offset, feat, **fields)
    if isinstance(target, Tensor) and not fields and target.numel() == len(offset):
        out.y = target  # one label per cloud
    if isinstance(batch.get("category"), Tensor):
        out.category = batch["category"]
    return out


def sample_to_pyg(sample: dict[str, Any]) -> Any:
    """One sample dict (``coord`` (n, 3), ``feat`` (n, C), optional ``label``, ``category``) -> ``Data``."""
    from torch_geometric.data import Data

    fields: dict[str, Any] = {"pos": torch.as_tensor(sample["coord"], dtype=torch.float32)}
    if sample.get("feat") is not None:
        fields["x"] = torch.as_tensor(sample["feat"], dtype=torch.float32)
    if sample.get("label") is not None:
        fields["y"] = torch.as_tensor(sample["label"], dtype=torch.long).reshape(-1)
    if sample.get("category") is not None:
        fields["category"] = torch.as_tensor(sample["category"], dtype=torch.long).reshape(1)
    return Data(**fields)


class PyGDataset(torch.utils.data.Dataset):
    """A map-style dataset of point samples seen as ``torch_geometric.data.Data`` items.

    Wraps any dataset whose items are sample dicts (``coord``, ``feat``, ``label``, e.g.
    ``task.dataset("train")`` of a point task, or :mod:`sciformer.data.classes`), for
    ``torch_geometric.loader.DataLoader``.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        item = self.dataset[i]
        if not isinstance(item, dict) or "coord" not in item:
            raise DataError(f"PyGDataset: item {i} is a {type(item).__name__}, expected a point sample dict with 'coord'")
        return sample_to_pyg(item)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
