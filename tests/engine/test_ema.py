"""train.ema: the weight average against a hand-written recurrence, and its place in a run
(validation, best.pt and the test use the average; training continues from the raw weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint, save_checkpoint
from sciformer.engine.ema import WeightAverage
from sciformer.errors import CheckpointError


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_average_follows_the_warmed_up_recurrence() -> None:
    net, decay = _net(), 0.95
    ema = WeightAverage(net, decay)
    expected = {k: v.double().clone() for k, v in net.state_dict().items()}
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for t in range(40):
        net.train()
        opt.zero_grad()
        net(torch.randn(8, 3)).square().mean().backward()  # also moves the BatchNorm running statistics
        opt.step()
        d = min(decay, (1 + t) / (10 + t))  # the recurrence, written out in float64
        for key, value in net.state_dict().items():
            if value.is_floating_point():
                expected[key] = d * expected[key] + (1 - d) * value.double()
            else:
                expected[key] = value.double().clone()
        ema.update(net)
    assert ema.updates == 40
    for key, value in ema.shadow.items():
        torch.testing.assert_close(value.double(), expected[key], rtol=1e-5, atol=1e-6)
    assert ema.shadow["1.num_batches_tracked"].item() == 40  # integer buffers are copied
    assert not torch.equal(ema.shadow["0.weight"], net.state_dict()["0.weight"])


def test_applied_swaps_in_the_average_and_restores_the_weights() -> None:
    net = _net()
    ema = WeightAverage(net, 0.9)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    own = {k: v.clone() for k, v in net.state_dict().items()}
    with ema.applied(net):
        assert all(torch.equal(net.state_dict()[k], ema.shadow[k]) for k in own)
    assert all(torch.equal(net.state_dict()[k], own[k]) for k in own)
    with pytest.raises(RuntimeError), ema.applied(net):
        raise RuntimeError("an error inside the block")
    assert all(torch.equal(net.state_dict()[k], own[k]) for k in own)  # restored on errors too


def test_state_round_trip_and_mismatch_is_one_line() -> None:
    net = _net()
    ema = WeightAverage(net, 0.9)
    ema.update(net)
    other = WeightAverage(_net(), 0.9)
    other.load_state_dict(ema.state_dict(), "x.pt")
    assert other.updates == 1 and all(torch.equal(other.shadow[k], v) for k, v in ema.shadow.items())
    with pytest.raises(CheckpointError, match="weight average") as info:
        WeightAverage(nn.Linear(3, 2), 0.9).load_state_dict(ema.state_dict(), "x.pt")
    assert "\n" not in str(info.value)
    for bad in ("12", -1, 2.5, True):  # a tampered update count
        with pytest.raises(CheckpointError, match="update count"):
            other.load_state_dict({**ema.state_dict(), "updates": bad}, "x.pt")
    with pytest.raises(ValueError):
        WeightAverage(net, 1.0)


def test_run_validates_saves_and_tests_the_average(toy_config: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.ema=0.9"]) == 0
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    assert last["ema"]["updates"] == last["global_step"] and last["ema"]["decay"] == 0.9
    assert any(not torch.equal(last["model"][k], last["ema"]["weights"][k]) for k in last["model"])  # raw weights go on
    assert not {"ema", "optimizer", "scheduler"} & set(best)  # best.pt is for inference: the average as its model, once
    if best["epoch"] == last["epoch"]:
        assert all(torch.equal(best["model"][k], last["ema"]["weights"][k]) for k in best["model"])  # best.pt holds the average
    # the validation score recorded for the best epoch is the average's: re-evaluate best.pt on the validation split
    out = tmp_path / "val"
    assert main(["evaluate", "--checkpoint", str(run), "--split", "val", "-o", str(out)]) == 0
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
    col = rows[0].index("val_oa")
    recorded = float(next(r for r in rows[1:] if int(r[0]) == best["best"]["epoch"])[col])
    assert json.loads((out / "metrics.json").read_text())["oa"] == pytest.approx(recorded)


def test_resuming_with_ema_from_a_run_without_it_is_one_line(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    state["config"]["train"]["ema"] = 0.9  # as if the run had been started with train.ema and lost its average
    save_checkpoint(run / "checkpoints" / "last.pt", {k: v for k, v in state.items() if k not in ("format", "version")})
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.epochs=2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without train.ema" in err[0], err
