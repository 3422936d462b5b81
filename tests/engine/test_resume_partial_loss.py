"""A run stopped mid-epoch and resumed records the epoch's training loss bit for bit as an
uninterrupted run: the running loss sum continues from the checkpoint's value, each step's
loss added in turn, not the resumed steps summed apart and added to it (float addition is not
associative: 3.2008476682885902 against 3.20084766828859).

The toy task trains for real; the loss weights are made irregular (0.1 x batch size x a number
from the batch's labels) so that summation order shows in the last digits; with one process
they only enter the recorded loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sciformer.cli import main
from sciformer.engine import loops
from sciformer.engine.checkpoint import load_checkpoint
from sciformer.engine.trainer import Trainer
from sciformer.errors import SciformerError


@pytest.fixture
def irregular_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    def weight(loss_fn: torch.nn.Module, target: torch.Tensor) -> float:  # of the batch alone, as the real one
        return 0.1 * target.numel() * (1 + int(target.sum()) % 7)

    monkeypatch.setattr(loops, "loss_weight", weight)


def _losses(run: Path) -> list[str]:
    return [row.split(",")[3] for row in (run / "metrics.csv").read_text().splitlines()]


def test_a_mid_epoch_resume_records_the_same_training_loss(toy_config: Path, tmp_path: Path, irregular_weights: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["train.epochs=2", "train.checkpoint_every_steps=1"]
    assert main(["train", "-c", str(toy_config), "-o", str(tmp_path / "straight"), *args]) == 0
    straight = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    per_epoch = straight["global_step"] // 2
    real = Trainer._check_finite
    for stop_after in range(2, per_epoch):  # several places in epoch 1; any one may show the order
        run = tmp_path / f"stopped_{stop_after}"

        def stop(self: Trainer, at: int = stop_after) -> None:  # runs before each step's checkpoint: last.pt holds step `at`
            if self.global_step == at:
                raise SciformerError("stopped")
            real(self)

        monkeypatch.setattr(Trainer, "_check_finite", stop)
        assert main(["train", "-c", str(toy_config), "-o", str(run), *args]) != 0
        assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == stop_after
        monkeypatch.setattr(Trainer, "_check_finite", real)
        assert main(["train", "--resume", str(run)]) == 0
        assert _losses(run) == _losses(tmp_path / "straight"), stop_after
        resumed = load_checkpoint(run / "checkpoints" / "last.pt")
        assert [r["train_loss"] for r in resumed["history"]] == [r["train_loss"] for r in straight["history"]], stop_after
