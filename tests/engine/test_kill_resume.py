"""Kill a real training process with SIGKILL mid-run, resume it, and end on identical weights."""

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


def _experiment(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    h, w, bands, classes = 20, 20, 10, 3
    gt = (np.arange(h * w) % classes + 1).reshape(h, w)
    cube = rng.normal(size=(classes, bands))[gt - 1] * 2 + 0.5 * rng.normal(size=(h, w, bands))
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "name: kill\n"
        "data: {name: hsi_scene, source: cube.npy, label_path: gt.npy, patch_size: 3,\n"
        "       split: {kind: stratified, train_per_class: 60, val_fraction: 0.2}}\n"  # augmentation on: RNG state matters
        "model: {name: spectralformer, dim: 16, depth: 1, num_heads: 2, group_size: 2, stride: 2}\n"  # dropout on
        "train: {epochs: 6, batch_size: 8, progress: never, threads: 1, checkpoint_every_steps: 1}\n"
        "export: {png: false, envi: false}\n"
    )
    return cfg


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    cfg = _experiment(tmp_path)
    cmd = [sys.executable, "-m", "sciformer", "train", "-c", str(cfg)]
    done = subprocess.run([*cmd, "-o", "straight"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    reference = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    total_steps = reference["global_step"]

    proc = subprocess.Popen([*cmd, "-o", "killed"], cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    last = tmp_path / "killed" / "checkpoints" / "last.pt"
    target = total_steps // 2 + 3  # mid-epoch
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if last.exists() and load_checkpoint(last)["global_step"] >= target:  # atomic writes: never truncated
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    killed_at = load_checkpoint(last)["global_step"]
    assert 0 < killed_at < total_steps, "the process finished before it could be killed"

    resumed = subprocess.run([*cmd[:3], "train", "--resume", str(tmp_path / "killed")], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    final = load_checkpoint(last)
    assert final["global_step"] == total_steps
    for key in reference["model"]:
        assert torch.equal(reference["model"][key], final["model"][key]), key
    assert _rows_without_time(tmp_path / "straight") == _rows_without_time(tmp_path / "killed")


def _rows_without_time(run: Path) -> list[str]:
    """metrics.csv rows less the wall-clock column (losses and validation scores must agree)."""
    return [row.rsplit(",", 1)[0] for row in (run / "metrics.csv").read_text().splitlines()]
