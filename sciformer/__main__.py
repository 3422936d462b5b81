"""``python -m sciformer`` runs the command line.

SIGTERM is turned into KeyboardInterrupt before the (slow) imports, so a signal at any
moment ends the command with one line and exit code 130.
"""

import os
import signal
import sys


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, _interrupt)
try:
    from sciformer.cli import main

    code = main()  # handles signals from its first line on; this covers the moment before it
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("sciformer: interrupted", file=sys.stderr, flush=True)
    os._exit(130)  # not sys.exit: CPython may end by SIGINT after an interrupted import (see cli._interrupted_exit)
sys.exit(code)
