"""Kill a real training process with SIGKILL (mid-epoch, between epoch-end checkpoints, inside a
save), resume it, and end on the weights of an uninterrupted run, bit for bit.

Augmentation (flips/rotations) and dropout plus stochastic depth are on: every random number
of a step must be reproduced after the resume. The second case adds the spectral augmentations
(illumination, noise) and the weight average (train.ema), which must continue exactly too.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sciformer.engine.checkpoint import load_checkpoint

# Runs the command line with torch.save patched to SIGKILL the process right after the
# N-th checkpoint's temporary file is written (before it is renamed into place).
KILL_IN_SAVE = """
import os, signal, sys, torch
from sciformer.cli import main
limit, calls, real = int(os.environ["KILL_AT_SAVE"]), [0], torch.save
def save(obj, f, *args, **kwargs):
    real(obj, f, *args, **kwargs)
    calls[0] += 1
    if calls[0] == limit:
        os.kill(os.getpid(), signal.SIGKILL)
torch.save = save
sys.exit(main())
"""


# case -> (extra data lines, extra train lines)
EXTRA = {"plain": ("", ""), "ema_spectral": ("  augment: {illumination: 0.2, noise: 0.1}\n", "  ema: 0.9\n")}


def _experiment(tmp_path: Path, case: str = "plain") -> Path:
    rng = np.random.default_rng(1)
    h, w, bands, classes = 16, 16, 8, 3
    gt = (np.arange(h * w) % classes + 1).reshape(h, w)
    cube = rng.normal(size=(classes, bands))[gt - 1] * 2 + 0.5 * rng.normal(size=(h, w, bands))
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    data_extra, train_extra = EXTRA[case]
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "name: kill\n"
        "data:\n  name: hsi_scene\n  source: cube.npy\n  label_path: gt.npy\n  patch_size: 3\n"
        "  split: {kind: stratified, train_per_class: 30, val_fraction: 0.2}\n"  # default augmentation: flips + rotations
        + data_extra
        + "model: {name: spectralformer, dim: 16, depth: 1, num_heads: 2, group_size: 2, stride: 2, dropout: 0.2, drop_path: 0.2}\n"
        "train:\n  epochs: 3\n  batch_size: 8\n  progress: never\n  threads: 1\n"
        + train_extra
        + "export: {png: false, envi: false}\n"
    )
    return cfg


def _env(**extra: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _train(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sciformer", "train", *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=600)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if ready():
                break
        except Exception:  # noqa: BLE001 - a checkpoint being replaced at this instant
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _rows_without_time(run: Path) -> list[str]:
    """metrics.csv rows less the wall-clock column (losses and validation scores must agree)."""
    return [row.rsplit(",", 1)[0] for row in (run / "metrics.csv").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EXTRA))
def test_sigkill_anywhere_then_resume_matches_uninterrupted_bitwise(tmp_path: Path, case: str) -> None:
    cfg = _experiment(tmp_path, case)
    done = _train(["-c", str(cfg), "-o", "straight"], tmp_path)
    assert done.returncode == 0, done.stderr
    reference = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    total, per_epoch = reference["global_step"], reference["global_step"] // 3
    rng = np.random.default_rng(14)

    def last(run: str) -> Path:
        return tmp_path / run / "checkpoints" / "last.pt"

    # 1. mid-epoch, with a checkpoint after every step: killed at a random step of epoch 2 or 3
    target = int(rng.integers(per_epoch + 1, total - 3))
    proc = subprocess.Popen([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", "mid", "train.checkpoint_every_steps=1"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: last("mid").exists() and load_checkpoint(last("mid"))["global_step"] >= target)
    # 2. only epoch-end checkpoints: killed at a random moment of epoch 2 (a fraction of the fastest epoch)
    epoch_s = min(float(row.rsplit(",", 1)[1]) for row in (tmp_path / "straight" / "metrics.csv").read_text().splitlines()[1:])
    delay = float(rng.uniform(0.0, 0.8)) * epoch_s
    proc = subprocess.Popen([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", "boundary"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: last("boundary").exists() and not time.sleep(delay))
    # 3. inside a save: the temporary file is written, the rename never happens
    n_save = int(rng.integers(3, 5))  # saves 1 and 2 are epoch 1's best.pt and last.pt
    killed = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, "train", "-c", str(cfg), "-o", "insave"], cwd=tmp_path,
                            env=_env(KILL_AT_SAVE=str(n_save)), capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert list((tmp_path / "insave" / "checkpoints").glob(".*.tmp*")), "the kill should leave a temporary file"

    for run, where in (("mid", f"step {target}"), ("boundary", f"{delay:.2f} s after epoch 1"), ("insave", f"save {n_save}")):
        killed_at = load_checkpoint(last(run))["global_step"]
        assert 0 < killed_at < total, f"{run}: the process was not killed inside the run ({where})"
        resumed = _train(["--resume", str(tmp_path / run)], tmp_path)
        assert resumed.returncode == 0, f"{run} ({where}): {resumed.stderr}"
        final = load_checkpoint(last(run))
        assert final["global_step"] == total
        for key in reference["model"]:
            assert torch.equal(reference["model"][key], final["model"][key]), f"{run} ({where}, killed at step {killed_at}): {key}"
        if reference["ema"] is not None:  # the weight average continued exactly, and best.pt holds it
            assert final["ema"]["updates"] == total
            for key, value in reference["ema"]["weights"].items():
                assert torch.equal(value, final["ema"]["weights"][key]), f"{run} ({where}): ema {key}"
            best, best_ref = (load_checkpoint(tmp_path / r / "checkpoints" / "best.pt") for r in (run, "straight"))
            assert all(torch.equal(best_ref["model"][k], best["model"][k]) for k in best_ref["model"]), run
        assert _rows_without_time(tmp_path / "straight") == _rows_without_time(tmp_path / run), run
        assert not list((tmp_path / run).rglob(".*.tmp*")), f"{run}: temporary files left after the resume"
