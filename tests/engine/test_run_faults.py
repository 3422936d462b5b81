"""Run-level faults: signals at any moment, non-finite weights, resumes that must not touch the
run folder, keyed dropout. A run never looks finished (no metrics.json) when it is not."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_hsi_scene
from torch import nn

from sciformer.cli import main
from sciformer.engine.noise import KeyedDropout, StepNoise, install

# Runs the command line with one function patched to send signals to the process itself.
RUNNER = """
import os, signal, sys
import sciformer.engine.trainer as trainer
from sciformer.cli import main
mode = os.environ["FAULT"]
if mode == "term-in-final-eval":
    real = trainer.evaluate_and_export
    def patched(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    trainer.evaluate_and_export = patched
elif mode == "double-ctrl-c":
    real_check = trainer.Trainer._check_finite
    def check(self):
        if self.global_step == 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real_check(self)
    trainer.Trainer._check_finite = check
sys.exit(main())
"""


def _experiment(tmp_path: Path, epochs: int = 2) -> Path:
    cube, gt, _ = make_hsi_scene(h=12, w=12, bands=6, classes=3, block=3)
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", gt)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "name: faults\n"
        "data: {name: hsi_scene, source: cube.npy, label_path: gt.npy, patch_size: 3, split: {kind: stratified, train_per_class: 0.5}}\n"
        "model: {name: spectralformer, dim: 8, depth: 1, num_heads: 1, group_size: 2, stride: 2}\n"
        f"train: {{epochs: {epochs}, batch_size: 8, progress: never, threads: 1}}\n"
        "export: {png: false, envi: false}\n"
    )
    return cfg


def _env(**extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    env.pop("SCIFORMER_DEBUG", None)
    return env


def _wait_until_catching_sigterm(pid: int, timeout: float = 60.0) -> None:
    """Wait until the process has a SIGTERM handler (bit 15 of SigCgt in /proc/PID/status; Linux)."""
    status = Path(f"/proc/{pid}/status")
    deadline = time.time() + timeout
    while time.time() < deadline and status.exists():
        caught = next((line.split()[1] for line in status.read_text().splitlines() if line.startswith("SigCgt:")), "0")
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
def test_sigterm_at_start_during_final_evaluation_and_double_ctrl_c(tmp_path: Path) -> None:
    cfg = _experiment(tmp_path)
    # before the first step (while importing and reading the data)
    proc = subprocess.Popen([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", "early"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_until_catching_sigterm(proc.pid)  # the interpreter itself starts before any of our code
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in _one_line(err)
    assert not (tmp_path / "early" / "metrics.json").exists()
    # during the final evaluation, and twice Ctrl-C inside a step
    for fault in ("term-in-final-eval", "double-ctrl-c"):
        done = subprocess.run([sys.executable, "-c", RUNNER, "train", "-c", str(cfg), "-o", fault], cwd=tmp_path,
                              env=_env(FAULT=fault), capture_output=True, text=True, timeout=300)
        assert done.returncode == 130, f"{fault}: {done.stderr}"
        assert _one_line(done.stderr) == "sciformer train: interrupted", fault
        assert not (tmp_path / fault / "metrics.json").exists(), fault
    assert (tmp_path / "term-in-final-eval" / "checkpoints" / "best.pt").exists()  # training itself was complete


@pytest.mark.slow
def test_a_signal_at_a_random_moment_of_start_up_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """SIGINT or SIGTERM anywhere in the first 0.6 s after the handler is set (imports, parser, data): exit 130,
    one line. An interrupted ``import torch`` once made the process end by SIGINT (status -2)
    after printing the line; these 20 draws caught it."""
    cfg = _experiment(tmp_path)
    rng = np.random.default_rng(7)
    for i, delay in enumerate(rng.uniform(0.0, 0.6, size=20)):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        proc = subprocess.Popen([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", f"r{i}"], cwd=tmp_path,
                                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_until_catching_sigterm(proc.pid)
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0:  # the run finished before the signal came: nothing to check
            continue
        assert proc.returncode == 130, f"{sig!r} after {delay:.3f} s: status {proc.returncode}: {err}"
        assert _one_line(err).endswith("interrupted"), err
        assert not (tmp_path / f"r{i}" / "metrics.json").exists()


def test_non_finite_weights_stop_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    cfg = _experiment(tmp_path, epochs=1)
    real_step = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    code = main(["train", "-c", str(cfg), "-o", str(tmp_path / "run")])
    assert code == 2
    assert "training weights became nan/inf at epoch 1, step 1" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_resume_mismatch_leaves_the_run_folder_untouched(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _experiment(tmp_path, epochs=1)
    run = tmp_path / "run"
    assert main(["train", "-c", str(cfg), "-o", str(run)]) == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (run / "config.yaml", run / "env.json")}
    for override, key in (("model.dim=16", "model.dim"), ("optimizer.name=sgd", "optimizer.name")):
        capsys.readouterr()
        assert main(["train", "--resume", str(run), override, "train.epochs=2"]) == 2
        assert f"--resume cannot change {key}" in _one_line(capsys.readouterr().err)
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (run / "config.yaml", run / "env.json")}
    assert after == before
    # a second process on a folder that holds a run, and a resume that extends it, still work as before
    assert main(["train", "-c", str(cfg), "-o", str(run)]) == 2
    assert "already holds a run" in _one_line(capsys.readouterr().err)


def test_keyed_dropout_masks_follow_the_sample() -> None:
    """Two ranks holding rows 0,2,4 and 1,3 of a global batch draw the masks one process draws."""
    torch.manual_seed(0)
    x = torch.randn(5, 4, 6)  # (n, T, D)
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.Linear(6, 6))
    full_noise = StepNoise(seed=3)
    install(model, full_noise)
    assert isinstance(model[1], KeyedDropout)
    model.train()
    full_noise.begin(7, torch.arange(5), 5)
    reference = model(x)
    for rank in (0, 1):
        noise = StepNoise(seed=3, rank=rank)
        model[1]._noise = noise
        rows = torch.arange(rank, 5, 2)
        noise.begin(7, rows, 5)
        torch.testing.assert_close(model(x[rows]), reference[rows], rtol=0, atol=0)
    full_noise.begin(8, torch.arange(5), 5)  # another step: other masks
    model[1]._noise = full_noise
    assert not torch.equal(model(x), reference)
    # the mask keeps about 1 - p of the values, scaled by 1 / (1 - p)
    kept = full_noise.keep_mask((1000, 50), 0.5, torch.device("cpu")) if full_noise.begin(9, torch.arange(1000), 1000) is None else None
    assert kept is not None and abs(float(kept.mean()) - 0.5) < 0.01


@pytest.mark.parametrize("fail_on", ["last.pt", "predictions"])
def test_a_resumed_run_that_fails_never_shows_its_old_test_result_beside_a_new_best(
        toy_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fail_on: str) -> None:
    """A finished run trained on with --resume: once best.pt is replaced, the old metrics.json
    (and its tables) describe a model that is gone. A failure after that point (the epoch's
    last.pt, the final evaluation) leaves no metrics.json; one that names best.pt's epoch is fine."""
    import json

    import sciformer.engine.report as report
    import sciformer.engine.trainer as trainer

    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    assert json.loads((run / "metrics.json").read_text())["best_epoch"] == 1
    (run / "predictions").mkdir()  # as a task that exports writes them: the old best.pt's map, which goes with its result
    (run / "predictions" / "map.npy").write_bytes(b"the old best.pt's map")
    monkeypatch.setattr(trainer, "improves", lambda *args: True)  # every validation gives a new best.pt
    real_save = trainer.save_checkpoint

    def save(path, payload):
        if fail_on == "last.pt" and path.name == "last.pt" and payload["epoch"] == 2:
            raise OSError(28, "No space left on device")
        real_save(path, payload)

    def write(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer, "save_checkpoint", save)
    if fail_on == "predictions":
        monkeypatch.setattr(report, "write_evaluation", write)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.epochs=3"]) == 2
    best_epoch = torch.load(run / "checkpoints" / "best.pt", weights_only=True)["epoch"]
    assert best_epoch == (2 if fail_on == "last.pt" else 3)
    assert not any((run / name).exists() for name in ("metrics.json", "per_class.csv", "confusion_matrix.csv", "confusion_matrix.png",
                                                      "predictions"))
    assert "earlier test result" in (run / "train.log").read_text()


def test_a_run_keeps_its_id_through_resumes_and_copies_of_the_whole_folder(tmp_path: Path) -> None:
    """last.pt and env.json name the same run id, which a resume keeps; a copy of the whole folder
    is the same run and resumes (a last.pt of another run does not: the hardening corpus)."""
    cfg = _experiment(tmp_path, epochs=1)
    run = tmp_path / "run"
    assert main(["train", "-c", str(cfg), "-o", str(run)]) == 0

    def ids(folder: Path) -> tuple[str, str]:
        env = json.loads((folder / "env.json").read_text())["run_id"]
        return env, torch.load(folder / "checkpoints" / "last.pt", weights_only=True)["run_id"]

    first, in_ckpt = ids(run)
    assert first == in_ckpt and len(first) == 32
    assert main(["train", "--resume", str(run), "train.epochs=2"]) == 0
    assert ids(run) == (first, first)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert main(["train", "--resume", str(copy), "train.epochs=3"]) == 0
    assert ids(copy) == (first, first)
    other = tmp_path / "other"
    assert main(["train", "-c", str(cfg), "-o", str(other)]) == 0
    assert ids(other)[0] != first
