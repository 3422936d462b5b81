"""One writer per output folder (``sciformer.engine.folder_lock``), including a lock file that its
holder removes while another process is about to lock it."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
from pathlib import Path

import pytest

from sciformer.engine import folder_lock
from sciformer.engine.folder_lock import FolderLockError, drop_folder_lock, open_folder_lock

fcntl = pytest.importorskip("fcntl")


def _same_file(path: Path, handle) -> bool:
    a, b = os.stat(path), os.fstat(handle.fileno())
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_a_second_lock_is_refused_in_one_line_naming_the_holder(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    held = open_folder_lock(folder, ".x.lock")
    assert (folder / ".x.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(FolderLockError) as info:
        open_folder_lock(folder, ".x.lock")  # another open file: flock refuses it, as for another process
    assert "\n" not in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    drop_folder_lock(folder, ".x.lock", held)
    assert not (folder / ".x.lock").exists() and held.closed
    again = open_folder_lock(folder, ".x.lock")  # free once dropped
    assert _same_file(folder / ".x.lock", again)
    again.close()


@pytest.mark.parametrize("successor", [True, False])
def test_a_lock_file_removed_by_its_holder_before_our_flock_is_not_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        successor: bool) -> None:
    """Between our open and our flock, the holder drops its lock (unlink, unlock) and, with
    ``successor``, a third process creates and locks a new file: our flock then succeeds on the
    removed file, which must not count."""
    folder = tmp_path / "run"
    holder = open_folder_lock(folder, ".lock")
    others = []
    real_flock = fcntl.flock
    calls = []

    def flock(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the file we opened is the holder's: it lets go now
            drop_folder_lock(folder, ".lock", holder)
            if successor:
                others.append(open_folder_lock(folder, ".lock"))
        real_flock(fd, op)

    monkeypatch.setattr(folder_lock.fcntl, "flock", flock)
    if successor:
        with pytest.raises(FolderLockError, match="being written by another sciformer process"):
            open_folder_lock(folder, ".lock")
        assert _same_file(folder / ".lock", others[0])  # the successor's lock stands
        others[0].close()
    else:
        mine = open_folder_lock(folder, ".lock")
        assert _same_file(folder / ".lock", mine) and len(calls) == 2  # a new file, locked on the second try
        mine.close()


def test_a_folder_removed_between_creating_it_and_opening_the_lock_is_created_again(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "out"
    real_open = os.open
    opened = []

    def racing_open(path, flags, mode=0o777, **kw):
        if str(path).endswith(".lock") and not opened:
            opened.append(path)
            os.rmdir(folder)  # a holder finishing meanwhile removes the empty folder it created
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(folder_lock.os, "open", racing_open)
    handle = open_folder_lock(folder, ".lock")
    assert opened and _same_file(folder / ".lock", handle)
    handle.close()


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "folder", "file-above", "user-file", "long-digits", "whitespace"])
def test_a_lock_path_that_is_not_a_plain_file_is_one_line(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    if kind == "symlink":
        (tmp_path / "target").write_text("user data\n")
        (folder / ".lock").symlink_to(tmp_path / "target")
    elif kind == "hardlink":  # another name of a user's file: never truncated for a pid
        (tmp_path / "target").write_text("user data\n")
        os.link(tmp_path / "target", folder / ".lock")
    elif kind == "fifo":
        os.mkfifo(folder / ".lock")  # never waited on
    elif kind == "folder":
        (folder / ".lock").mkdir()
    elif kind in ("user-file", "long-digits", "whitespace"):  # a user's own file of that name: never truncated, never removed
        (tmp_path / "target").write_text({"user-file": "user data\n", "long-digits": "7" * 40 + "\n", "whitespace": "   \n\n\t"}[kind])
        shutil.copy(tmp_path / "target", folder / ".lock")
    else:
        folder.rmdir()
        folder.write_text("a file\n")
        folder = folder / "below"
    with pytest.raises(FolderLockError) as info:
        open_folder_lock(folder, ".lock")
    assert "\n" not in str(info.value) and str(folder) in str(info.value)
    if kind in ("symlink", "hardlink"):
        assert (tmp_path / "target").read_text() == "user data\n"
    if kind in ("user-file", "long-digits", "whitespace"):
        assert (folder / ".lock").read_bytes() == (tmp_path / "target").read_bytes()
        assert "not a lock file of sciformer's" in str(info.value)
    if kind == "folder":
        assert "is a folder" in str(info.value)


@pytest.mark.parametrize("content", ["", "12345\n", " 42 "])
def test_an_empty_lock_or_one_holding_a_pid_is_taken(tmp_path: Path, content: str) -> None:
    """What a lock being created, or one a killed holder left, holds: the lock is taken and names
    us. A pid file goes at the end; an empty file that was there is left there, empty."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / ".lock").write_text(content)
    handle = open_folder_lock(folder, ".lock")
    assert (folder / ".lock").read_text() == f"{os.getpid()}\n"
    drop_folder_lock(folder, ".lock", handle)
    if content:
        assert not (folder / ".lock").exists()
    else:
        assert (folder / ".lock").read_bytes() == b""


def _contend(folder: str, marker: str, rounds: int, failures) -> None:
    """Lock, claim the marker (an exclusive create), release it, drop the lock; count overlaps."""
    done = 0
    while done < rounds:
        try:
            handle = open_folder_lock(Path(folder), ".lock")
        except FolderLockError:
            continue
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            os.unlink(marker)
        except FileExistsError:
            with failures.get_lock():
                failures.value += 1
        drop_folder_lock(Path(folder), ".lock", handle)
        done += 1


def test_processes_that_lock_and_drop_one_folder_never_hold_it_together(tmp_path: Path) -> None:
    """Four processes lock, work and remove the lock file 150 times each: never two at once."""
    ctx = mp.get_context("fork")
    failures = ctx.Value("i", 0)
    procs = [ctx.Process(target=_contend, args=(str(tmp_path / "run"), str(tmp_path / "marker"), 150, failures))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    assert failures.value == 0
