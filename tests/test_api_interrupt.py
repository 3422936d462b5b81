"""Ctrl-C during ``sciformer.train`` reaches the caller as a KeyboardInterrupt (after the checkpoint),
never as a SciformerError a sweep would skip; the command line keeps its line and exit 130."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import sciformer
from sciformer.cli import main
from sciformer.errors import SciformerError


def _signal_at_step(monkeypatch: pytest.MonkeyPatch, model_class: type, step: int) -> None:
    calls = {"n": 0}
    original = model_class.forward

    def forward(self, batch):  # noqa: ANN001, ANN202
        if self.training:
            calls["n"] += 1
            if calls["n"] == step:
                os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, handled between steps
        return original(self, batch)

    monkeypatch.setattr(model_class, "forward", forward)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # an earlier test may leave it ignored


def test_ctrl_c_in_the_api_is_a_keyboard_interrupt_naming_the_python_resume(
    toy_config: Path, toy_model_class: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    _signal_at_step(monkeypatch, toy_model_class, 3)
    with pytest.raises(KeyboardInterrupt) as caught:
        try:
            sciformer.train(toy_config, output_dir=run)
        except SciformerError:  # what a sweep skipping bad configs catches: never the user's Ctrl-C
            pytest.fail("Ctrl-C was raised as a SciformerError")
    assert f"sciformer.train(resume={str(run)!r})" in str(caught.value) and "--resume" not in str(caught.value)
    assert (run / "checkpoints" / "last.pt").is_file()  # written before the interrupt reached the caller
    monkeypatch.undo()
    assert sciformer.train(resume=run).best_epoch >= 1  # and it continues as the message says


def test_ctrl_c_on_the_command_line_keeps_its_line_and_exit_code(
    toy_config: Path, toy_model_class: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    _signal_at_step(monkeypatch, toy_model_class, 3)
    assert main(["train", "-c", str(toy_config), "-o", str(run)]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("sciformer train: error: stopped by signal") and err.endswith(f"continue with: sciformer train --resume {run}")
