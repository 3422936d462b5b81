"""Two CPU processes (torchrun, gloo) give the metrics and weights of one process on the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_hsi_scene

from sciformer.engine.checkpoint import load_checkpoint

# Gradients of two ranks are averaged by an all-reduce, in another summation order than one
# process: float32 rounding differs, so weights agree to this tolerance (SGD keeps it tight;
# Adam divides by the gradient scale and amplifies rounding of near-zero gradients).
TOLERANCE = 1e-4


def _scene(tmp_path: Path) -> Path:
    cube, gt, _ = make_hsi_scene(h=24, w=24, bands=12, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "name: ddp\n"
        "data: {name: hsi_scene, source: cube.npy, label_path: gt.npy, patch_size: 3,\n"
        "       split: {kind: stratified, train_per_class: 40, val_fraction: 0.25}, augment: {flip: false, rotate: false}}\n"
        "model: {name: spectralformer, dim: 16, depth: 1, num_heads: 2, dropout: 0.0, drop_path: 0.0, group_size: 3, stride: 3}\n"
        "optimizer: {name: sgd, lr: 0.05}\n"
        "train: {epochs: 2, batch_size: 16, progress: never, threads: 1}\n"
        "export: {png: false, envi: false}\n"
    )
    return cfg


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_processes_match_one(tmp_path: Path) -> None:
    cfg = _scene(tmp_path)
    single = _run([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", "single"], tmp_path)
    assert single.returncode == 0, single.stderr
    multi = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "sciformer",
                  "train", "-c", str(cfg), "-o", "multi"], tmp_path)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert multi.stdout.count("test results (ddp)") == 1  # only rank 0 prints
    a = load_checkpoint(tmp_path / "single" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "multi" / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"]
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], atol=TOLERANCE, rtol=TOLERANCE)
    ma = json.loads((tmp_path / "single" / "metrics.json").read_text())
    mb = json.loads((tmp_path / "multi" / "metrics.json").read_text())
    assert mb["world_size"] == 2
    for key in ("oa", "aa", "kappa"):
        assert mb[key] == pytest.approx(ma[key], abs=TOLERANCE)
    rows_a = (tmp_path / "single" / "metrics.csv").read_text().splitlines()
    rows_b = (tmp_path / "multi" / "metrics.csv").read_text().splitlines()
    assert len(rows_a) == len(rows_b) == 3
    for ra, rb in zip(rows_a[1:], rows_b[1:]):
        va = [float(x) for x in ra.split(",")[:-1] if x]
        vb = [float(x) for x in rb.split(",")[:-1] if x]
        np.testing.assert_allclose(va, vb, atol=1e-3, rtol=1e-3)
