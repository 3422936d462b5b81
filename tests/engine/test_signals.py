"""A signal inside an import ends a command-line process at once (exit 130, one line), since
a KeyboardInterrupt raised there can cross a C++ extension's initialisation and abort the
process; outside imports, and when main() is called in-process, it stays a KeyboardInterrupt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
