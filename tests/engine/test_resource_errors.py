"""A machine resource that runs out (memory, file size, open files) ends a command with one line,
never a traceback or a hang: torch reports these as RuntimeErrors without their cause, and a
loading worker that cannot hand over its batch would leave the loader waiting forever."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from sciformer import cli
from sciformer.engine.batching import descriptors_for, stop_on_lost_batch
from sciformer.engine.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# Writes a first checkpoint, then one larger than RLIMIT_FSIZE allows (SIGXFSZ ignored, as a
# shell's ulimit -f leaves it, so the write fails with EFBIG).
EFBIG = """
import errno, resource, signal, sys, torch
from pathlib import Path
from sciformer.engine.checkpoint import save_checkpoint
path = Path(sys.argv[1])
save_checkpoint(path, {"model": {"w": torch.arange(10.0)}})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    save_checkpoint(path, {"model": {"w": torch.zeros(1 << 20)}})
except OSError as exc:
    print(exc.errno == errno.EFBIG, exc.filename == str(path), type(exc).__name__)
print(torch.load(path, weights_only=True)["model"]["w"].tolist() == list(range(10)))
"""


def test_a_checkpoint_write_over_the_file_size_limit_is_the_os_error(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    out = subprocess.run([sys.executable, "-c", EFBIG, str(path)], capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "OSError", "True"]  # EFBIG naming the checkpoint; the old one intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # no temporary left


def test_a_checkpoint_reads_back_as_torch_saved_it(tmp_path: Path) -> None:
    payload = {"model": {"w": torch.randn(300, 7), "b": torch.arange(5)}, "epoch": 3, "best": {"epoch": 2, "value": 0.5}}
    save_checkpoint(tmp_path / "a.pt", payload)
    torch.save(payload, tmp_path / "ref.pt")
    ours, ref = torch.load(tmp_path / "a.pt", weights_only=True), torch.load(tmp_path / "ref.pt", weights_only=True)
    assert ours["format"] == "sciformer-checkpoint"
    assert ours["epoch"] == ref["epoch"] and ours["best"] == ref["best"]
    for key in ref["model"]:
        assert torch.equal(ours["model"][key], ref["model"][key])


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_failed_torch_allocation_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def allocate(args):
        return int(torch.empty(1 << 45).numel())  # 128 TiB: torch's own allocator error

    monkeypatch.setitem(cli.COMMANDS, "report", allocate)
    assert cli.main(["report", "x"]) == 2
    line = _one_line(capsys)
    assert line.startswith("sciformer report: error: out of memory (an allocation of 131072.0 GiB failed)"), line
    assert "batch size" in line


def test_a_loading_worker_that_ended_is_one_line_naming_the_workers(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    loader = DataLoader(_Unpicklable(), batch_size=2, num_workers=1, collate_fn=lambda items: items,
                        worker_init_fn=stop_on_lost_batch, timeout=60)
    monkeypatch.setitem(cli.COMMANDS, "report", lambda args: next(iter(loader)))
    assert cli.main(["report", "x"]) == 2
    line = _one_line(capsys)  # (the worker's own line goes to its process's stderr)
    assert line.startswith("sciformer report: error: DataLoader worker") and "train.num_workers" in line


def test_a_runtime_error_that_is_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")

    monkeypatch.setitem(cli.COMMANDS, "report", broken)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cli.main(["report", "x"])


class _Unpicklable(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return lambda: i  # cannot be pickled: the queue's feeder thread fails on it


def test_a_batch_a_worker_cannot_hand_over_ends_the_loader_not_hangs_it() -> None:
    """Python's queue drops an item its feeder thread cannot pickle (as with EMFILE while passing
    tensors): the worker now ends and the loader raises; timeout=60 only turns a hang into a failure."""
    loader = DataLoader(_Unpicklable(), batch_size=2, num_workers=1, collate_fn=lambda items: items,
                        worker_init_fn=stop_on_lost_batch, timeout=60)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        next(iter(loader))


RAISE_LIMIT = """
import resource, sys
from sciformer.engine.batching import make_room_for_workers, descriptors_for
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
make_room_for_workers(int(sys.argv[1]))
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""


