"""Ensembles of runs (``evaluate`` / ``predict`` with ``--checkpoint`` repeated, ``sciformer.load([...])``).

Oracles: numpy's mean of the members' softmax; the accuracy of the arg-max of that mean,
each member run alone; one-line refusals of members of other data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import write_hsi_experiment

import sciformer
from sciformer.cli import main
from sciformer.engine.ensemble import Ensemble
from sciformer.engine.inference import load_for_inference
from sciformer.errors import CheckpointError, DataError


class _Fixed(torch.nn.Module):
    """A model that returns the same logits for any batch.

    Shapes:
        batch (ignored) -> logits (n, C)
    """

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, batch: dict) -> torch.Tensor:
        return self.logits


def test_the_ensemble_is_the_log_of_the_mean_probability() -> None:
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(6, 4)) * 5 for _ in range(3)]
    logits[2][0] = [-np.inf, 0.0, 1.0, -np.inf]  # a member that rules classes out
    out = Ensemble([_Fixed(torch.tensor(v, dtype=torch.float32)) for v in logits])({}).numpy()
    soft = [np.exp(v - v.max(1, keepdims=True)) / np.exp(v - v.max(1, keepdims=True)).sum(1, keepdims=True) for v in logits]
    np.testing.assert_allclose(np.exp(out), np.mean(soft, axis=0), rtol=1e-5, atol=1e-7)
    with pytest.raises(CheckpointError, match="at least 2 members"):
        Ensemble([_Fixed(torch.zeros(1, 2))])


def test_a_diverged_member_is_named_a_bad_sample_is_left_to_the_caller() -> None:
    good = torch.zeros(3, 4)
    nan_row = good.clone()
    nan_row[1, 2] = float("nan")
    with pytest.raises(DataError, match="'runs/b/best.pt' gives non-finite scores for 1 sample"):
        Ensemble([_Fixed(good), _Fixed(nan_row), _Fixed(good)], names=["runs/a/best.pt", "runs/b/best.pt", "runs/c/best.pt"])({})
    out = Ensemble([_Fixed(nan_row), _Fixed(nan_row)])({})  # every member: the sample (the caller names it), not a member
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()


def test_evaluate_scores_the_averaged_probabilities(toy_config: Path, tmp_path: Path) -> None:
    runs = [tmp_path / f"run{s}" for s in (0, 1, 2)]
    for seed, run in enumerate(runs):
        assert main(["train", "-c", str(toy_config), "-o", str(run), "--seed", str(seed), "train.epochs=1", "optimizer.lr=1e-3"]) == 0
    args = ["evaluate"] + [a for r in runs for a in ("--checkpoint", str(r))]
    assert main(args) == 0
    (folder,) = runs[0].glob("evaluation-ensemble-3-*")  # named after its members: another set gets another folder
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["checkpoints"] == [str((r / "checkpoints" / "best.pt").resolve()) for r in runs] and len(metrics["checkpoint_epochs"]) == 3
    assert main(["evaluate", "--checkpoint", str(runs[0]), "--checkpoint", str(runs[1])]) == 0
    assert len(list(runs[0].glob("evaluation-ensemble-*"))) == 2
    # the name is the set's: the same members in another order are the same evaluation (refused without --overwrite)
    assert main(["evaluate", "--checkpoint", str(runs[0]), "--checkpoint", str(runs[2]), "--checkpoint", str(runs[1])]) == 2

    from sciformer import config
    from sciformer.engine import builders

    x, y = builders.build_task(config.load(toy_config)).dataset("test").tensors
    probs = []
    for run in runs:
        _, _, model, _ = load_for_inference(run, [])
        with torch.no_grad():
            probs.append(torch.softmax(model({"x": x}), -1).numpy())
    singles = [float(np.mean(p.argmax(1) == y.numpy())) for p in probs]
    expected = float(np.mean(np.mean(probs, axis=0).argmax(1) == y.numpy()))
    assert metrics["oa"] == pytest.approx(expected)
    assert not all(s == pytest.approx(expected) for s in singles) or len(set(singles)) == 1  # the oracle can tell them apart


@pytest.fixture
def hsi(tmp_path: Path) -> Path:
    return write_hsi_experiment(tmp_path, extra="export: {png: false, envi: false}\n")


def test_members_must_share_the_data(hsi: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def train(name: str, *extra: str) -> Path:
        assert main(["train", "-c", str(hsi), "-o", str(tmp_path / name), *extra]) == 0
        return tmp_path / name

    a, b = train("a", "--seed", "0"), train("b", "--seed", "1")  # each drew its own split
    pinned = [train(f"p{s}", "--seed", str(s), "data.split.seed=5") for s in (0, 1)]
    same = train("same", "train.seed=7", "data.split.seed=0")  # a's split (drawn by its train.seed 0), other weights
    patch = train("patch", "--seed", "0", "data.patch_size=5")
    index = train("index", "--seed", "0", "model.position_source=index")
    for members, match in (([a, b], "drew its split with seed 1, '"), ([a, patch], "another data.patch_size"),
                           ([pinned[0], a], "drew its split with seed 0"), ([a, index], "members must place bands alike"),
                           ([a, a / "checkpoints" / "best.pt"], "is given twice")):
        capsys.readouterr()
        assert main(["evaluate", "--checkpoint", str(members[0]), "--checkpoint", str(members[1]), "-o", str(tmp_path / "e")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err
    assert not (tmp_path / "e").exists()
    assert main(["evaluate", "--checkpoint", str(a), "--checkpoint", str(same), "-o", str(tmp_path / "e")]) == 0  # one split

    # pinned split: predict with the ensemble equals the arg-max of the members' mean probabilities
    out = tmp_path / "ens.npy"
    assert main(["predict", "--checkpoint", str(pinned[0]), "--checkpoint", str(pinned[1]), "-i", str(tmp_path / "scene.mat"), "-o", str(out)]) == 0
    members = [sciformer.load(p).predict(str(tmp_path / "scene.mat")).probabilities for p in pinned]
    expected = np.mean(members, axis=0).argmax(-1) + 1  # maps use 1..K
    np.testing.assert_array_equal(np.load(out), expected)
    ensemble = sciformer.load(pinned)
    both = ensemble.predict(str(tmp_path / "scene.mat")).probabilities
    assert ensemble.members == 2 and "members=2" in repr(ensemble)
    assert ensemble.epoch == [sciformer.load(p).epoch for p in pinned]
    np.testing.assert_allclose(both, np.mean(members, axis=0), rtol=1e-5, atol=1e-6)
    with pytest.raises(CheckpointError, match="no checkpoint given"):
        sciformer.load([])

    # a checkpoint is read, never an output, even with --overwrite
    member = tmp_path / "member.npy"
    member.write_bytes((pinned[1] / "checkpoints" / "best.pt").read_bytes())
    before = member.read_bytes()
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(pinned[0]), "--checkpoint", str(member), "-i", str(tmp_path / "scene.mat"),
                 "-o", str(member), "--overwrite"]) == 2
    assert "is an input file" in capsys.readouterr().err and member.read_bytes() == before


def test_a_member_saved_before_a_later_record_joins_one_saved_after(tmp_path: Path) -> None:
    """``data_state.trained_classes`` is recorded by newer checkpoints only: its absence in one
    member is not another split; two records that differ still are."""
    from sciformer.engine.ensemble import check_members

    paths = [tmp_path / "old.pt", tmp_path / "new.pt", tmp_path / "other.pt"]
    for p in paths:
        p.write_bytes(b"")
    old = {"config": {"data": {"name": "hsi_scene", "split": {"seed": 0}}}, "data_state": {"in_bands": 5}, "data_info": {"num_classes": 3}}
    new = {**old, "data_state": {"in_bands": 5, "trained_classes": [0, 1, 2]}}
    other = {**old, "data_state": {"in_bands": 5, "trained_classes": [0, 2]}}
    check_members(paths[:2], [old, new])
    check_members(paths[1::-1], [new, old])
    with pytest.raises(CheckpointError, match="data_state.trained_classes"):
        check_members(paths[1:], [new, other])
    with pytest.raises(CheckpointError, match="data_state.in_bands"):
        check_members(paths[:2], [old, {**new, "data_state": {"in_bands": 6, "trained_classes": [0, 1, 2]}}])


def test_the_ensemble_takes_a_later_record_from_any_member() -> None:
    """Members [old, new] and [new, old] mask the same classes (those the data had no pixel of)."""
    from sciformer.engine.ensemble import _with_later_records

    old = {"data_state": {"in_bands": 5}}
    new = {"data_state": {"in_bands": 5, "trained_classes": [0, 2]}}
    assert _with_later_records(old["data_state"], [old, new]) == new["data_state"]
    assert _with_later_records(new["data_state"], [new, old]) == new["data_state"]
    assert _with_later_records(old["data_state"], [old, old]) == old["data_state"]


def test_a_member_saved_before_the_shape_frame_record_joins_one_saved_after(tmp_path: Path) -> None:
    """``data_state.shape_frame`` (ShapeNetPart) is recorded by newer checkpoints only, as trained_classes."""
    from sciformer.engine.ensemble import _with_later_records, check_members

    paths = [tmp_path / "old.pt", tmp_path / "new.pt"]
    for p in paths:
        p.write_bytes(b"")
    old = {"config": {"data": {"name": "shapenetpart"}}, "data_state": {"features": ["coord"]}, "data_info": {"num_classes": 50}}
    frame = {"Bag": {"shapes": 2, "centre": [0.0, 0.0, 0.0], "offset": 0.1, "radius": [0.9, 1.0, 1.1]}}
    new = {**old, "data_state": {"features": ["coord"], "shape_frame": frame}}
    check_members(paths, [old, new])
    assert _with_later_records(old["data_state"], [old, new])["shape_frame"] == frame
