"""Runs started without --output-dir in the same second: ``runs/<name>-<time>`` goes to the first,
``-2``, ``-3``, ... to the others, each folder created by one process (the second used to stop on
"is being written by another sciformer process" or "already holds a run")."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from synthetic import write_hsi_experiment

from sciformer.engine.folder_lock import create_free_folder

STAMP = "20260101-000000"
# the command line with the clock stopped at one second: every default folder gets the same name
FROZEN = f"""
import runpy, sys, time
time.strftime = lambda fmt, t=None: "{STAMP}"
sys.argv[0] = "sciformer"
runpy.run_module("sciformer", run_name="__main__", alter_sys=True)
"""


def _scene(folder: Path) -> Path:
    return write_hsi_experiment(folder, train="epochs: 1, batch_size: 16, max_steps_per_epoch: 2, progress: never, threads: 1",
                                extra="export: {png: false, envi: false}\n")


def test_two_processes_started_in_the_same_second_each_get_a_folder(tmp_path: Path) -> None:
    cfg = _scene(tmp_path)
    (tmp_path / "frozen.py").write_text(FROZEN)
    repo = Path(__file__).resolve().parents[2]  # this checkout's sciformer, not an installed one
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    procs = [subprocess.Popen([sys.executable, "-m", "frozen", "train", "-c", str(cfg), f"optimizer.lr={lr}"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for lr in ("0.001", "0.002")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert folders == [f"tiny_hsi-{STAMP}", f"tiny_hsi-{STAMP}-2"]
    lrs = sorted(next(ln for ln in (tmp_path / "runs" / f / "config.yaml").read_text().splitlines() if "lr:" in ln).split()[-1] for f in folders)
    assert lrs == ["0.001", "0.002"]  # one run per folder
    assert all((tmp_path / "runs" / f / "metrics.json").is_file() for f in folders)
    named = sorted(ln.split("run folder: ", 1)[1] for out, _ in outs for ln in out.splitlines() if ln.startswith("run folder: "))
    assert named == [f"runs/tiny_hsi-{STAMP}", f"runs/tiny_hsi-{STAMP}-2"]  # each process reports the folder it took


def test_a_later_run_in_the_same_second_takes_the_next_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finished runs, a leftover folder or a file of that name are passed over; pre-training too."""
    import sciformer
    from sciformer.engine.pretrain import PretrainSettings, pretrain_config

    cfg = _scene(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, t=None: STAMP)
    first = sciformer.train(cfg).run_dir
    (tmp_path / "runs" / f"tiny_hsi-{STAMP}-2").write_text("someone's file")
    second = sciformer.train(cfg).run_dir
    assert (first, second) == (Path("runs") / f"tiny_hsi-{STAMP}", Path("runs") / f"tiny_hsi-{STAMP}-3")
    assert (tmp_path / "runs" / f"tiny_hsi-{STAMP}-2").read_text() == "someone's file"
    settings = PretrainSettings(epochs=1, band_group=3)
    folders = [pretrain_config(cfg, [], settings) for _ in range(2)]
    assert folders == [Path("runs") / f"tiny_hsi-pretrain-{STAMP}", Path("runs") / f"tiny_hsi-pretrain-{STAMP}-2"]
    assert all((tmp_path / f / "pretrain.json").is_file() for f in folders)


def test_racing_threads_create_distinct_folders(tmp_path: Path) -> None:
    start, made, errors = threading.Barrier(8), [], []

    def claim() -> None:
        start.wait()
        try:
            made.append(create_free_folder(tmp_path / "runs" / "x"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(p.name for p in made) == sorted(["x", *(f"x-{k}" for k in range(2, 9))])
    (tmp_path / "file").write_text("")
    with pytest.raises(Exception, match="a file .* is in the way"):
        create_free_folder(tmp_path / "file" / "run")
