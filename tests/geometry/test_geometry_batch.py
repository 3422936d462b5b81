"""Packed batches: offsets, batch vectors, pack/unpack and PyG Data/Batch round trips."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sciformer.errors import DataError
from sciformer.geometry import (
    batch_to_offset,
    from_pyg,
    offset_to_batch,
    offset_to_sizes,
    pack,
    sizes_to_offset,
    to_pyg,
    unpack,
)


def test_offset_conventions_match_reference_point_transformer():
    assert sizes_to_offset([3, 5]).tolist() == [3, 8]
    assert offset_to_sizes(torch.tensor([3, 8])).tolist() == [3, 5]
    assert offset_to_batch(torch.tensor([3, 8])).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert batch_to_offset(torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])).tolist() == [3, 8]
    assert sizes_to_offset([3, 5]).dtype == torch.int64


def test_empty_clouds_in_conversions():
    assert offset_to_batch(torch.tensor([2, 2, 3])).tolist() == [0, 0, 2]
    assert batch_to_offset(torch.tensor([0, 0, 2])).tolist() == [2, 2, 3]
    assert batch_to_offset(torch.tensor([0, 0, 2]), batch_size=5).tolist() == [2, 2, 3, 3, 3]


def test_batch_vector_must_be_sorted():
    with pytest.raises(DataError, match="sorted"):
        batch_to_offset(torch.tensor([0, 1, 0]))
    with pytest.raises(DataError, match="batch_size=1"):
        batch_to_offset(torch.tensor([0, 1]), batch_size=1)
    with pytest.raises(DataError, match="non-negative"):
        sizes_to_offset([3, -1])


def test_pack_and_unpack_round_trip():
    clouds = [torch.rand(3, 3), torch.rand(5, 3)]
    feats = [torch.rand(3, 2), torch.rand(5, 2)]
    packed = pack(clouds, feats)
    assert packed.offset.tolist() == [3, 8] and packed.coord.shape == (8, 3) and packed.feat.shape == (8, 2)
    for a, b in zip(unpack(packed.coord, packed.offset), clouds):
        assert torch.equal(a, b)
    with pytest.raises(DataError, match="one \\(n_b, C\\) tensor per cloud"):
        pack(clouds, feats[:1])


def test_pyg_round_trip_and_batch_vector_agree():
    pyg_data = pytest.importorskip("torch_geometric.data")
    Batch, Data = pyg_data.Batch, pyg_data.Data

    clouds = [torch.rand(4, 3), torch.rand(7, 3), torch.rand(2, 3)]
    feats = [torch.rand(len(c), 5) for c in clouds]
    labels = [torch.randint(0, 3, (len(c),)) for c in clouds]
    ref = Batch.from_data_list([Data(pos=c, x=f, y=y) for c, f, y in zip(clouds, feats, labels)])
    packed = from_pyg(ref)
    assert packed.offset.tolist() == [4, 11, 13]
    assert torch.equal(offset_to_batch(packed.offset), ref.batch)
    assert torch.equal(packed.coord, ref.pos) and torch.equal(packed.feat, ref.x)
    back = to_pyg(packed.coord, packed.offset, packed.feat, y=torch.cat(labels))
    assert torch.equal(back.batch, ref.batch) and torch.equal(back.ptr, ref.ptr)
    assert torch.equal(back.y, ref.y)
    assert [len(d.pos) for d in back.to_data_list()] == [4, 7, 2]
    single = from_pyg(Data(pos=clouds[0]))
    assert single.offset.tolist() == [4] and single.feat is None


def test_from_pyg_needs_pos():
    data = pytest.importorskip("torch_geometric.data")
    with pytest.raises(DataError, match="pos"):
        from_pyg(data.Data(x=torch.rand(3, 2)))


def test_import_does_not_pull_optional_packages():
    code = (
        "import sys, sciformer.geometry\n"
        "print(sorted(m for m in ('torch_geometric', 'pykdtree', 'fpsample', 'torch_cluster') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
