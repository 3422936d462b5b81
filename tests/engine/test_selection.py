"""best.pt when validation saturates: an equal monitored metric goes to the lower validation loss.

The training runs are real (the toy task); only the validation results are scripted, so
each test states which epoch must become best.pt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint, save_checkpoint
from sciformer.engine.metrics import ConfusionMatrix
from sciformer.engine.selection import improves, restore_best
from sciformer.engine.trainer import Trainer

GOOD = 1.0


def _scores(wrong: int):
    """Scores of 30 validation samples of 3 classes with ``wrong`` of them misclassified."""
    target = torch.arange(3).repeat(10)  # (30,)
    pred = target.clone()
    pred[:wrong] = (pred[:wrong] + 1) % 3
    cm = ConfusionMatrix(3)
    cm.update(pred, target)
    return cm.compute()


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch):
    """Replace validation with a script: {epoch: (misclassified, loss)}."""
    script: dict[int, tuple[int, float]] = {}

    def fake(self: Trainer, split: str):
        wrong, loss = script[self.epoch]
        return _scores(wrong), loss

    monkeypatch.setattr(Trainer, "_evaluate", fake)
    return script


def _best(run: Path) -> dict:
    return load_checkpoint(run / "checkpoints" / "best.pt")["best"]


def test_improves_rule() -> None:
    best = {"metric": "oa", "value": 1.0, "epoch": 2, "loss": 0.5}
    assert improves(best, 1.0, 0.4) and not improves(best, 1.0, 0.5) and not improves(best, 1.0, 0.6)
    assert not improves(best, 0.99, 0.01) and improves({**best, "value": 0.9}, 0.95, 9.0)
    assert not improves({**best, "loss": None}, 1.0, 0.1)  # a best without a loss keeps ties, as before
    assert not improves(best, float("nan"), 0.1)
    assert improves({"metric": "loss", "value": 0.5, "epoch": 1, "loss": 0.5}, 0.4, 0.4)
    assert restore_best({"metric": "oa", "value": 1.0, "epoch": 2}, [{"epoch": 1, "val_loss": 0.7}, {"epoch": 2, "val_loss": 0.3}])["loss"] == 0.3
    assert restore_best({"metric": "oa", "value": 1.0, "epoch": 2}, [])["loss"] is None


def test_saturated_metric_picks_the_lower_loss(toy_config: Path, tmp_path: Path, scripted: dict) -> None:
    scripted.update({1: (3, 0.9), 2: (0, 0.5), 3: (0, 0.3), 4: (0, 0.4), 5: (1, 0.1)})
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=5"]) == 0
    assert _best(run) == {"metric": "oa", "value": GOOD, "epoch": 3, "loss": 0.3}
    assert load_checkpoint(run / "checkpoints" / "best.pt")["epoch"] == 3  # the file is epoch 3's model
    assert json.loads((run / "metrics.json").read_text())["best_epoch"] == 3


def test_higher_loss_on_a_tie_keeps_the_earlier_checkpoint(toy_config: Path, tmp_path: Path, scripted: dict) -> None:
    scripted.update({1: (0, 0.2), 2: (0, 0.3), 3: (0, 0.2)})  # an equal loss is no improvement either
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run)]) == 0
    assert _best(run)["epoch"] == 1


def test_a_tie_broken_improvement_resets_early_stop_patience(toy_config: Path, tmp_path: Path, scripted: dict) -> None:
    # without the reset, patience 2 would stop after epoch 4 (two validations after epoch 2)
    scripted.update({1: (3, 0.9), 2: (0, 0.5), 3: (0, 0.4), 4: (0, 0.45), 5: (0, 0.45), 6: (0, 0.1)})
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=6", "train.early_stop_patience=2"]) == 0
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + 5
    assert _best(run)["epoch"] == 3


@pytest.mark.parametrize("stored", ["loss", "history only", "nothing"])
def test_resume_keeps_the_best_value_and_loss(stored: str, toy_config: Path, tmp_path: Path, scripted: dict) -> None:
    scripted.update({1: (3, 0.9), 2: (0, 0.5), 3: (0, 0.3), 4: (0, 0.4), 5: (0, 0.2)})
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run)]) == 0  # 3 epochs: best is epoch 3, loss 0.3
    last = run / "checkpoints" / "last.pt"
    state = load_checkpoint(last)
    if stored != "loss":  # a checkpoint written before the best record held its loss
        del state["best"]["loss"]
        if stored == "nothing":
            state["history"] = [{k: v for k, v in row.items() if k != "val_loss"} for row in state["history"]]
        save_checkpoint(last, {k: v for k, v in state.items() if k not in ("format", "version")})
    assert main(["train", "--resume", str(run), "train.epochs=5"]) == 0
    # epoch 4 ties with a higher loss (kept); epoch 5 ties with a lower loss (replaces), unless no loss is known
    assert _best(run)["epoch"] == (3 if stored == "nothing" else 5)


def test_a_validation_with_a_nan_loss_is_never_chosen() -> None:
    """A NaN validation loss means the model gave non-finite logits (ignored-only batches add no loss);
    the arg-max of NaN scores is class 0, which may even score well: such a model is never best.pt."""
    nan = float("nan")
    assert not improves({"metric": "oa", "value": 0.9, "epoch": 1, "loss": 0.5}, 1.0, nan)
    assert not improves({"metric": "oa", "value": None, "epoch": -1, "loss": None}, 0.9, nan)  # not even the first
    assert not improves({"metric": "loss", "value": None, "epoch": -1, "loss": None}, nan, nan)
    assert improves({"metric": "oa", "value": 0.9, "epoch": 1, "loss": nan}, 0.5, 2.0)  # a NaN best of an older run yields
    assert not improves({"metric": "oa", "value": 0.9, "epoch": 1, "loss": nan}, 0.95, nan)
    assert improves({"metric": "oa", "value": None, "epoch": -1, "loss": None}, 0.9, None)  # no loss known: the metric decides


def test_no_finite_validation_is_one_line_not_a_missing_best_pt(toy_config: Path, tmp_path: Path, scripted: dict,
                                                               capsys: pytest.CaptureFixture) -> None:
    nan = float("nan")
    scripted.update({1: (0, nan), 2: (1, nan), 3: (0, nan)})
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.monitor=loss"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of the 3 validations" in err[0] and "best.pt" in err[0], err
    assert not (run / "metrics.json").exists() and (run / "checkpoints" / "last.pt").exists()


def test_a_nan_loss_validation_scores_nan_and_is_never_best(toy_config: Path, tmp_path: Path, scripted: dict) -> None:
    nan = float("nan")
    scripted.update({1: (0, nan), 2: (3, 1.0), 3: (1, nan)})  # epochs 1 and 3 would win on OA
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run)]) == 0
    assert _best(run)["epoch"] == 2
    rows = (run / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    for line, expect_nan in zip(rows[1:], (True, False, True)):
        row = dict(zip(header, line.split(",")))
        assert (row["val_oa"] == "nan") == expect_nan and (row["val_kappa"] == "nan") == expect_nan, row


def test_a_diverged_scene_model_ends_with_one_line_not_class_zero_metrics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Five stages on 100-point crops with SGD at lr 0.5: one step sends the weights to ~1e14,
    every validation loss is NaN, so no epoch becomes best.pt: the run ends with one line and
    writes no metrics.json (before: OA from NaN arg-maxes, all class 0)."""
    import warnings

    from synthetic import write_s3dis

    folder = write_s3dis(tmp_path / "s3dis", {1: ["office_1", "office_2"], 5: ["office_3"]}, malformed=False)
    tiny = ["data.crop_points=100", "data.loop=2", "data.val_fraction=0.5", "train.epochs=1", "train.batch_size=2",
            "train.threads=1", "train.progress=never", "model.channels=[8,16,32,64,128]", "export.ply=false", "export.png=false"]
    run = tmp_path / "run"
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["train", "-c", str(Path(__file__).resolve().parents[2] / "experiments" / "s3dis_area5.yaml"),
                     "-o", str(run), f"data.root={folder}", *tiny])
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "none of the 1 validations gave a finite value" in err[0], err
    assert "validation loss is NaN" in out and "train.grad_clip" in out  # said when it happened, not only at the end
    assert not (run / "metrics.json").exists() and not (run / "checkpoints" / "best.pt").exists()
    history = (run / "metrics.csv").read_text().splitlines()
    assert history[1].split(",")[4] == "nan"  # val_loss: the sign of the divergence


