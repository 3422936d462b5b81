"""Names a user's files or folders can have, drawn into figures and printed as themselves.

A scene, run or class name can hold bytes that are not UTF-8 (Python keeps them as lone
surrogates), control characters, or ``$`` signs that matplotlib would parse as mathtext
(``scan$_$1`` raises). :func:`drawable` turns such a name into text every font and
matplotlib can draw, keeping it recognisable::

    drawable("te\udcff$_$")  # -> 'te\\xff\\$_\\$' (drawn as te\xff$_$)
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["drawable", "print_names_as_bytes", "utf8_safe"]


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
