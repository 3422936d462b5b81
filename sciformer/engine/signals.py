"""Signals: SIGINT/SIGTERM at any moment end a command with one line.

- While training steps run, :class:`StopFlag` turns the first signal into a flag checked
  after each step: the trainer writes ``last.pt`` and raises :class:`Interrupted` (exit 130).
  A second signal stops at once (``KeyboardInterrupt``).
- Before the first step and after the last (building the data, final evaluation),
  :func:`terminate_as_interrupt` makes SIGTERM behave as Ctrl-C, so the command line
  prints ``interrupted`` and exits 130 instead of dying silently.
- :func:`quiet_signals` ignores further signals while the process reports and exits, so a
  repeated Ctrl-C cannot print a traceback from exit handlers.
- :func:`end_process` ends the process after its exit handlers, without the interpreter's
  finalization (used by the command line after an interrupt, and by torchrun ranks).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from sciformer.utils.ranks import is_main_process


class Interrupted(KeyboardInterrupt):
    """Training stopped by SIGINT/SIGTERM after writing a checkpoint; the message says how to continue.

    A KeyboardInterrupt, not a :class:`SciformerError`: a script that skips bad configs with
    ``except SciformerError`` still stops on Ctrl-C. The command line prints the message and exits 130.
    """

    exit_code = 130

    def __str__(self) -> str:  # one line
        return " ".join(super().__str__().split())


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_PROCESS = False  # the command is the process (not main() called by a test or a script)
ENTRY_POINTS = ("sciformer", "__main__.py", "cli.py")  # sys.argv[0] when sciformer is the process


def command_is_process() -> bool:
    """Whether the running command is the process (``sciformer`` or ``python -m sciformer``),
    not ``cli.main()`` called by a test or a script, whose process must not be ended."""
    return os.path.basename(sys.argv[0]) in ENTRY_POINTS


def _in_import(frame: Any) -> bool:
    """Whether the interrupted code runs inside an import (``importlib._bootstrap`` frames)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_CLEANUPS: list[Callable[[], None]] = []  # what an exit without unwinding must still undo, innermost last


def on_abrupt_exit(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` if a signal ends the process at once (inside an import), until
    :func:`not_on_abrupt_exit`: for what outlives a block (a run folder's lock)."""
    _CLEANUPS.append(cleanup)


def not_on_abrupt_exit(cleanup: Callable[[], None]) -> None:
    """Undo :func:`on_abrupt_exit` (nothing where ``cleanup`` is not registered)."""
    with contextlib.suppress(ValueError):
        _CLEANUPS.remove(cleanup)


@contextlib.contextmanager
def undone_on_abrupt_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run ``cleanup`` too if a signal ends the process at once (inside an import) while the
    block runs: there the block's own ``finally`` never runs."""
    on_abrupt_exit(cleanup)
    try:
        yield
    finally:
        not_on_abrupt_exit(cleanup)


def _raise_interrupt(signum: int, frame: Any) -> None:
    if _PROCESS and _in_import(frame):
        # Raised here, the exception can cross a C++ extension's initialisation (pybind11
        # calling back into Python while ``import torch.distributed`` runs), which aborts the
        # process (status -6). End now, with the one line, after the registered cleanups
        # (an evaluation's lock and unfinished folders).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        for cleanup in reversed(_CLEANUPS):
            with contextlib.suppress(BaseException):
                cleanup()
        if is_main_process():
            os.write(2, b"sciformer: interrupted\n")
        os._exit(130)
    raise KeyboardInterrupt


def terminate_as_interrupt(process: bool = False) -> None:
    """SIGTERM raises KeyboardInterrupt like SIGINT (main thread only).

    ``process``: the command is the whole process; then SIGINT gets the same handler, and a
    signal that lands inside an import ends the process at once with exit 130.
    """
    global _PROCESS
    if _main_thread():
        _PROCESS = _PROCESS or process
        signal.signal(signal.SIGTERM, _raise_interrupt)
        if process:
            signal.signal(signal.SIGINT, _raise_interrupt)


def outputs_complete() -> None:
    """The command's outputs are all written: when the command is the process, a signal from
    here on is ignored, so it cannot end a finished command as 'interrupted' (exit 130)."""
    if _PROCESS:
        quiet_signals()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM wait until the block ends (main thread): a few renames that must all happen
    or none; a signal that came meanwhile is raised as KeyboardInterrupt after the block."""
    if not _main_thread():
        yield
        return
    came: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, frame: came.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if any(saved[sig] not in (signal.SIG_IGN, None) for sig in came):  # a signal that was not ignored before
        raise KeyboardInterrupt


def quiet_signals() -> None:
    """Ignore SIGINT/SIGTERM from now on (the process is reporting and exiting)."""
    if _main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


class StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between steps; a second signal stops at once."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if _main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # second signal: stop at once
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def end_process(code: int) -> NoReturn:
    """End the process with ``code`` after what a normal exit runs (the exit handlers: logging
    shutdown, temporary folders; flushed output), without the interpreter's finalization."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