def test_without_a_validation_split_best_is_the_last_epoch(toy_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          toy_blobs_class: type) -> None:
    """A refit (no validation files): every epoch trains, none validates, best.pt is the last epoch's model."""
    real = toy_blobs_class.dataset
    monkeypatch.setattr(toy_blobs_class, "dataset", lambda self, split: real(self, split) if split != "val" else torch.utils.data.TensorDataset(
        torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)))
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, split: pytest.fail("no validation split, yet validated"))
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=4", "train.early_stop_patience=1"]) == 0
    best, last = load_checkpoint(run / "checkpoints" / "best.pt"), load_checkpoint(run / "checkpoints" / "last.pt")
    assert best["epoch"] == last["epoch"] == 4 and best["best"]["epoch"] == 4
    assert all(torch.equal(best["model"][k], last["model"][k]) for k in last["model"])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["best_epoch"] == 4 and metrics["monitor"] is None and metrics["best_val"] is None
    assert "no validation split: best.pt is the last epoch" in (run / "train.log").read_text()


def test_an_empty_evaluation_split_names_the_splits_that_hold_data(toy_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   toy_blobs_class: type, capsys: pytest.CaptureFixture) -> None:
    real, empty = toy_blobs_class.dataset, set()
    monkeypatch.setattr(toy_blobs_class, "dataset", lambda self, split: real(self, split) if split not in empty else torch.utils.data.TensorDataset(
        torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)))
    empty.add("val")
    assert main(["train", "-c", str(toy_config), "-o", str(tmp_path / "a"), "evaluation.split=val"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the val split is empty" in err and err.endswith("evaluation.split=test (--split test)")
    empty.add("test")
    assert main(["train", "-c", str(toy_config), "-o", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the test split is empty" in err and "no validation or test data either" in err and "--split" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
