"""Atomic file writes, the one writer of run-folder and output files.

Write to a temporary name in the same folder, flush, fsync, give it the mode a plain
``open(path, "w")`` would (the existing file's mode, else ``0o666`` less the umask,
not ``mkstemp``'s 0600), rename over ``path``, fsync the folder. A crash or kill at
any moment leaves either the previous file or the new one, never a truncated file.
:func:`atomic_folder` does the same for a folder of files (preprocessing caches).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from sciformer.utils.text import utf8_safe


def current_umask() -> int:
    """The process umask (read from ``/proc`` where possible, so it is never changed)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_mode(path: str | os.PathLike[str]) -> int:
    """Permission bits a plain ``open(path, "w")`` leaves: the existing file's, else 0o666 & ~umask."""
    with contextlib.suppress(FileNotFoundError):
        return stat.S_IMODE(os.stat(path).st_mode)
    return 0o666 & ~current_umask()


# The temporary names :func:`_replacing` gives (mkstemp: 8 random characters from [a-z0-9_]).
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?")


def temporary_of(name: str) -> str | None:
    """The file a temporary named ``name`` was replacing (``.<name>.<random>.tmp<suffix>``), or None."""
    match = _TEMPORARY.fullmatch(name)
    return None if match is None else match["name"]


NAME_MAX = 255  # bytes in one file name (Linux, macOS)


def _fitting(name: str, limit: int) -> str:
    """``name`` cut to at most ``limit`` UTF-8 bytes (a temporary's name stays legal where the final one is)."""
    raw = name.encode("utf-8")
    return name if len(raw) <= limit else raw[:max(limit, 1)].decode("utf-8", "ignore")


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[tuple[int, Path]]:
    """A temporary sibling ``(fd, tmp)`` of ``path`` (``.<name>.<random>.tmp<suffix>``, the final
    suffix kept for suffix-sensitive writers). When the block succeeds the file gets the
    plain-open mode, is fsynced and renamed over ``path``; otherwise it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # lower case: np.save / np.savez given "x.NPY" would append ".npy" and write elsewhere
    # a name of bytes that are not UTF-8 gets a UTF-8 temporary: writers such as GDAL take UTF-8 names only
    suffix = f".tmp{utf8_safe(path.suffix.lower())}"
    stem = _fitting(utf8_safe(path.name), NAME_MAX - 10 - len(os.fsencode(suffix)))  # '.', '.', 8 random
    fd, name = tempfile.mkstemp(prefix=f".{stem}.", suffix=suffix, dir=path.parent)
    tmp = Path(name)
    try:
        yield fd, tmp
        os.chmod(tmp, open_mode(path))
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: object) -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; rename it over ``path`` on success."""
    with _replacing(Path(path)) as (fd, _), os.fdopen(fd, mode, **kwargs) as handle:  # type: ignore[call-overload]
        yield handle


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``path``; a file name Python could not decode
    (held as lone surrogates) is written back as its own bytes."""
    with atomic_open(path, "w", encoding="utf-8", errors="surrogateescape") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], payload: bytes) -> None:
    """Atomically write ``payload`` to ``path``."""
    with atomic_open(path, "wb") as handle:
        handle.write(payload)


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Atomically produce ``path`` with a writer that takes a file path (np.save, torch.save, ...).

    The temporary name keeps the final suffix so suffix-sensitive writers behave.
    """
    with _replacing(Path(path)) as (fd, tmp):
        os.close(fd)
        try:
            writer(tmp)
        except OSError as exc:
            if exc.errno is None:  # numpy's short write ("4000 requested and 112 written"): say what it means
                raise OSError(errno.ENOSPC, f"writing stopped short ({exc}): is the disk full or a file-size limit reached?",
                              str(path)) from None
            raise


# temporary folders of atomic_folder: ``.<name>.sciformer-stage-<8 random>`` (being filled) and
# ``.<name>.sciformer-old-<8 hex>`` (the folder it replaces, until removed)
STAGE_MARK, OLD_MARK = ".sciformer-stage-", ".sciformer-old-"


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str], *, replace: bool = False) -> Iterator[Path]:
    """A temporary sibling folder to fill; on success it becomes ``path`` by the same rules.

    Its files are fsynced, the folder gets the mode a plain ``mkdir`` leaves
    (``0o777`` less the umask, not ``mkdtemp``'s 0700) and is renamed to ``path``; on
    failure it is removed. ``path`` must not exist or be empty, unless ``replace``: then
    whatever ``path`` names (a folder of earlier outputs; a link is replaced, never followed)
    is moved aside, the new folder renamed in, and the old one removed, so ``path`` holds
    the whole old set until the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}{STAGE_MARK}", dir=path.parent))
    try:
        yield tmp
        for child in tmp.iterdir():
            if child.is_file():
                with open(child, "rb+") as handle:
                    os.fsync(handle.fileno())
        os.chmod(tmp, 0o777 & ~current_umask())
        _fsync_dir(tmp)
        if replace and os.path.lexists(path):
            _swap_in(tmp, path)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(new: Path, path: Path) -> None:
    """Rename folder ``new`` to ``path``, which exists: the old entry is renamed aside first (and
    put back if the rename fails), then removed (a link itself, never its target)."""
    aside = path.parent / f".{path.name}{OLD_MARK}{secrets.token_hex(4)}"
    os.rename(path, aside)
    try:
        os.replace(new, path)
    except BaseException:
        os.rename(aside, path)
        raise
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            aside.unlink()


def stale_stages(path: Path) -> list[Path]:
    """Temporary folders of :func:`atomic_folder` for ``path`` that an interrupted process left
    beside it (real folders named ``.<name>.sciformer-stage-<8 random>`` or
    ``.<name>.sciformer-old-<8 hex>``); any other name is someone else's."""
    pattern = re.compile(re.escape(f".{path.name}") + r"\.sciformer-(stage|old)-[a-z0-9_]{8}")
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return []
    return [p for p in entries if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
