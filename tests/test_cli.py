"""The command line end to end on the toy task: train, resume, evaluate, errors."""

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def test_train_writes_a_complete_run(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "--config", str(toy_config), "--output-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "test results (toy)" in out and "OA" in out
    for name in ("config.yaml", "env.json", "metrics.csv", "metrics.json", "per_class.csv", "confusion_matrix.csv", "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (run / name).is_file(), name
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["split"] == "test" and metrics["oa"] > 0.9  # separable blobs
    assert set(metrics["per_class"]) == {"class_0", "class_1", "class_2"}
    assert metrics["protocol"] == {"protocol": "toy blobs"}
    assert [int(r["epoch"]) for r in _rows(run)] == [1, 2, 3]
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    assert best["best"]["epoch"] == metrics["best_epoch"]  # best is chosen on validation
    assert json.loads((run / "env.json").read_text())["seed"] == 0
    # the run folder is not silently reused
    assert main(["train", "--config", str(toy_config), "--output-dir", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err


@pytest.mark.parametrize("stop_at_step", [3, 8, 13])
def test_interrupted_then_resumed_run_matches_uninterrupted(
    toy_config: Path, toy_model_class: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at_step: int
) -> None:
    """SIGTERM mid-epoch (or at an epoch end) writes a checkpoint; --resume ends on identical weights."""
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main(["train", "-c", str(toy_config), "-o", str(straight)]) == 0

    calls = {"n": 0}
    original = toy_model_class.forward

    def forward(self, batch):
        if self.training:
            calls["n"] += 1
            if calls["n"] == stop_at_step:
                os.kill(os.getpid(), signal.SIGTERM)  # handled between steps: checkpoint, then exit 130
        return original(self, batch)

    monkeypatch.setattr(toy_model_class, "forward", forward)
    assert main(["train", "-c", str(toy_config), "-o", str(cut)]) == 130
    stopped = load_checkpoint(cut / "checkpoints" / "last.pt")
    assert stopped["global_step"] == stop_at_step
    monkeypatch.setattr(toy_model_class, "forward", original)
    assert main(["train", "--resume", str(cut)]) == 0
    a = load_checkpoint(straight / "checkpoints" / "last.pt")
    b = load_checkpoint(cut / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"] == 3 * 8
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert [r["train_loss"] for r in _rows(straight)] == [r["train_loss"] for r in _rows(cut)]


def test_evaluate_and_errors(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run / "checkpoints" / "best.pt"), "--split", "val"]) == 0
    metrics = json.loads((run / "evaluation-val" / "metrics.json").read_text())
    assert metrics["split"] == "val" and 0 <= metrics["oa"] <= 1
    # each checkpoint and split has its own folder: evaluating last.pt or the test split keeps the val result
    assert main(["evaluate", "--checkpoint", str(run), "--split", "test"]) == 0
    assert main(["evaluate", "--checkpoint", str(run / "checkpoints" / "last.pt")]) == 0
    assert json.loads((run / "evaluation" / "metrics.json").read_text())["split"] == "test"
    assert json.loads((run / "evaluation-last" / "metrics.json").read_text())["checkpoint"].endswith("last.pt")
    assert (run / "evaluation-val" / "metrics.json").read_text() == json.dumps(metrics, indent=2) + "\n"
    capsys.readouterr()
    # an earlier evaluation is replaced only when asked
    before = (run / "evaluation-val" / "metrics.json").read_bytes()
    assert main(["evaluate", "--checkpoint", str(run), "--split", "val", "evaluation.batch_size=7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds metrics.json" in err[0] and "--overwrite" in err[0]
    assert (run / "evaluation-val" / "metrics.json").read_bytes() == before
    assert main(["evaluate", "--checkpoint", str(run), "--split", "val", "--overwrite"]) == 0
    # the run folder itself holds the run's own test result: refused even with --overwrite; a file too
    run_metrics = (run / "metrics.json").read_bytes()
    (tmp_path / "link").symlink_to(run / "checkpoints", target_is_directory=True)
    for out, fragment in [(run, "is a run folder"), (run / "checkpoints", "is a run folder"), (run / "checkpoints" / "sub", "is a run folder"),
                          (run / "tensorboard" / "x", "is a run folder"), (tmp_path / "link", "is a run folder"),
                          (run / "metrics.json", "is a file")]:
        capsys.readouterr()
        assert main(["evaluate", "--checkpoint", str(run / "checkpoints" / "last.pt"), "-o", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    assert (run / "metrics.json").read_bytes() == run_metrics and not (run / "tensorboard").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    # a checkpoint outside a run's checkpoints/ folder is evaluated beside it
    loose = tmp_path / "downloads" / "best.pt"
    loose.parent.mkdir()
    loose.write_bytes((run / "checkpoints" / "best.pt").read_bytes())
    assert main(["evaluate", "--checkpoint", str(loose)]) == 0
    assert (loose.parent / "evaluation" / "metrics.json").is_file() and not (tmp_path / "evaluation").exists()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "missing.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    assert main(["train", "-c", str(toy_config), "--print-config", "model.hidden=5"]) == 0
    assert "hidden: 5" in capsys.readouterr().out


def test_subprocess_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {name: hsi_scene}\nmodel: {name: spectralformer}\ntrain: {epoch: 3}\n")
    proc = subprocess.run([sys.executable, "-m", "sciformer", "train", "--config", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"sciformer train: error: {bad}: unknown key 'train.epoch'; did you mean 'train.epochs'?"
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_version_and_info(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "models:" in out and "spectralformer" in out and "hsi_scene" in out


def test_tensorboard_scalars_per_epoch(toy_config: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.tensorboard=true"]) == 0
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) >= {"train/loss", "val/oa", "lr"}
    oa = [e.value for e in events.Scalars("val/oa")]
    rows = _rows(run)
    assert [e.step for e in events.Scalars("val/oa")] == [1, 2, 3]
    assert oa == pytest.approx([float(r["val_oa"]) for r in rows], abs=1e-6)
