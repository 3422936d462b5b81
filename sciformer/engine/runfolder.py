"""Run-folder safety: one writer at a time, no stale temporaries, checked resume state.

- :func:`check_new_run_dir` refuses, for a new run, a folder that holds a run (finished or
  resumable) or anything sciformer did not write there: a run never writes over, or
  removes, a user's files.
- :func:`lock_run_dir` takes an exclusive ``flock`` on ``<run>/.lock`` for the life of
  the process (the kernel drops it when the process ends, even on SIGKILL); a second
  ``train`` on the same folder is refused with one line.
- :func:`clean_temporaries` removes the temporary files an atomic write leaves when the
  process is killed inside it (``.<name>.<random>.tmp*``), once the lock is held.
- :func:`check_resume_state` and :func:`check_resume_config` refuse tampered or mismatched
  checkpoints before anything in the run folder is rewritten.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import IO, Any

from sciformer.errors import CheckpointError, SciformerError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the folder check still applies
    fcntl = None  # type: ignore[assignment]


class RunFolderError(SciformerError):
    """The run folder cannot be used as asked."""


# What a run writes at the top of its folder; a folder holding only these (and the lock) is
# an unfinished run of sciformer's, which a new run may take over.
RUN_ENTRIES = frozenset({
    ".lock", "config.yaml", "env.json", "metrics.csv", "metrics.json", "train.log", "curves.png",
    "per_class.csv", "confusion_matrix.csv", "confusion_matrix.png", "splits.npz", "protocol.json",
    "pretrain.json", "checkpoints", "tensorboard", "predictions",
})
_FINISHED = ("checkpoints/last.pt", "checkpoints/best.pt", "metrics.json")


def _temporary(name: str) -> bool:
    """An atomic write's temporary (``.<name>.<random>.tmp...``)."""
    return name.startswith(".") and ".tmp" in name


def check_new_run_dir(run_dir: Path, *, resume_hint: bool = True) -> None:
    """Refuse ``run_dir`` for a new run unless it is absent, empty, or an unfinished run's folder.

    A folder with a checkpoint or ``metrics.json`` holds a run (continue it with ``--resume``);
    a folder without sciformer's lock file, or with entries a run does not write, holds
    someone's files. Nothing is created, changed or removed here.
    """
    if not run_dir.is_dir():
        return
    if any((run_dir / name).exists() for name in _FINISHED):
        hint = f"continue it with --resume {run_dir} or choose another folder" if resume_hint and \
            (run_dir / "checkpoints" / "last.pt").exists() else "choose another folder"
        raise RunFolderError(f"--output-dir {run_dir} already holds a run; {hint}")
    try:
        names = sorted(p.name for p in run_dir.iterdir())
    except OSError as exc:
        raise RunFolderError(f"--output-dir {run_dir}: cannot list the folder ({exc.strerror or exc})") from None
    foreign = names if ".lock" not in names else [n for n in names if n not in RUN_ENTRIES and not _temporary(n)]
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise RunFolderError(f"--output-dir {run_dir} is not empty ({shown}) and is not a sciformer run; "
                             "a run never writes beside other files: choose a new or empty folder")


class RunLock:
    """The lock on a run folder (held until :meth:`release` or the end of the process)."""

    def __init__(self, run_dir: Path, handle: IO[str], created: bool, parents: tuple[Path, ...] = ()) -> None:
        self.run_dir, self.handle, self.created = run_dir, handle, created
        self.parents = parents  # folders above run_dir this process created, innermost first

    def release(self) -> None:
        """Unlock; a folder this process created and left empty (but for the lock) is removed,
        with the folders above it that it created for it and that are still empty."""
        with contextlib.suppress(OSError):
            if self.created and {p.name for p in self.run_dir.iterdir()} <= {".lock", "checkpoints"} \
                    and not any((self.run_dir / "checkpoints").glob("*")):
                (self.run_dir / ".lock").unlink()
                with contextlib.suppress(FileNotFoundError):
                    (self.run_dir / "checkpoints").rmdir()
                self.run_dir.rmdir()
                for parent in self.parents:
                    parent.rmdir()  # OSError (not empty: someone wrote there meanwhile) stops here
        self.handle.close()


