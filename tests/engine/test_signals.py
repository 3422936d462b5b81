"""A signal inside an import ends a command-line process at once (exit 130, one line), since
a KeyboardInterrupt raised there can cross a C++ extension's initialisation and abort the
process; outside imports, and when main() is called in-process, it stays a KeyboardInterrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CODE = """
import os, signal, sys
sys.path.insert(0, {folder!r})
from sciformer.engine.signals import terminate_as_interrupt
terminate_as_interrupt(process={process})
try:
    import sends_sigterm_on_import  # its top level signals this process
except KeyboardInterrupt:
    print("caught KeyboardInterrupt")
    sys.exit(3)
print("not interrupted")
"""


def run(tmp_path: Path, process: bool) -> subprocess.CompletedProcess:
    (tmp_path / "sends_sigterm_on_import.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n")
    code = CODE.format(folder=str(tmp_path), process=process)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_signal_inside_an_import_ends_the_process_with_one_line(tmp_path: Path) -> None:
    done = run(tmp_path, process=True)
    assert done.returncode == 130, done
    assert done.stderr.strip() == "sciformer: interrupted" and done.stdout == ""


def test_in_process_callers_still_get_a_keyboard_interrupt(tmp_path: Path) -> None:
    done = run(tmp_path, process=False)
    assert done.returncode == 3 and "caught KeyboardInterrupt" in done.stdout, done


LATE_SIGNAL = """
import atexit, os, signal, sys, threading, time
sys.argv[0] = "sciformer"  # the command is the process
from sciformer import cli

def finished(args):
    threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGTERM)), daemon=True).start()
    return 0

atexit.register(time.sleep, 1.5)  # the signal lands while the process exits
cli.COMMANDS["report"] = finished
sys.exit(cli.main(["report", "x"]))
"""


def test_a_signal_after_the_command_finished_leaves_its_success() -> None:
    """Everything is written: a SIGTERM while the process exits must not turn exit 0 into a kill or a traceback."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", LATE_SIGNAL], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0 and out.stderr == "", (out.returncode, out.stderr)


IMPORT_SIGNAL = """
import sys
sys.path.insert(0, {folder!r})
sys.argv[0] = "sciformer"  # the command is the process
from sciformer import cli
from sciformer.engine import builders

real = builders.build_task
def build_task(exp):  # after the run folder is locked: a module imported while building the data signals this process
    import sends_sigint_on_import
    return real(exp)
builders.build_task = build_task
sys.exit(cli.main({argv!r}))
"""


def test_a_signal_inside_an_import_after_the_lock_leaves_no_run_folder(tmp_path: Path) -> None:
    """Ctrl-C in a run's first seconds lands inside an import and ends the process at once: the run
    folder's lock is undone too, so neither the folder nor the folders created above it stay."""
    from synthetic import write_hsi_experiment

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "sends_sigint_on_import.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
    cfg = write_hsi_experiment(tmp_path)
    for command, extra in (("train", []), ("pretrain", ["--epochs", "1"])):
        top = tmp_path / f"top_{command}"
        argv = [command, "-c", str(cfg), "-o", str(top / "a" / "run"), *extra]
        done = subprocess.run([sys.executable, "-c", IMPORT_SIGNAL.format(folder=str(tmp_path), argv=argv)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
        assert done.returncode == 130 and done.stderr.strip() == "sciformer: interrupted", (command, done)
        assert not top.exists(), (command, sorted(str(p.relative_to(tmp_path)) for p in top.rglob("*")))


def test_a_signal_while_the_lock_is_taken_leaves_no_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C between creating the folder and holding its lock waits until the lock can undo them."""
    from sciformer.engine import runfolder

    real = runfolder._open_lock

    def open_lock(run_dir: Path):
        handle = real(run_dir)
        os.kill(os.getpid(), signal.SIGINT)  # the folder and .lock exist, the RunLock does not yet
        return handle

    monkeypatch.setattr(runfolder, "_open_lock", open_lock)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            runfolder.lock_run_dir(tmp_path / "top" / "run")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not (tmp_path / "top").exists()


def test_an_early_signal_is_reported_by_rank_zero_only() -> None:
    """Under torchrun every rank gets Ctrl-C; the 'interrupted' line of python -m sciformer (before
    any of sciformer's modules are imported) is printed by rank 0 alone, as every later line is.
    Signals are sent ever later until one lands in that window (exit 130)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "1", "WORLD_SIZE": "2"}
    caught = []
    for step in range(40):
        proc = subprocess.Popen([sys.executable, "-m", "sciformer", "info"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        time.sleep(0.01 * step)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert b"interrupted" not in err and b"Traceback" not in err, err
        caught.append(proc.returncode)
        if proc.returncode == 130:
            break
    assert 130 in caught, caught  # a signal landed while python -m sciformer's own handler held
