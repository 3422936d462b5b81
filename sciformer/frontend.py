"""Which front end a call came through: the command line or the Python API (:mod:`sciformer.api`).

A message names what its reader typed: ``--tta-rotations 4`` on the command line,
``rotations=4`` from Python. The API's entry points run inside :func:`python_api`;
messages format an option with :func:`option` and a way to continue a run with
:func:`resume_hint`, never a command-line flag spelled out for both.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from sciformer.errors import ConfigError

_PYTHON: ContextVar[bool] = ContextVar("sciformer_python_api", default=False)
_RENAMES: ContextVar[tuple[tuple[re.Pattern[str], str], ...]] = ContextVar("sciformer_renames", default=())
_STREAMS_LOCK = threading.Lock()
_streams_users = 0
_NO_VALUE = object()

KEYWORDS = {  # command-line flag -> keyword of the Python API
    "--config": "config", "--output-dir": "output_dir", "--resume": "resume", "--init-from": "init_from", "--seed": "seed",
    "--epochs": "epochs", "--mask-ratio": "mask_ratio", "--band-group": "band_group", "--pixel-ratio": "pixel_ratio",
    "--pixels": "pixels", "--overlap": "overlap", "--tta-rotations": "rotations", "--tta-flip": "flip", "--votes": "votes",
    "--columns": "columns", "--category": "category", "--labels": "labels", "--wavelengths": "wavelengths",
    "--allow-band-mismatch": "allow_band_mismatch", "--match-frame": "match_frame", "--batch-size": "batch_size", "--device": "device",
}


@contextlib.contextmanager
def python_api() -> Iterator[None]:
    """Messages raised in the block name the Python keywords (``rotations=``), not the flags."""
    token = _PYTHON.set(True)
    try:
        yield
    finally:
        _PYTHON.reset(token)


def from_python() -> bool:
    """Whether the running call came through the Python API."""
    return _PYTHON.get()


def option(flag: str, value: object = _NO_VALUE, *, quoted: bool = False) -> str:
    """``--flag`` or ``--flag VALUE`` (``--flag 'VALUE'`` when ``quoted``) on the command line;
    ``keyword=`` or ``keyword=VALUE`` from Python."""
    keyword = KEYWORDS.get(flag)
    if keyword is None or not from_python():
        return flag if value is _NO_VALUE else f"{flag} '{value}'" if quoted else f"{flag} {value}"
    if value is _NO_VALUE:
        return f"{keyword}="
    return f"{keyword}={str(value)!r}" if isinstance(value, (str, os.PathLike)) else f"{keyword}={value}"


def resume_hint(run_dir: str | Path, world_size: int = 1) -> str:
    """How to continue ``run_dir`` as it ran: on ``world_size`` processes under torchrun."""
    if world_size > 1:
        return f"torchrun --nproc-per-node {world_size} -m sciformer train --resume {run_dir} (the same torchrun options as the run)"
    return f"sciformer.train(resume={str(run_dir)!r})" if from_python() else f"sciformer train --resume {run_dir}"


def init_from_command(source: str | Path) -> str:
    """How to start a new run from the weights in ``source`` (a run folder or checkpoint)."""
    if from_python():
        return f"sciformer.train(CONFIG, init_from={str(source)!r})"
    return f"sciformer train -c CONFIG --init-from {source}"


def check_paths(call: str, **paths: object) -> None:
    """A one-line ConfigError naming the keyword of a path argument that is neither a path (str, os.PathLike) nor None."""
    for keyword, value in paths.items():
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"{call}: {keyword}= must be a path (a str or os.PathLike), got {value!r:.80}")


class _RenamingStream:
    """A text stream that writes through ``inner`` with the running context's renames applied."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        for pattern, new in _RENAMES.get():
            text = pattern.sub(new, text)
        return self.inner.write(text)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@contextlib.contextmanager
def printed_as(renames: dict[str, str]) -> Iterator[None]:
    """Lines printed in the block (stdout, stderr: notes, scores) name what the caller passed, not
    the temporary file an array was written to: each key (a path, or a bare file name, matched as a
    whole name) replaced by its value. Per context, so threads predicting at once keep their own."""
    global _streams_users
    patterns = tuple((re.compile(r"(?<![\w.-])" + re.escape(old) + r"(?![\w-])"), new.replace("\\", "\\\\"))
                     for old, new in sorted(renames.items(), key=lambda kv: -len(kv[0])))  # a full path before its name
    token = _RENAMES.set(_RENAMES.get() + patterns)
    with _STREAMS_LOCK:
        if _streams_users == 0:  # no stream at all (None, as under pythonw) stays none
            sys.stdout, sys.stderr = (None if s is None else _RenamingStream(s) for s in (sys.stdout, sys.stderr))
        _streams_users += 1
    try:
        yield
    finally:
        _RENAMES.reset(token)
        with _STREAMS_LOCK:
            _streams_users -= 1
            if _streams_users == 0:
                for name in ("stdout", "stderr"):
                    stream = getattr(sys, name)
                    if isinstance(stream, _RenamingStream):  # replaced by the caller meanwhile: theirs stays
                        setattr(sys, name, stream.inner)


_PACKAGE = str(Path(__file__).resolve().parent)


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """On the command line, a warning sciformer raises prints as one ``WARNING: ...`` line on stderr
    (Python's default adds the file, line number, category and a second line of source); warnings
    from other packages keep their usual form."""
    import warnings

    default = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: object = None,
             line: str | None = None) -> None:
        if not str(Path(filename).resolve()).startswith(_PACKAGE):
            default(message, category, filename, lineno, file, line)  # type: ignore[arg-type]
            return
        text = " ".join(str(message).split("\n"))
        print(text if text.startswith(("WARNING:", "note:")) else f"WARNING: {text}", file=sys.stderr if file is None else file)  # type: ignore[call-overload]

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = default
