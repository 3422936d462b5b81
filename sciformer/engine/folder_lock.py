"""One writer per output folder: an exclusive ``flock`` on a lock file inside it.

:func:`open_folder_lock` creates the folder (and the folders above it) and locks
``<folder>/<name>`` for this process; the kernel drops the lock when the process ends, even
on SIGKILL. A second process is refused with one line naming the holder's pid.

A holder may remove its lock file when it is done (:func:`drop_folder_lock`: unlinked while
still locked, then closed). Another process may have opened that file just before: its
``flock`` then succeeds on a file no longer in the folder, while a third process creates and
locks a new one. So a lock counts only if the path still names the locked file (same device
and inode) once it is held; otherwise the file is closed and opened again.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

from sciformer.errors import SciformerError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the folder checks still apply
    fcntl = None  # type: ignore[assignment]

ATTEMPTS = 16  # opens of a lock file that others unlink meanwhile, before giving up


class FolderLockError(SciformerError):
    """The output folder cannot be created, or another process is writing it."""


def open_folder_lock(folder: Path, name: str = ".lock", *, flag: str = "output folder") -> IO[str]:
    """Create ``folder`` and lock ``folder/name`` for this process; returns the open lock file
    (it holds this process's pid). Never through a symlink, never waiting on a FIFO; a lock
    file that is not a regular file or holds something else than a pid (a user's file of that
    name), a path through a file, no permission, or a lock held by another process is a
    one-line :class:`FolderLockError` (``flag`` names the folder's role or option)."""
    for _ in range(ATTEMPTS):
        handle = _open(folder, name, flag)
        if handle is None:
            continue  # the folder was removed between creating it and opening the file: again
        if fcntl is None:
            return handle
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read(32).strip() or "?"
            handle.close()
            raise FolderLockError(f"{flag} {folder} is being written by another sciformer process (pid {owner}); "
                                  "wait for it or choose another folder") from None
        if _names(folder / name, handle):
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            return handle
        handle.close()  # its holder removed it after we opened it: that lock is over, take the new one
    raise FolderLockError(f"{flag} {folder}: its lock file {name} keeps being replaced by other processes; try again")


def drop_folder_lock(folder: Path, name: str, handle: IO[str]) -> None:
    """Remove the lock file if it is still this lock's (while locked), then unlock; an empty file
    that was there before (someone's, or one a killed process left) is emptied again, not removed."""
    try:
        if getattr(handle, "sciformer_found_empty", False):
            handle.truncate(0)
        elif _names(folder / name, handle):
            os.unlink(folder / name)
    except OSError:
        pass
    finally:
        handle.close()


MAX_NUMBERED = 1000  # folders of one default name (one name and second)


def create_free_folder(folder: Path) -> Path:
    """The first of ``folder``, ``folder-2``, ``folder-3``, ... that this call creates (empty), and
    the folders above it: each is made by one ``mkdir`` that fails where the name exists, so
    processes that pick the same name at once each get a folder of their own."""
    for number in range(1, MAX_NUMBERED + 1):
        candidate = folder if number == 1 else folder.with_name(f"{folder.name}-{number}")
        for _ in range(ATTEMPTS):  # the folder above removed meanwhile (a run that failed at once): made again
            try:
                folder.parent.mkdir(parents=True, exist_ok=True)
                candidate.mkdir()
                return candidate
            except FileExistsError:
                if not folder.parent.is_dir():
                    raise FolderLockError(f"run folder {candidate}: a file (or a file above it) is in the way; expected a folder") from None
                break  # taken: the next number
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise FolderLockError(f"run folder {candidate}: cannot be created ({exc.strerror or exc})") from None
        else:
            raise FolderLockError(f"run folder {candidate}: the folder above it keeps being removed; try again")
    raise FolderLockError(f"run folders {folder} to {folder}-{MAX_NUMBERED} all exist; name the run folder with --output-dir")


def missing_folders(folder: Path) -> tuple[Path, ...]:
    """``folder`` and the folders above it that do not exist yet, innermost first."""
    absolute = Path(os.path.abspath(folder))
    return tuple(p for p in (absolute, *absolute.parents) if not p.exists())


def remove_empty_folders(folders: tuple[Path, ...]) -> None:
    """Remove ``folders`` innermost first, stopping at the first that is not empty (someone
    wrote there) or cannot be removed."""
    try:
        for folder in folders:
            folder.rmdir()
    except OSError:
        pass


PID_BYTES = 32  # a lock file holds a process id and a newline


def holds_pid_only(fd: int) -> bool:
    """Whether the open file is empty (a lock being created) or holds only a process id."""
    data = os.pread(fd, PID_BYTES + 1, 0)
    return not data or (len(data) <= PID_BYTES and data.strip().isdigit())


def lock_holder(folder: Path, name: str = ".lock") -> int | None:
    """The pid of the live process of this machine that holds ``folder/name`` locked, or None (no
    lock file, one a killed process left, a pid no process has now). Nothing is locked, written or
    waited on: the pid the file records must be alive and, where the kernel lists its locks
    (``/proc/locks``), hold a lock on that file (a reused pid does not)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(folder / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        text = os.pread(fd, PID_BYTES, 0).strip() if stat.S_ISREG(st.st_mode) and holds_pid_only(fd) else b""
    finally:
        os.close(fd)
    pid = int(text) if text else 0
    if pid <= 0 or not _alive(pid):
        return None
    held = _kernel_flocks()
    return pid if held is None or (pid, st.st_ino) in held else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True


def _kernel_flocks() -> set[tuple[int, int]] | None:
    """(pid, inode) of every flock held on this machine (Linux ``/proc/locks``); None where not listed."""
    try:
        lines = Path("/proc/locks").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return None
    out = set()
    for line in lines:
        parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter has "->" after the number)
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[4].isdigit():
            inode = parts[5].rsplit(":", 1)[-1]
            if inode.isdigit():
                out.add((int(parts[4]), int(inode)))
    return out


def _names(path: Path, handle: IO[str]) -> bool:
    """Whether ``path`` names the file open as ``handle`` (same device and inode)."""
    try:
        on_disk = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(handle.fileno())
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _open(folder: Path, name: str, flag: str) -> IO[str] | None:
    """The lock file opened (created if absent); None where the folder went meanwhile."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:  # never through a link, never waiting on a FIFO
            fd, created = os.open(folder / name, flags | os.O_EXCL, 0o666), True
        except FileExistsError:
            try:
                fd, created = os.open(folder / name, flags, 0o666), False
            except FileNotFoundError:
                return None
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or not holds_pid_only(fd):  # a hard link: another name of someone's file
            os.close(fd)
            raise FolderLockError(f"{flag} {folder}: its {name} is not a lock file of sciformer's (a file of its own holding a pid); "
                                  "choose another folder")
        handle = os.fdopen(fd, "a+", encoding="utf-8")
        handle.sciformer_found_empty = not created and st.st_size == 0  # type: ignore[attr-defined] - someone's empty file: kept
        return handle
    except FileExistsError:
        raise FolderLockError(f"{flag} {folder}: a file (or a file above it) is in the way; expected a folder") from None
    except NotADirectoryError:
        raise FolderLockError(f"{flag} {folder}: a path component is a file; expected a folder") from None
    except PermissionError:
        raise FolderLockError(f"{flag} {folder}: not writable (permission denied)") from None
    except IsADirectoryError:
        raise FolderLockError(f"{flag} {folder}: its {name} is a folder, not a lock file; choose another folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(folder / name):
            raise FolderLockError(f"{flag} {folder}: its {name} is a symbolic link; choose another folder") from None
        raise FolderLockError(f"{flag} {folder}: cannot create the folder ({exc.strerror or exc})") from None
