"""PyG interop: edge_index <-> (N, k) neighbour indices round-trip against scikit-learn's kNN, a
sciformer attention layer inside a PyG model trains, every point model takes a PyG Batch and gives
the packed batch's logits, and point datasets yield PyG Data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sciformer.errors import DataError
from sciformer.geometry import knn
from sciformer.geometry.pyg import (
    EdgeIndexAdapter,
    PyGDataset,
    as_packed_batch,
    batch_to_pyg,
    edge_index_to_neighbors,
    neighbors_to_edge_index,
)

pyg = pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402


def scipy_knn_edges(pos: np.ndarray, k: int) -> torch.Tensor:
    """The oracle: scipy's KD-tree kNN (self included) as PyG edges j -> i."""
    from scipy.spatial import cKDTree

    _, nbr = cKDTree(pos).query(pos, k=k)  # (N, k)
    centre = np.repeat(np.arange(len(pos)), k)
    return torch.from_numpy(np.stack([nbr.reshape(-1), centre])).long()  # (2, N k)


def test_edge_index_round_trips_through_the_neighbour_index() -> None:
    rng = np.random.default_rng(0)
    pos = rng.normal(size=(200, 3))
    edges = scipy_knn_edges(pos, 8)
    idx = edge_index_to_neighbors(edges, 200)
    assert idx.shape == (200, 8)
    torch.testing.assert_close(neighbors_to_edge_index(idx), edges, rtol=0, atol=0)
    # sciformer's own kNN gives the same neighbour sets as scikit-learn
    ours, _ = knn(torch.from_numpy(pos).float(), None, 8)
    for i in (0, 57, 199):
        assert set(ours[i].tolist()) == set(idx[i].tolist())
    torch.testing.assert_close(edge_index_to_neighbors(neighbors_to_edge_index(ours), 200), ours, rtol=0, atol=0)


def test_uneven_degrees_pad_and_shuffled_edges_keep_their_order() -> None:
    edges = torch.tensor([[1, 2, 0, 3, 2], [0, 0, 1, 2, 1]])  # node 3 has no incoming edge
    idx = edge_index_to_neighbors(edges, 4)
    assert idx.tolist() == [[1, 2], [0, 2], [3, -1], [-1, -1]]
    back = neighbors_to_edge_index(idx)
    assert sorted(map(tuple, back.T.tolist())) == sorted(map(tuple, edges.T.tolist()))
    assert edge_index_to_neighbors(edges, 4, k=3).shape == (4, 3)
    with pytest.raises(DataError, match="node 0 has 2 incoming edges, more than k=1"):
        edge_index_to_neighbors(edges, 4, k=1)
    with pytest.raises(DataError, match=r"\[0, 3\)"):
        edge_index_to_neighbors(edges, 3)


def test_attention_layer_trains_inside_a_pyg_model() -> None:
    from torch_geometric.nn import GCNConv

    from sciformer.attention import PointTransformerLayer

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GCNConv(4, 16)  # a PyG layer ...
            self.attn = EdgeIndexAdapter(PointTransformerLayer(16, 16))  # ... and sciformer's vector attention
            self.head = torch.nn.Linear(16, 3)

        def forward(self, data: Data) -> torch.Tensor:
            x = self.conv(data.x, data.edge_index).relu()  # (N, 16)
            return self.head(self.attn(x, data.pos, data.edge_index))  # (N, 3)

    rng = np.random.default_rng(1)
    pos = rng.normal(size=(60, 3))
    data = Data(x=torch.randn(60, 4), pos=torch.from_numpy(pos).float(), edge_index=scipy_knn_edges(pos, 6),
                y=torch.randint(0, 3, (60,)))
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    before = net.attn.layer.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(data), data.y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    moved = [k for k, v in net.attn.layer.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert moved  # gradients reached the sciformer layer through the PyG graph


MODEL_CASES = [
    ("point_transformer_cls", "classification", {"channels": [16, 32], "blocks": [1, 1], "strides": [1, 4], "k": 4}),
    ("point_transformer_seg", "segmentation", {"channels": [16, 32], "blocks": [1, 1], "strides": [1, 4], "k": 4}),
    ("point_transformer_v3_cls", "classification", {}),
    ("point_transformer_v3_seg", "segmentation", {}),
]


@pytest.mark.parametrize(("name", "task", "params"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_point_models_take_a_pyg_batch(name: str, task: str, params: dict, tmp_path) -> None:
    from sciformer.contracts import DataInfo
    from sciformer.registry import MODELS

    entry = MODELS.get(name)
    fields = entry.config.model_fields
    params = {k: v for k, v in params.items() if k in fields}
    model = entry.builder(entry.config(**params), DataInfo(3, ["a", "b", "c"], 3, task=task)).eval()
    torch.manual_seed(0)
    sizes = [40, 56]
    coord = torch.rand(sum(sizes), 3) * 2  # (N, 3)
    feat = torch.rand(sum(sizes), 3)  # (N, 3)
    packed = {"coord": coord, "feat": feat, "offset": torch.tensor([40, 96])}
    pyg_batch = Batch.from_data_list([Data(pos=coord[:40], x=feat[:40]), Data(pos=coord[40:], x=feat[40:])])
    with torch.no_grad():
        expected = model(packed)
        got = model(pyg_batch)
    assert expected.shape == ((2, 3) if task == "classification" else (96, 3))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    back = as_packed_batch(batch_to_pyg(packed))
    torch.testing.assert_close(back["offset"], packed["offset"])


def test_point_dataset_yields_pyg_data(tmp_path) -> None:
    from synthetic import write_modelnet_h5
    from torch_geometric.loader import DataLoader

    from sciformer.data.classes import ModelNet

    root = write_modelnet_h5(tmp_path / "mn", ["bed", "chair"], per_class=(3, 1), points=32)
    dataset = ModelNet(root, split="train", num_points=32)
    items = PyGDataset(dataset.as_torch())
    val = ModelNet(root, split="val", num_points=32)
    assert len(items) == len(dataset) and len(dataset) + len(val) == 6  # the 6 training shapes, validation carved off
    first = items[0]
    sample = dataset[0]
    torch.testing.assert_close(first.pos, torch.as_tensor(sample["coord"]).float())
    assert int(first.y) == int(sample["label"])
    batch = next(iter(DataLoader(items, batch_size=4)))
    assert batch.num_graphs == 4 and batch.pos.shape == (128, 3) and batch.y.shape == (4,)
    assert isinstance(dataset.to_pyg()[1], Data)