@pytest.mark.parametrize("workers", [1, 8, 200])
def test_the_open_file_limit_is_raised_for_the_workers_as_far_as_the_hard_limit(workers: int) -> None:
    out = subprocess.run([sys.executable, "-c", RAISE_LIMIT, str(workers)], capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode == 0, out.stderr
    soft, hard = (int(v) for v in out.stdout.split())
    need = descriptors_for(workers)
    if hard == resource.RLIM_INFINITY or hard >= need:
        assert soft >= need
    else:
        assert soft == hard


def _hsi_experiment(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    gt = (np.arange(16 * 16) % 3 + 1).reshape(16, 16)
    cube = rng.normal(size=(3, 8))[gt - 1] * 2 + 0.5 * rng.normal(size=(16, 16, 8))
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: files\ndata:\n  name: hsi_scene\n  source: cube.npy\n  label_path: gt.npy\n  patch_size: 3\n"
                   "  split: {kind: stratified, train_per_class: 30, val_fraction: 0.2}\n"
                   "model: {name: spectralformer, dim: 16, depth: 1, num_heads: 2, group_size: 2, stride: 2}\n"
                   "train: {epochs: 1, batch_size: 8, progress: never, threads: 1, num_workers: 2}\n"
                   "export: {png: false, envi: false}\n")
    return cfg


def _limit_open_files(n: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


@pytest.mark.parametrize("files", [20, 32, 64])
def test_training_with_workers_under_a_tiny_open_file_limit_finishes(tmp_path: Path, files: int) -> None:
    """Below what the workers need, tensors go by file name (no descriptor each): the run ends
    as without the limit. Before, a worker's batch was lost to EMFILE and the run hung."""
    cfg = _hsi_experiment(tmp_path)
    out = subprocess.run([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", str(tmp_path / "run")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=ENV, preexec_fn=_limit_open_files(files))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.strip() == "" and (tmp_path / "run" / "metrics.json").is_file()


def test_an_error_raised_in_a_loading_worker_keeps_its_own_message() -> None:
    """torch re-raises a worker's error with its traceback in the message; the one line is the
    worker's message (the oracle: what the worker raised)."""
    from torch._utils import ExceptionWrapper

    from sciformer.errors import DataError

    try:
        raise DataError("scene.npy: cannot read numpy file\n(OSError: [Errno 24] Too many open files)")
    except DataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(DataError) as info:
        wrapped.reraise()
    assert "Original Traceback" in info.value.args[0]
    assert str(info.value) == "scene.npy: cannot read numpy file (OSError: [Errno 24] Too many open files)"


@pytest.mark.parametrize(("message", "one_line"), [
    ("libtorch_cpu.so: failed to map segment from shared object", True),
    ("libopenblas.so.0: cannot allocate memory for thread-local data", True),
    ("No module named 'laspy'", False),
])
def test_a_library_that_cannot_be_mapped_is_out_of_memory(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                          message: str, one_line: bool) -> None:
    def failing(args):
        raise ImportError(message)

    monkeypatch.setitem(cli.COMMANDS, "report", failing)
    if one_line:
        assert cli.main(["report", "x"]) == 2
        assert _one_line(capsys).startswith("sciformer report: error: out of memory while loading a library")
    else:
        with pytest.raises(ImportError):
            cli.main(["report", "x"])


SHORT_WRITE = """
import errno, resource, signal, sys
import numpy as np
from sciformer.utils.atomic import atomic_write_with
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
try:
    atomic_write_with(sys.argv[1], lambda tmp: np.save(tmp, np.zeros(1 << 16)))
except OSError as exc:
    print(exc.errno in (errno.ENOSPC, errno.EFBIG), exc.filename == sys.argv[1], "disk full" in str(exc) or exc.errno == errno.EFBIG)
"""


def test_a_short_write_names_the_file_and_what_it_means(tmp_path: Path) -> None:
    """numpy reports a write cut short by a file-size limit or a full disk as '... requested and ... written'."""
    target = str(tmp_path / "map.npy")
    out = subprocess.run([sys.executable, "-c", SHORT_WRITE, target], capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]
    assert os.listdir(tmp_path) == []  # no temporary left


@pytest.mark.parametrize("name", ["a" * 255, "\u00e9" * 127 + "x", "p" * 240 + "_pred.npy"])
def test_a_file_of_the_longest_legal_name_is_written(tmp_path: Path, name: str) -> None:
    """The temporary beside it must be a legal name too (its name part is cut to fit)."""
    from sciformer.utils.atomic import atomic_write_text

    assert len(name.encode()) <= 255
    atomic_write_text(tmp_path / name, "ok")
    assert (tmp_path / name).read_text() == "ok" and os.listdir(tmp_path) == [name]


def test_a_loader_that_runs_out_of_open_files_prints_only_its_line(tmp_path: Path) -> None:
    """Four workers under a limit of 16 open files: torch's half-built loader iterator must not
    add 'Exception ignored ... Traceback' after the one line (or the run finishes)."""
    cfg = _hsi_experiment(tmp_path)
    text = cfg.read_text().replace("num_workers: 2", "num_workers: 4")
    cfg.write_text(text)
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "sciformer", "train", "-c", str(cfg), "-o", str(tmp_path / "run")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV, preexec_fn=_limit_open_files(16))
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-3000:]
    if out.returncode != 0:
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


LATE_IN_EVALUATE = """
import os, signal, sys, time
sys.argv[0] = "sciformer"  # the command is the process
from sciformer import cli
from sciformer.engine import evaluation
real = evaluation.format_table
def signalled_while_printing(*args, **kwargs):  # the set is written; the table is printed, then the lock released
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    return real(*args, **kwargs)
evaluation.format_table = signalled_while_printing
sys.exit(cli.main(["evaluate", "--checkpoint", sys.argv[1], "-o", sys.argv[2]]))
"""


def test_a_signal_once_the_evaluation_is_written_leaves_a_finished_command(tmp_path: Path) -> None:
    """The whole set is written: a SIGTERM then ends neither in exit 130 beside a complete set nor in a left lock."""
    cfg = _hsi_experiment(tmp_path)
    cfg.write_text(cfg.read_text().replace("num_workers: 2", "num_workers: 0"))
    trained = subprocess.run([sys.executable, "-m", "sciformer", "train", "-c", str(cfg), "-o", str(tmp_path / "run")],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert trained.returncode == 0, trained.stderr
    out = subprocess.run([sys.executable, "-c", LATE_IN_EVALUATE, str(tmp_path / "run"), str(tmp_path / "ev")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=ENV)
    assert out.returncode == 0 and out.stderr == "", (out.returncode, out.stderr)
    assert (tmp_path / "ev" / "metrics.json").is_file() and not (tmp_path / "ev" / ".evaluate.lock").exists()


@pytest.mark.parametrize("failure", ["python", "mapping", "system call"])
def test_memory_that_ran_out_is_one_line_whatever_raised_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                           failure: str) -> None:
    """Python's MemoryError, a refused mapping of the block cache (``empty_large``) and an
    ENOMEM from a system call all read as out of memory, with what to lower."""
    from sciformer.utils import block_cache

    def run(args):
        if failure == "python":
            raise MemoryError
        if failure == "mapping":
            return block_cache._mapped(1 << 60)  # 1 EiB: refused by the kernel
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setitem(cli.COMMANDS, "report", run)
    assert cli.main(["report", "x"]) == 2
    line = _one_line(capsys)
    assert line.startswith("sciformer report: error: out of memory") and line.endswith("patch size per sample"), line
    if failure == "mapping":
        assert "(an allocation of 1073741824.0 GiB failed)" in line, line
