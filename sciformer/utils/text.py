"""Names a user's files or folders can have, drawn into figures and printed as themselves.

A scene, run or class name can hold bytes that are not UTF-8 (Python keeps them as lone
surrogates), control characters, or ``$`` signs that matplotlib would parse as mathtext
(``scan$_$1`` raises). :func:`drawable` turns such a name into text every font and
matplotlib can draw, keeping it recognisable::

    drawable("te\udcff$_$")  # -> 'te\\xff\\$_\\$' (drawn as te\xff$_$)
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

__all__ = ["drawable", "outlive_closed_stdout", "print_names_as_bytes", "utf8_safe"]


def drawable(text: object) -> str:
    """``text`` as matplotlib draws it literally: undecodable bytes as ``\\xNN``, characters
    that are not printable (tab, newline, NUL, direction marks) as their escapes, ``$`` escaped."""
    value = str(text)
    try:
        raw = value.encode("utf-8", "surrogateescape")  # the bytes of a path Python could not decode
    except UnicodeEncodeError:  # surrogates of another origin
        raw = value.encode("utf-8", "surrogatepass")
    decoded = raw.decode("utf-8", "backslashreplace")
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in decoded)
    return shown.replace("$", r"\$")


def utf8_safe(name: str) -> str:
    """``name`` with each byte that is not UTF-8 (a lone surrogate) as ``_``: equal to ``name``
    exactly when a UTF-8-only consumer (GDAL) can take it."""
    return "".join("_" if "\ud800" <= ch <= "\udfff" else ch for ch in name)


def print_names_as_bytes() -> None:
    """Print a file name Python could not decode (lone surrogates) as its own bytes, as ``ls``
    does, where a strict UTF-8 locale would raise instead (stdout and stderr)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict":
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]


class _OutlivingStdout:
    """stdout that outlives its reader: once the pipe is closed (``sciformer train ... | head``),
    further output goes to /dev/null instead of ending the run with "Broken pipe" (train.log
    keeps every line). Everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the exit-time flush then finds /dev/null, not the pipe
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        self._stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def outlive_closed_stdout() -> None:
    """Make ``sys.stdout`` survive its reader going away (see :class:`_OutlivingStdout`); once per process."""
    if sys.stdout is None:  # started with stdout closed (>&-): output goes nowhere, the run goes on
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    elif not isinstance(sys.stdout, _OutlivingStdout):
        sys.stdout = _OutlivingStdout(sys.stdout)

