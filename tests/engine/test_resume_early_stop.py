"""--resume of an early-stopped run (killed in its final evaluation, or finished) trains no further:
it goes to the final evaluation of the recorded best.pt and ends as the uninterrupted run did.

The training is real (the toy task); only the validation results are scripted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint
from sciformer.engine.selection import new_best, stopped_early
from sciformer.engine.trainer import Trainer
from sciformer.errors import SciformerError
from tests.engine.test_selection import _scores

# epoch 2 is best; patience 2 stops after epoch 4; later epochs exist only for a run that trains past it
SCRIPT = {1: (3, 0.9), 2: (0, 0.5), 3: (1, 0.6), 4: (1, 0.6), 5: (0, 0.1), 6: (0, 0.05), 7: (0, 0.04), 8: (0, 0.03)}
ARGS = ["train.epochs=8", "train.early_stop_patience=2"]


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, split: (_scores(SCRIPT[self.epoch][0]), SCRIPT[self.epoch][1]))


def _same_run(a: Path, b: Path) -> None:
    for name in ("last.pt", "best.pt"):
        x, y = (load_checkpoint(r / "checkpoints" / name) for r in (a, b))
        assert (x["epoch"], x["global_step"], x["best"]) == (y["epoch"], y["global_step"], y["best"]), name
        assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"]), name
    assert [r.rsplit(",", 1)[0] for r in (a / "metrics.csv").read_text().splitlines()] == \
        [r.rsplit(",", 1)[0] for r in (b / "metrics.csv").read_text().splitlines()]
    ma, mb = (json.loads((r / "metrics.json").read_text()) for r in (a, b))
    assert {k: v for k, v in ma.items() if k != "eval_time_s"} == {k: v for k, v in mb.items() if k != "eval_time_s"}


def test_resume_of_a_run_killed_in_its_final_evaluation_after_an_early_stop(toy_config: Path, tmp_path: Path, scripted: None,
                                                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["train", "-c", str(toy_config), "-o", str(straight), *ARGS]) == 0
    assert load_checkpoint(straight / "checkpoints" / "last.pt")["epoch"] == 4
    real = Trainer._final_evaluation

    def killed_there(self: Trainer) -> None:  # what SIGKILL in the final evaluation leaves: last.pt of epoch 4, no metrics.json
        raise SciformerError("killed")

    monkeypatch.setattr(Trainer, "_final_evaluation", killed_there)
    assert main(["train", "-c", str(toy_config), "-o", str(killed), *ARGS]) != 0
    assert not (killed / "metrics.json").exists() and load_checkpoint(killed / "checkpoints" / "last.pt")["epoch"] == 4
    monkeypatch.setattr(Trainer, "_final_evaluation", real)
    capsys.readouterr()
    assert main(["train", "--resume", str(killed)]) == 0
    out = capsys.readouterr().out
    assert "nothing left to train" in out and "epoch 5/8" not in out
    _same_run(straight, killed)


def test_resume_of_a_finished_early_stopped_run_trains_nothing(toy_config: Path, tmp_path: Path, scripted: None) -> None:
    run, copy = tmp_path / "run", tmp_path / "copy"
    assert main(["train", "-c", str(toy_config), "-o", str(run), *ARGS]) == 0
    shutil.copytree(run, copy)
    best = (copy / "checkpoints" / "best.pt").read_bytes()
    assert main(["train", "--resume", str(copy)]) == 0
    assert (copy / "checkpoints" / "best.pt").read_bytes() == best  # not replaced by a later epoch
    _same_run(run, copy)


def test_only_a_validated_epoch_without_improvement_stops() -> None:
    best = {**new_best("oa"), "epoch": 2}
    assert stopped_early(best, [{"epoch": 4, "val_loss": 0.6}], 2, 1)
    assert not stopped_early(best, [{"epoch": 4, "val_loss": 0.6}], 3, 1)  # a larger patience on --resume trains on
    assert not stopped_early(best, [{"epoch": 4, "val_loss": 0.6}], None, 1)
    assert not stopped_early({**best, "epoch": 4}, [{"epoch": 4, "val_loss": 0.6}], 1, 1)  # it improved
    # val_every 2, nothing validated yet: epoch 1 did not validate, so it is no stop however far from "epoch -1"
    assert not stopped_early(new_best("oa"), [{"epoch": 1, "train_loss": 1.0}], 1, 2)
