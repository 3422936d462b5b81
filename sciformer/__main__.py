"""``python -m sciformer`` runs the command line.

SIGINT and SIGTERM end the process at once with one line and exit code 130 until main()
takes over signals (before it, nothing of a run has been written).
"""

import os
import signal
import sys


def _interrupt(signum: int, frame: object) -> None:
    """Before main() runs nothing has been written: end at once (raising inside an import can
    cross a C++ extension's initialisation, which aborts the process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _reports():
        os.write(2, b"sciformer: interrupted\n")
    os._exit(130)


def _reports() -> bool:
    """Whether this process prints the line: under torchrun only rank 0 does (as utils.ranks.is_main_process,
    not imported here: a signal may land before any of sciformer is)."""
    return os.environ.get("RANK", "0") in ("", "0")


signal.signal(signal.SIGTERM, _interrupt)
signal.signal(signal.SIGINT, _interrupt)
try:
    from sciformer.cli import main

    code = main()  # handles signals from its first line on; this covers the moment before it
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _reports():
        print("sciformer: interrupted", file=sys.stderr, flush=True)
    os._exit(130)  # not sys.exit: CPython may end by SIGINT after an interrupted import (see cli._interrupted_exit)
sys.exit(code)
