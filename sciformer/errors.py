"""Errors a user can act on.

Every error raised for bad input (a config key, a file, an argument) is a
:class:`SciformerError`. The CLI prints its message on one line and exits with
code 2, without a traceback. Messages name the file, key or argument and what
was expected.
"""

from __future__ import annotations

import errno
import re


class SciformerError(Exception):
    """Base class of user-facing errors (bad config, bad file, bad argument)."""

    exit_code = 2

    def __str__(self) -> str:  # always one line
        text = super().__str__()
        raised_as = f"{type(self).__module__}.{type(self).__qualname__}: "
        if "Original Traceback" in text and raised_as in text:  # re-raised by torch from a loading worker: the worker's message
            text = text.rsplit(raised_as, 1)[1]
        return " ".join(text.split())


class ConfigError(SciformerError, ValueError):
    """An experiment config is invalid: names the dotted key and what was expected."""


class DataError(SciformerError, ValueError):
    """An input file or array is unreadable or inconsistent: names the file or key."""


class LabelsMissing(DataError):
    """A scene has no label map, or none labelled, where its split needs one."""


class CheckpointError(SciformerError, ValueError):
    """A checkpoint is missing, truncated, foreign or unsafe."""


# torch reports a failed allocation as a RuntimeError (torch.OutOfMemoryError on a GPU)
_ALLOCATION_FAILED = ("can't allocate memory", "not enough memory", "out of memory", "Cannot allocate memory")
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "[/gloo/", "Gloo connectFullMesh", "NCCL communicator was aborted",
              "ProcessGroupGloo", "ProcessGroupNCCL")


def _bytes_text(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} bytes"


def resource_failure(exc: BaseException) -> str | None:
    """The one line for a machine resource that ran out (memory, disk, file size, open files),
    or None for an error that is a bug (a traceback helps)."""
    if isinstance(exc, ImportError):  # a library that cannot be mapped under a memory limit (ulimit -v)
        low = str(exc).lower()
        return f"out of memory while loading a library ({str(exc)[:200]})" if "map segment" in low or "allocate memory" in low else None
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM and not exc.filename):
        return _out_of_memory(str(exc))  # Python's, a mapping's or a system call's; Python's own has no text
    if isinstance(exc, OSError):
        hint = f"; {_open_files()}: raise it, or lower train.num_workers" if exc.errno == errno.EMFILE else ""
        return f"{exc.strerror or exc}" + (f": '{exc.filename}'" if exc.filename else "") + hint
    text = str(exc)
    if text.startswith("DataLoader worker"):  # a worker killed (out of memory) or stopped (out of open files)
        return (f"{' '.join(text.split())}; a data-loading process ended without its batch (killed for memory, or out of "
                f"open files: {_open_files()}); try fewer train.num_workers (0 loads in this process)")
    if any(mark in text for mark in _ALLOCATION_FAILED):
        return _out_of_memory(text)
    if any(mark in text for mark in _PEER_LOST):  # gloo / NCCL: another process of a torchrun launch ended
        first = " ".join(text.split())[:160]
        return (f"another process of this run stopped ({first}); its error, if any, is in torchrun's summary above; "
                "the last checkpoint stays: continue with the same torchrun command and --resume RUN")
    return None


def _out_of_memory(text: str) -> str:
    """The line for memory that ran out: the size of the failed allocation where ``text``
    names it, and what to lower."""
    tried = re.search(r"[Tt]ried to allocate ([0-9.]+) ?([A-Za-z]*)", text)
    size = ""
    if tried:
        size = _bytes_text(float(tried[1])) if tried[2] in ("", "bytes") else f"{tried[1]} {tried[2]}"
    return "out of memory" + (f" (an allocation of {size} failed)" if size else "") + \
        "; lower the batch size or the points / patch size per sample"


def _open_files() -> str:
    try:
        import resource
    except ImportError:  # Windows
        return "the open-file limit"
    return f"the open-file limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} (ulimit -n)"
