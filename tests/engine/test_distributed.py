"""Two CPU processes (torchrun, gloo) end on the weights and metrics of one process.

Augmentation (flips/rotations), dropout and stochastic depth are on, and the training split
leaves uneven shares (global batches of 15, and a last one of 13, over two ranks): random numbers follow the
sample, and losses are averaged per sample over the global batch.
"""

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

# All-reducing two half-batch gradients sums in another order than one process does:
# float32 rounding differs in the last bits, nothing more.
TOLERANCE = 1e-5


def _scene(tmp_path: Path, optimizer: str, weighted: bool = False) -> Path:
    cube, gt, _ = make_hsi_scene(h=24, w=24, bands=12, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    cfg = tmp_path / "exp.yaml"
    lr = "0.05" if optimizer == "sgd" else "0.003"
    cfg.write_text(
        "name: ddp\n"
        "data: {name: hsi_scene, source: cube.npy, label_path: gt.npy, patch_size: 3,\n"
        "       split: {kind: stratified, train_per_class: 42, val_fraction: 0.25}}\n"  # 88 training samples
        "model: {name: spectralformer, dim: 16, depth: 1, num_heads: 2, dropout: 0.2, drop_path: 0.2, group_size: 3, stride: 3}\n"
        f"optimizer: {{name: {optimizer}, lr: {lr}}}\n"
        "train: {epochs: 2, batch_size: 15, progress: never, threads: 1" + (", class_weights: [1, 4, 9]" if weighted else "") + "}\n"
        "export: {png: false, envi: false}\n"
    )
    return cfg


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a rank that aborts prints where
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _torchrun(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "sciformer", *args], cwd)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,weighted", [("sgd", False), ("adamw", False), ("sgd", True)])
def test_two_processes_match_one(tmp_path: Path, optimizer: str, weighted: bool) -> None:
    """With class weights, a rank's loss is a mean over its share of the weight, not of the count."""
    cfg = _scene(tmp_path, optimizer, weighted)
    single = _run([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", "single"], tmp_path)
    assert single.returncode == 0, single.stderr
    assert "'train': 88" in single.stdout  # 5 batches of 15 (8 + 7 per rank) and one of 13 (7 + 6)
    multi = _torchrun(tmp_path, "train", "-c", str(cfg), "-o", "multi")
    assert multi.returncode == 0, (multi.stdout[-2000:], multi.stderr[-12000:])
    assert multi.stdout.count("test results (ddp)") == 1  # only rank 0 prints
    a = load_checkpoint(tmp_path / "single" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "multi" / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"] == 12
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], atol=TOLERANCE, rtol=0, msg=key)
    ma = json.loads((tmp_path / "single" / "metrics.json").read_text())
    mb = json.loads((tmp_path / "multi" / "metrics.json").read_text())
    assert mb["world_size"] == 2
    for key in ("oa", "aa", "kappa", "miou"):
        assert mb[key] == ma[key], key
    assert (tmp_path / "single" / "confusion_matrix.csv").read_text() == (tmp_path / "multi" / "confusion_matrix.csv").read_text()
    rows_a = (tmp_path / "single" / "metrics.csv").read_text().splitlines()
    rows_b = (tmp_path / "multi" / "metrics.csv").read_text().splitlines()
    assert len(rows_a) == len(rows_b) == 3
    for ra, rb in zip(rows_a[1:], rows_b[1:]):
        va = [float(x) for x in ra.split(",")[:-1] if x]
        vb = [float(x) for x in rb.split(",")[:-1] if x]
        np.testing.assert_allclose(vb, va, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_errors_under_torchrun_are_one_line_from_rank_0(tmp_path: Path) -> None:
    cfg = _scene(tmp_path, "sgd")
    multi = _torchrun(tmp_path, "train", "-c", str(cfg), "-o", "multi", "data.source=absent.npy")
    assert multi.returncode != 0
    ours = [ln for ln in multi.stderr.splitlines() if ln.startswith("sciformer train:")]
    assert ours == [f"sciformer train: error: {tmp_path / 'absent.npy'}: file not found"], multi.stderr[-2000:]
    assert "exitcode  : 2" in multi.stderr  # the single-process exit code (torchrun stops the other rank)
    assert not (tmp_path / "multi" / "metrics.json").exists()


_ENDING = r"""
import atexit
import sys

from sciformer import cli
from sciformer.engine import distributed

distributed._joined = {joined}  # what init_distributed sets on joining a group
sys.argv[0] = "__main__.py"  # the command line is the process (python -m sciformer)
cli._run_command = lambda argv: 3  # the command's exit code
atexit.register(lambda: print("exit handlers ran", flush=True))


class Finalized:
    def __del__(self) -> None:  # runs when the interpreter finalizes (module globals cleared)
        print("finalized", flush=True)


kept = Finalized()
code = cli.main([])
print("main returned", code, flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("joined", [True, False])
def test_a_rank_ends_through_its_exit_handlers_not_finalization(joined: bool) -> None:
    """A process that joined a group ends in main with the command's code after its exit
    handlers, never finalizing the interpreter: there a gloo thread releasing a collective's
    tensors aborted the process after a complete run (status -6). Other processes return."""
    proc = subprocess.run([sys.executable, "-c", _ENDING.replace("{joined}", str(joined))], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    if joined:
        assert lines == ["exit handlers ran"]
    else:
        assert lines == ["main returned 3", "exit handlers ran", "finalized"]


@pytest.mark.parametrize("command", [["evaluate", "--checkpoint", "run"], ["predict", "--checkpoint", "run", "-i", "a.las", "-o", "b.las"],
                                     ["pretrain", "-c", "exp.yaml"]])
def test_only_train_runs_under_torchrun(command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    """Any other command would run whole on every process, each writing the same outputs: refused in
    one line from rank 0, the same exit code on every rank, nothing written."""
    from sciformer.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, lines in (("0", 1), ("1", 0)):
        monkeypatch.setenv("RANK", rank)
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == lines
        if lines:
            assert f"sciformer {command[0]} runs in one process; run it without torchrun" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_lost_peer_is_one_line_that_says_how_to_continue() -> None:
    from sciformer.errors import resource_failure

    text = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:12679: Connection reset by peer. "
            "This is typically caused by a remote process ending")
    line = resource_failure(RuntimeError(text))
    assert line is not None and "another process of this run stopped" in line and "--resume" in line
    assert resource_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None  # a bug keeps its traceback


@pytest.mark.parametrize("value", ["abc", "1.0", "", "1"])
def test_a_world_size_torchrun_did_not_set_is_one_process(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sciformer.utils.ranks import check_one_process, world_size

    monkeypatch.setenv("WORLD_SIZE", value)
    assert world_size() == 1
    check_one_process("evaluate")  # not refused


_LATE_RANK = r"""
import os
import runpy
import sys
import time

if os.environ.get("LOCAL_RANK") == "1":
    time.sleep(1.5)  # rank 1 names its default run folder in a later second than rank 0 (a busy machine)
sys.argv[0] = "sciformer"
runpy.run_module("sciformer", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_every_rank_takes_rank_0s_default_run_folder(tmp_path: Path) -> None:
    """Without --output-dir, each process used to name runs/<name>-<time> from its own clock, and
    ranks a second apart stopped on "not one folder for every process ... --nnodes > 1". The run
    stops on the batch-size check that follows the folder check: the folder was one folder."""
    cfg = _scene(tmp_path, "sgd")
    (tmp_path / "late_rank.py").write_text(_LATE_RANK)
    repo = Path(__file__).resolve().parents[2]  # this checkout's sciformer, not an installed one
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "late_rank",
                            "train", "-c", str(cfg), "train.batch_size=2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    ours = [ln for ln in multi.stderr.splitlines() if ln.startswith("sciformer train:")]
    assert ours == ["sciformer train: error: train.batch_size 2 is the global batch; with 2 processes it must be at least 4"], multi.stderr[-3000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # the refused run left no folder


@pytest.mark.parametrize("env,machines", [({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, 1), ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, 2),
                                          ({"WORLD_SIZE": "4"}, 1), ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "x"}, 1)])
def test_the_machines_of_a_launch_come_from_torchrun(env: dict[str, str], machines: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder mismatch blames --nnodes > 1 only when the processes are on several machines."""
    from sciformer.utils.ranks import machines_of_launch

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert machines_of_launch() == machines