def lock_run_dir(run_dir: Path, *, fresh: bool = True) -> RunLock:
    """Create ``run_dir`` and lock it for this process (before any work).

    ``fresh``: a new run, refused (before anything is written) where :func:`check_new_run_dir`
    refuses it, checked again once the lock is held. Temporaries of an interrupted save are
    removed once the lock is held.
    """
    if fresh:
        check_new_run_dir(run_dir)
    created = not run_dir.exists()
    parents = tuple(p for p in run_dir.absolute().parents if not p.exists())  # innermost first
    handle = _open_lock(run_dir)
    if fresh:
        try:
            check_new_run_dir(run_dir)  # another process may have finished a run here meanwhile
        except RunFolderError:
            handle.close()
            raise
    clean_temporaries(run_dir)
    return RunLock(run_dir, handle, created, parents)


def _open_lock(run_dir: Path) -> IO[str]:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / ".lock", "a+", encoding="utf-8")  # noqa: SIM115 - held until exit
    except FileExistsError:
        raise RunFolderError(f"--output-dir {run_dir}: a file (or a file above it) is in the way; expected a folder") from None
    except NotADirectoryError:
        raise RunFolderError(f"--output-dir {run_dir}: a path component is a file; expected a folder") from None
    except PermissionError:
        raise RunFolderError(f"--output-dir {run_dir}: not writable (permission denied)") from None
    except OSError as exc:
        raise RunFolderError(f"--output-dir {run_dir}: cannot create the run folder ({exc.strerror or exc})") from None
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read(32).strip() or "?"
        handle.close()
        raise RunFolderError(f"--output-dir {run_dir} is being written by another sciformer process (pid {owner}); wait for it or choose another folder") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def clean_temporaries(run_dir: Path) -> list[Path]:
    """Remove temporaries of interrupted atomic writes under ``run_dir`` (and its checkpoints)."""
    removed = []
    for folder in (run_dir, run_dir / "checkpoints"):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*.tmp*"):
            if path.is_file():
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed.append(path)
    return removed


def _int(state: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = state.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise CheckpointError(f"checkpoint '{where}': '{key}' is {str(value)[:40]!r}; expected a non-negative integer")
    return value


def check_resume_state(state: dict[str, Any], where: str) -> dict[str, Any]:
    """The training-position fields of a checkpoint, checked; one-line CheckpointError otherwise."""
    out: dict[str, Any] = {
        "epoch": _int(state, "epoch", where),
        "step_in_epoch": _int(state, "step_in_epoch", where, 0),
        "global_step": _int(state, "global_step", where),
    }
    partial = state.get("partial", (0.0, 0))
    if (not isinstance(partial, (list, tuple)) or len(partial) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in partial)
            or not math.isfinite(partial[0]) or not (isinstance(partial[1], int) and partial[1] >= 0)):
        raise CheckpointError(f"checkpoint '{where}': 'partial' is {str(partial)[:60]!r}; expected [loss sum, count]")
    out["partial"] = (float(partial[0]), int(partial[1]))
    best = state.get("best")
    if not isinstance(best, dict) or not {"metric", "value", "epoch"} <= set(best) or not isinstance(best["epoch"], int) \
            or not (best["value"] is None or isinstance(best["value"], (int, float))):
        raise CheckpointError(f"checkpoint '{where}': 'best' is malformed; expected {{metric, value, epoch}}")
    history = state.get("history", [])
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise CheckpointError(f"checkpoint '{where}': 'history' is malformed; expected a list of per-epoch rows")
    for key in ("optimizer", "scheduler"):
        if not isinstance(state.get(key), dict):
            raise CheckpointError(f"checkpoint '{where}': '{key}' is malformed; expected a state mapping")
    return out


# sections that define the weights and their meaning: a resumed run may not change them
_FIXED_SECTIONS = ("model", "data")


def check_resume_config(stored: dict[str, Any], asked: dict[str, Any], where: str) -> None:
    """Refuse overrides on ``--resume`` that change the model, the data or the optimizer type."""
    for section in _FIXED_SECTIONS:
        a, b = stored.get(section, {}), asked.get(section, {})
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) if isinstance(a, dict) and isinstance(b, dict) else []
            key = f"{section}.{keys[0]}" if keys else section
            old = a.get(keys[0]) if keys else a
            new = b.get(keys[0]) if keys else b
            raise CheckpointError(f"--resume cannot change {key} (checkpoint '{where}' has {str(old)[:60]!r}, asked {str(new)[:60]!r}); "
                                  "start a new run with --config instead")
    a_opt, b_opt = stored.get("optimizer", {}).get("name"), asked.get("optimizer", {}).get("name")
    if a_opt != b_opt:
        raise CheckpointError(f"--resume cannot change optimizer.name (checkpoint '{where}' has {a_opt!r}, asked {b_opt!r}); start a new run instead")
