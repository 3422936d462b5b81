"""Point Transformer layers and models: shapes, gradients, equivariance, configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sciformer.config import validate
from sciformer.contracts import DataInfo
from sciformer.errors import ConfigError, DataError
from sciformer.geometry import sizes_to_offset
from sciformer.pointcloud.layers import (
    Level,
    TransitionDown,
    TransitionUp,
    fps_start,
    segment_mean,
)
from sciformer.pointcloud.models import input_level
from sciformer.registry import MODELS

SMALL = {"channels": [16, 32, 32], "blocks": [1, 1, 1], "strides": [1, 4, 2], "k": 8}
POINT_MODELS = [name for name in MODELS.names() if name.startswith("point_transformer") and "_v3_" not in name]  # v1/v2; v3: test_ptv3_models.py


def make_batch(sizes: list[int], channels: int, seed: int = 0, num_classes: int = 5, per_point: bool = True) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    batch = {
        "coord": torch.rand(n, 3, generator=gen),  # (N, 3)
        "feat": torch.rand(n, channels, generator=gen),  # (N, C)
        "offset": sizes_to_offset(sizes),  # (B,)
    }
    batch["target"] = torch.randint(0, num_classes, (n if per_point else len(sizes),), generator=gen)
    return batch


def build(name: str, in_channels: int, num_classes: int = 5, info_fields: dict | None = None, **params) -> torch.nn.Module:
    entry = MODELS.get(name)
    task = "classification" if name.endswith("_cls") else "segmentation"
    info = DataInfo(num_classes, [f"c{i}" for i in range(num_classes)], in_channels, task=task, **(info_fields or {}))
    cfg = entry.config(**{**SMALL, **params})
    if name.endswith("_cls"):
        cfg = entry.config(**{**SMALL, "head_hidden": [32], **params})
    return entry.builder(cfg, info)


def test_point_models_are_registered() -> None:
    assert {"point_transformer_cls", "point_transformer_seg"} <= set(POINT_MODELS)


@pytest.mark.parametrize("name", POINT_MODELS)
@pytest.mark.parametrize("channels", [0, 3])
def test_forward_backward_on_unequal_clouds(name: str, channels: int) -> None:
    torch.manual_seed(0)
    model = build(name, channels)
    sizes = [37, 64, 19]
    per_point = not name.endswith("_cls")
    batch = make_batch(sizes, channels, per_point=per_point)
    logits = model(batch)
    assert logits.shape == ((sum(sizes) if per_point else len(sizes)), 5)
    loss = torch.nn.functional.cross_entropy(logits, batch["target"])
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"parameters without gradient: {missing[:5]}"
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert sum(float(g.abs().sum()) for g in grads.values()) > 0


@pytest.mark.parametrize("name", POINT_MODELS)
def test_grid_pooling_variant_trains(name: str) -> None:
    model = build(name, 3, downsample="grid", grid_sizes=[0.2, 0.4])
    assert any(type(m).__name__ == "GridPoolDown" for m in model.modules())
    per_point = not name.endswith("_cls")
    batch = make_batch([60, 45], 3, per_point=per_point)
    logits = model(batch)
    assert logits.shape == ((105 if per_point else 2), 5)
    torch.nn.functional.cross_entropy(logits, batch["target"]).backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="grid_sizes"):
        MODELS.get(name).config(**SMALL, downsample="grid", grid_sizes=[0.2])


@pytest.mark.parametrize("name", POINT_MODELS)
def test_ptv2_variant_trains_and_predicts(name: str) -> None:
    """Grouped vector attention + grid pooling (a PTv2-style network) on unequal clouds."""
    model = build(name, 3, attention="ptv2", pe_multiplier=True, downsample="grid", grid_sizes=[0.2, 0.4])
    layers = [m for m in model.modules() if type(m).__name__ == "GroupedVectorAttention"]
    assert layers and not any(type(m).__name__ == "PointTransformerLayer" for m in model.modules())
    per_point = not name.endswith("_cls")
    batch = make_batch([60, 45], 3, per_point=per_point)
    logits = model(batch)
    assert logits.shape == ((105 if per_point else 2), 5)
    torch.nn.functional.cross_entropy(logits, batch["target"]).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    with torch.no_grad():
        whole = model(batch)
        for layer in layers:
            layer.chunk_size = 7  # evaluation builds edges chunk by chunk: same result
        torch.testing.assert_close(model(batch), whole, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="belong to attention 'ptv2'"):
        MODELS.get(name).config(**SMALL, pe_multiplier=True)


def test_classifier_output_is_one_row_per_cloud() -> None:
    model = build("point_transformer_cls", 0, num_classes=7).eval()
    with torch.no_grad():
        out = model(make_batch([30, 41, 25, 50], 0, per_point=False))
    assert out.shape == (4, 7)
    assert torch.isfinite(out).all()


def test_classifier_cloud_independent_of_batch_mates() -> None:
    model = build("point_transformer_cls", 3).eval()
    batch = make_batch([40, 55], 3, per_point=False)
    with torch.no_grad():
        both = model(batch)
        first = model({"coord": batch["coord"][:40], "feat": batch["feat"][:40], "offset": torch.tensor([40])})
    torch.testing.assert_close(both[:1], first, atol=1e-5, rtol=1e-4)


def test_segmentation_is_permutation_equivariant_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = build("point_transformer_seg", 3).eval()
    sizes = [48, 70]
    batch = make_batch(sizes, 3, seed=3)
    gen = torch.Generator().manual_seed(7)
    perm = torch.cat([torch.randperm(48, generator=gen), 48 + torch.randperm(70, generator=gen)])  # within each cloud
    permuted = {"coord": batch["coord"][perm], "feat": batch["feat"][perm], "offset": batch["offset"]}
    with torch.no_grad():
        out = model(batch)
        out_perm = model(permuted)
    torch.testing.assert_close(out_perm, out[perm], atol=1e-4, rtol=1e-4)


def test_segmentation_with_category_one_hot() -> None:
    categories = {"category_names": ["a", "b", "c"], "category_parts": {"a": [0, 1], "b": [2], "c": [3, 4]}}
    model = build("point_transformer_seg", 0, info_fields=categories).eval()
    assert model.head.num_conditions == 3
    batch = make_batch([30, 30], 0)
    with torch.no_grad():
        a = model(batch | {"category": torch.tensor([0, 1])})
        b = model(batch | {"category": torch.tensor([0, 2])})
    torch.testing.assert_close(a[:30], b[:30])
    assert not torch.allclose(a[30:], b[30:])
    with pytest.raises(DataError, match="category"):
        model(batch)
    without = build("point_transformer_seg", 0, info_fields=categories, use_category=False)
    assert without.head.num_conditions == 0
    with pytest.raises(ConfigError, match="use_category"):
        build("point_transformer_seg", 0, use_category=True)


def test_input_level_appends_coordinates_and_handles_no_channels() -> None:
    batch = make_batch([5, 6], 2)
    level = input_level(batch, 2, use_coord=True)
    assert level.feat.shape == (11, 5)
    torch.testing.assert_close(level.feat[:, 2:], batch["coord"])
    bare = input_level({"coord": batch["coord"], "feat": torch.zeros(11, 0), "offset": batch["offset"]}, 0, use_coord=False)
    torch.testing.assert_close(bare.feat, torch.ones(11, 1))
    with pytest.raises(DataError, match="feat"):
        input_level(batch, 3, use_coord=True)
    with pytest.raises(DataError, match="offset"):
        input_level(batch | {"offset": torch.tensor([5, 10])}, 2, use_coord=True)


def test_transition_down_shapes_and_stride_one() -> None:
    batch = make_batch([20, 33], 6)
    level = Level(batch["coord"], batch["feat"], batch["offset"])
    down = TransitionDown(6, 12, stride=4, k=8)(level)
    assert down.offset.tolist() == [5, 13]
    assert down.coord.shape == (13, 3) and down.feat.shape == (13, 12)
    # sampled points are real points of their own cloud
    first, second = batch["coord"][:20], batch["coord"][20:]
    assert all((first == p).all(dim=1).any() for p in down.coord[:5])
    assert all((second == p).all(dim=1).any() for p in down.coord[5:])
    same = TransitionDown(6, 12, stride=1)(level)
    assert same.feat.shape == (53, 12) and same.coord is level.coord
    # oracle: max over each sampled point's k nearest (scipy, own cloud) of MLP([p_j - p_i, x_j])
    from scipy.spatial import cKDTree

    td = TransitionDown(6, 12, stride=4, k=8).eval()
    with torch.no_grad():
        out = td(level)
        linear, norm, act = td.mlp
        for lo, hi, rows in ((0, 20, range(0, 5)), (20, 53, range(5, 13))):
            cloud, feats = batch["coord"][lo:hi], batch["feat"][lo:hi]
            _, nb = cKDTree(cloud.numpy()).query(out.coord[list(rows)].numpy(), k=8)
            for r, nbr in zip(rows, nb):
                edges = torch.cat([cloud[nbr] - out.coord[r], feats[nbr]], dim=1)  # (k, 3 + C)
                expected = act(norm(linear(edges))).max(dim=0).values  # (C_out,)
                torch.testing.assert_close(out.feat[r], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("train", [True, False])
def test_transition_down_training_matches_per_edge_mlp_and_max(train: bool, compiled: bool, dtype: torch.dtype, monkeypatch) -> None:
    """Selected-edge path vs the per-edge oracle ``max_j ReLU(BN(W [p_j - p_i, x_j]))`` with
    BatchNorm over all edges (torch's own module): output, every gradient, running statistics;
    BatchNorm scales of both signs (a negative scale selects the minimum edge); with the
    compiled kernel and with the torch fallback."""
    import copy

    from sciformer.geometry import knn
    from sciformer.pointcloud import _edge_select

    if compiled and _edge_select.library() is None:
        pytest.skip("edge selection kernel not built")
    if not compiled:
        monkeypatch.setattr(_edge_select, "_compiled", lambda f: None)

    torch.manual_seed(0)
    batch = make_batch([70, 130], 6, seed=3)
    coord, feat = batch["coord"].double(), batch["feat"].double()  # the oracle runs in float64
    ref = TransitionDown(6, 16, stride=4, k=8).double().train(train)
    with torch.no_grad():
        ref.mlp[1].weight.uniform_(-1.5, 1.5)
        ref.mlp[1].bias.uniform_(-0.5, 0.5)
        ref.mlp[1].running_var.uniform_(0.5, 2.0)
    td = copy.deepcopy(ref).to(dtype)
    x1, x2 = feat.to(dtype).clone().requires_grad_(), feat.clone().requires_grad_()
    p1, p2 = coord.to(dtype).clone().requires_grad_(), coord.clone().requires_grad_()
    out = td(Level(p1, x1, batch["offset"]))
    idx, _ = knn(out.coord.detach().double(), coord, 8, out.offset, batch["offset"], fill="nearest")  # (M, k)
    linear, norm, act = ref.mlp
    rows = [int(torch.nonzero((coord.to(dtype) == c).all(1))[0]) for c in out.coord.detach()]
    new_coord = p2[rows]  # (M, 3)
    edges = torch.cat([p2[idx] - new_coord.unsqueeze(1), x2[idx]], dim=-1)  # (M, k, 3 + C)
    m, k = idx.shape
    expected = act(norm(linear(edges.view(m * k, -1)))).view(m, k, -1).max(dim=1).values  # (M, C_out)
    rel = 1e-9 if dtype == torch.float64 else 2e-4  # of each tensor's largest entry

    def close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
        err = (got.double() - want).abs().max().item()
        assert err <= rel * max(want.abs().max().item(), 1e-3), (name, err, want.abs().max().item())

    close(out.feat, expected, "output")
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.feat.backward(grad.to(dtype))
    expected.backward(grad)
    close(x1.grad, x2.grad, "feat")
    close(p1.grad, p2.grad, "coord")
    for (name, a), b in zip(td.named_parameters(), ref.parameters()):
        close(a.grad, b.grad, name)
    for (name, a), b in zip(td.named_buffers(), ref.buffers()):
        close(a, b, name)


def _per_edge_oracle(td: TransitionDown, coord: torch.Tensor, feat: torch.Tensor, offset: torch.Tensor, out: Level) -> torch.Tensor:
    """``max_j act(norm(linear([p_j - p_i, x_j])))`` over the kNN of the sampled points, every edge formed."""
    from sciformer.geometry import knn

    idx, _ = knn(out.coord.detach(), coord, td.k, out.offset, offset, fill="nearest")  # (M, k)
    rows = [int(torch.nonzero((coord == c).all(1))[0]) for c in out.coord.detach()]
    edges = torch.cat([coord[idx] - coord[rows].unsqueeze(1), feat[idx]], dim=-1)  # (M, k, 3 + C)
    m, k = idx.shape
    linear, norm, act = td.mlp
    return act(norm(linear(edges.view(m * k, -1)))).view(m, k, -1).max(dim=1).values  # (M, C_out)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("case", ["unreferenced-nan", "nan-eval", "inf-eval", "zero-bn-weight"])
def test_transition_down_edge_cases_match_per_edge_oracle(case: str, compiled: bool, monkeypatch) -> None:
    """A NaN point no sampled point reads changes nothing; NaN and +-inf propagate like torch.max
    in eval; a zero BatchNorm weight (all edges tie) sends the gradient where torch's max does."""
    import copy

    from sciformer.pointcloud import _edge_select

    if compiled and _edge_select.library() is None:
        pytest.skip("edge selection kernel not built")
    if not compiled:
        monkeypatch.setattr(_edge_select, "_compiled", lambda f: None)
    torch.manual_seed(0)
    batch = make_batch([64], 2, seed=5)
    coord, feat, offset = batch["coord"].double(), batch["feat"].double(), batch["offset"]
    k = 1 if case in ("unreferenced-nan", "inf-eval") else 4  # k = 1: 48 of 64 points unread
    td = TransitionDown(2, 4, stride=4, k=k).double().train(case in ("unreferenced-nan", "zero-bn-weight"))
    with torch.no_grad():
        td.mlp[1].weight.copy_(torch.tensor([1.0, -1.0, 0.5, -0.5]) if case != "zero-bn-weight" else torch.zeros(4))
        td.mlp[1].bias.copy_(torch.tensor([0.1, 0.2, -0.1, 0.3]))
    ref = copy.deepcopy(td)
    from sciformer.geometry import knn

    out = td(Level(coord, feat, offset))
    read = set(knn(out.coord, coord, k, out.offset, offset, fill="nearest")[0].flatten().tolist())  # rows some edge reads
    assert len(read) < 64 or case != "unreferenced-nan"
    if case == "unreferenced-nan":
        feat[next(i for i in range(64) if i not in read)] = float("nan")
    elif case == "nan-eval":
        feat[5] = float("nan")
    elif case == "inf-eval":
        feat[sorted(read)[0], 0], feat[sorted(read)[1], 1] = float("-inf"), float("inf")
    td, ref = copy.deepcopy(ref), copy.deepcopy(ref)
    x1, x2 = feat.clone().requires_grad_(), feat.clone().requires_grad_()
    got = td(Level(coord, x1, offset)).feat
    want = _per_edge_oracle(ref, coord, x2, offset, out)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-9, atol=1e-12)
    for (name, a), b in zip(td.named_buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-9, atol=1e-12, msg=name)
    if case == "zero-bn-weight":
        grad = torch.randn(want.shape, dtype=torch.float64)
        got.backward(grad)
        want.backward(grad)
        torch.testing.assert_close(td.mlp[1].weight.grad, ref.mlp[1].weight.grad, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


def test_transition_up_interpolates_constant_features_exactly() -> None:
    fine = make_batch([25, 40], 4, seed=1)
    coarse = make_batch([6, 9], 8, seed=2)
    coarse_feat = torch.full((15, 8), 0.5)
    up = TransitionUp(8, 16, skip_channels=4).eval()
    out = up(Level(coarse["coord"], coarse_feat, coarse["offset"]), Level(fine["coord"], fine["feat"], fine["offset"]))
    assert out.feat.shape == (65, 16) and out.offset is fine["offset"]
    with torch.no_grad():
        expected = up.skip(fine["feat"]) + up.coarse(coarse_feat[:1])  # every fine point gets the constant
    torch.testing.assert_close(out.feat, expected.expand(65, 16), atol=1e-5, rtol=1e-5)


def test_deepest_transition_up_uses_cloud_mean() -> None:
    coarse = make_batch([4, 6], 8)
    up = TransitionUp(8).eval()
    out = up(Level(coarse["coord"], coarse["feat"], coarse["offset"]))
    assert out.feat.shape == (10, 8)
    moved = coarse["feat"].clone()
    moved[5] += 3.0  # changes the second cloud's mean only
    out2 = up(Level(coarse["coord"], moved, coarse["offset"]))
    torch.testing.assert_close(out.feat[:4], out2.feat[:4])
    assert not torch.allclose(out.feat[6:], out2.feat[6:])


def test_segment_mean_and_fps_start() -> None:
    x = torch.tensor([[1.0], [3.0], [10.0], [20.0], [30.0]])
    torch.testing.assert_close(segment_mean(x, torch.tensor([2, 5])), torch.tensor([[2.0], [20.0]]))
    coord = torch.tensor([[0.0, 0, 0], [0.1, 0, 0], [5.0, 0, 0], [0, 0, 0], [0, 2.0, 0], [0, 0.1, 0]])
    assert fps_start(coord, torch.tensor([3, 6])).tolist() == [2, 1]


def test_config_errors_are_one_line_config_errors() -> None:
    def load(model: dict) -> None:
        validate({"data": {"name": "modelnet"}, "model": {"name": "point_transformer_seg", **model}}, base_dir=Path("."))

    with pytest.raises(ConfigError, match="one entry per stage"):
        load({"channels": [32, 64], "blocks": [1, 1, 1], "strides": [1, 4, 4]})
    with pytest.raises(ConfigError, match="share_planes"):
        load({"channels": [30, 64], "blocks": [1, 1], "strides": [1, 4]})
    with pytest.raises(ConfigError, match="model.dropuot"):
        load({"dropuot": 0.1})
    entry = MODELS.get("point_transformer_cls")
    with pytest.raises(ConfigError, match="classification model"):
        entry.builder(entry.config(), DataInfo(3, ["a", "b", "c"], 0, task="segmentation"))


@pytest.mark.parametrize("name", ["point_transformer_seg", "point_transformer_cls"])
def test_tiny_stages_warn_before_batchnorm_explodes(name: str) -> None:
    """A training batch whose deepest stage keeps fewer than 8 points (2 clouds of 24 points,
    strides 1 / 4 / 2: 2 x 3 points) warns; in eval mode, or with 2 clouds of 64 points
    (2 x 8 points there), it does not."""
    torch.manual_seed(0)
    model = build(name, 3)
    tiny, fine = make_batch([24, 24], 3, per_point=name.endswith("_seg")), make_batch([64, 64], 3, per_point=name.endswith("_seg"))
    with pytest.warns(RuntimeWarning, match="keeps 6 points for the whole batch"):
        model.train()(tiny)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model.train()(fine)
        with torch.no_grad():
            model.eval()(tiny)
