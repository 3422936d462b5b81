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
import json
import math
import os
import shutil
import stat
import time
import weakref
from pathlib import Path
from typing import IO, Any

from sciformer.engine.folder_lock import (
    FolderLockError,
    create_free_folder,
    drop_folder_lock,
    holds_pid_only,
    missing_folders,
    open_folder_lock,
    remove_empty_folders,
)
from sciformer.engine.report import EVALUATION_TABLES
from sciformer.engine.signals import not_on_abrupt_exit, on_abrupt_exit, signals_held
from sciformer.errors import CheckpointError, SciformerError
from sciformer.frontend import option, resume_hint
from sciformer.utils.atomic import temporary_of


class RunFolderError(SciformerError):
    """The run folder cannot be used as asked."""


# What a run that stopped before its first checkpoint leaves at the top of its folder (regular
# files); with a ``checkpoints/`` of temporaries only and ``tensorboard/`` event files, such a
# folder is an unfinished run of sciformer's, which a new run may take over.
UNFINISHED_FILES = frozenset({".lock", "config.yaml", "env.json", "metrics.csv", "train.log", "curves.png",
                              "splits.npz", "protocol.json"})
# ``pretrain`` writes everything at its end: a pre-training killed then leaves some of these.
UNFINISHED_PRETRAIN_FILES = frozenset({".lock", "config.yaml", "splits.npz", "protocol.json", "pretrain.json", "metrics.csv"})
RUN_FILES = UNFINISHED_FILES | UNFINISHED_PRETRAIN_FILES | {"metrics.json", "per_class.csv", "confusion_matrix.csv",
                                                            "confusion_matrix.png", "last.pt", "best.pt"}
OWN_FOLDERS = ("checkpoints", "tensorboard", "predictions")  # folders a run writes into
_FINISHED = ("checkpoints/last.pt", "checkpoints/best.pt", "metrics.json")


def _regular(path: Path) -> bool:
    """A regular file itself, with no other name (not a link, a hard link, a FIFO, socket or device)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _folder(path: Path) -> bool:
    """A folder itself (not a link to one)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def is_temporary(path: Path) -> bool:
    """A temporary an interrupted atomic write of a run file left (``.<name>.<8 random>.tmp<suffix>``, a regular file)."""
    return temporary_of(path.name) in RUN_FILES and _regular(path)


def _our_lock(path: Path) -> bool:
    """``.lock`` as sciformer writes it: a small regular file holding a process id."""
    if not _regular(path):
        return False
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            return os.fstat(fd).st_size > 0 and holds_pid_only(fd)
        finally:
            os.close(fd)
    return False


def _foreign_entries(run_dir: Path, names: list[str], leftovers: frozenset[str]) -> list[str]:
    """The entries of ``run_dir`` an unfinished run does not leave (all of them without sciformer's lock)."""
    if ".lock" not in names or not _our_lock(run_dir / ".lock"):
        return names
    foreign = []
    for name in names:
        path = run_dir / name
        if (name in leftovers and _regular(path)) or is_temporary(path):
            continue
        if name == "checkpoints" and _folder(path) and all(is_temporary(p) for p in path.iterdir()):
            continue
        if name == "tensorboard" and _folder(path) and all(p.name.startswith("events.out.tfevents.") and _regular(p) for p in path.iterdir()):
            continue
        foreign.append(name)
    return foreign


def check_new_run_dir(run_dir: Path, *, resume_hint: bool = True, leftovers: frozenset[str] = UNFINISHED_FILES) -> None:
    """Refuse ``run_dir`` for a new run unless it is absent, empty, or an unfinished run's folder.

    A folder with a checkpoint or ``metrics.json`` holds a run (continue it with ``--resume``);
    a folder without sciformer's lock file, or with any entry an unfinished run does not leave
    (another name, a link, a special file, a file in ``checkpoints/``), holds someone's files.
    ``leftovers``: the top-level files an unfinished run of this kind leaves
    (:data:`UNFINISHED_FILES` for ``train``, :data:`UNFINISHED_PRETRAIN_FILES` for ``pretrain``),
    so neither keeps the other's files. Nothing is created, changed or removed here.
    """
    if not run_dir.is_dir():
        return
    if any((run_dir / name).exists() or (run_dir / name).is_symlink() for name in _FINISHED):
        if resume_hint and (run_dir / "checkpoints" / "last.pt").exists():
            hint = f"continue it with {option('--resume', run_dir)} or choose another folder"
        elif not (run_dir / "metrics.json").exists() and not (run_dir / "pretrain.json").exists():
            hint = ("it stopped before its first checkpoints/last.pt, so it cannot be resumed; "
                    "delete the folder to start again there, or choose another folder")
        else:
            hint = "choose another folder"
        raise RunFolderError(f"{option('--output-dir', run_dir)} already holds a run; {hint}")
    try:
        foreign = _foreign_entries(run_dir, sorted(p.name for p in run_dir.iterdir()), leftovers)
    except OSError as exc:
        raise RunFolderError(f"{option('--output-dir', run_dir)}: cannot list the folder ({exc.strerror or exc})") from None
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise RunFolderError(f"{option('--output-dir', run_dir)} is not empty ({shown}) and is not a sciformer run; "
                             "a run never writes beside other files: choose a new or empty folder")


class RunLock:
    """The lock on a run folder (held until :meth:`release` or the end of the process).

    While it is held, :meth:`release` is also registered to run if a signal ends the process
    at once (inside an import: :func:`~sciformer.engine.signals.on_abrupt_exit`), so a run
    interrupted in its first seconds leaves no folder either; the registration refers to the
    lock weakly (a lock that is no longer used is not kept open by it)."""

    def __init__(self, run_dir: Path, handle: IO[str], created: bool, parents: tuple[Path, ...] = (), lock_created: bool = False) -> None:
        self.run_dir, self.handle, self.created = run_dir, handle, created
        self.parents = parents  # folders above run_dir this process created, innermost first
        self.lock_created = lock_created  # the .lock file is this process's (the folder may be older)
        ref = weakref.ref(self, lambda _: not_on_abrupt_exit(undo))  # a lock collected unreleased: nothing left to run

        def undo() -> None:
            lock = ref()
            if lock is not None:
                lock.release()

        self._undo = undo
        on_abrupt_exit(undo)

    def release(self) -> None:
        """Unlock. Where nothing was written but the lock, what this process created goes again:
        the lock file, the run folder and the folders above it that it created (while empty)."""
        not_on_abrupt_exit(self._undo)
        untouched = False
        with contextlib.suppress(OSError):
            untouched = self.lock_created and {p.name for p in self.run_dir.iterdir()} <= {".lock", "checkpoints"} \
                and not any((self.run_dir / "checkpoints").glob("*"))
        if not untouched:
            self.handle.close()
            return
        drop_folder_lock(self.run_dir, ".lock", self.handle)
        if self.created:
            with contextlib.suppress(OSError):
                (self.run_dir / "checkpoints").rmdir()
            remove_empty_folders((self.run_dir, *self.parents))  # stops where someone wrote meanwhile


def default_run_dir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``: a new run's folder without ``--output-dir`` (locked ``numbered``: :func:`lock_run_dir`)."""
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def lock_run_dir(run_dir: Path, *, fresh: bool = True, leftovers: frozenset[str] = UNFINISHED_FILES,
                 resume_hint: bool = True, numbered: bool = False) -> RunLock:
    """Create ``run_dir`` and lock it for this process (before any work); the lock's ``run_dir`` is the folder.

    ``fresh``: a new run, refused (before anything is written) where :func:`check_new_run_dir` refuses it (with
    ``leftovers`` and ``resume_hint``), checked again once the lock is held; temporaries of an interrupted save are
    removed then. ``numbered``: a default name, or where it exists (a run started in the same second) the first free
    ``-2``, ``-3``, ... (:func:`create_free_folder`).
    """
    if numbered:  # a folder made here: removed again by release, or by a failure to lock it
        with signals_held():  # a signal meanwhile is raised once the lock can undo the folder
            parents, run_dir = missing_folders(run_dir.parent), create_free_folder(run_dir)
            try:
                return RunLock(run_dir, _open_lock(run_dir), True, parents, True)
            except BaseException:
                remove_empty_folders((run_dir, *parents))
                raise
    if fresh:
        check_new_run_dir(run_dir, leftovers=leftovers, resume_hint=resume_hint)
    created = not run_dir.exists()
    lock_created = not (run_dir / ".lock").exists()
    parents = missing_folders(run_dir)[1:]  # the folders above run_dir to create, innermost first
    lock: RunLock | None = None
    try:  # a refusal, or a signal (SIGTERM reads as Ctrl-C), from here on leaves no folder of only a .lock
        with signals_held():  # a signal while the folder and its lock come into being is raised once the lock can undo them
            lock = RunLock(run_dir, _open_lock(run_dir), created, parents, lock_created)
        if fresh:
            check_new_run_dir(run_dir, leftovers=leftovers, resume_hint=resume_hint)  # another process may have finished a run here meanwhile
        clean_temporaries(run_dir)
        if fresh:  # a taken-over run's TensorBoard events (checked to be nothing else) would mix with this run's
            for path in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
                with contextlib.suppress(OSError):
                    path.unlink()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def _open_lock(run_dir: Path) -> IO[str]:
    try:
        return open_folder_lock(run_dir, ".lock")
    except FolderLockError as exc:
        raise RunFolderError(str(exc)) from None


def clean_temporaries(run_dir: Path) -> list[Path]:
    """Remove temporaries of interrupted atomic writes under ``run_dir`` (and its checkpoints)."""
    removed = []
    for folder in (run_dir, run_dir / "checkpoints"):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*.tmp*"):
            if is_temporary(path):  # a run file's temporary, a regular file: never a user's
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed.append(path)
    return removed


def checkpoint_int(state: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """``state[key]`` (``default`` when absent) as a non-negative integer; a one-line CheckpointError otherwise."""
    value = state.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise CheckpointError(f"checkpoint '{where}': '{key}' is {str(value)[:40]!r}; expected a non-negative integer")
    return value


def check_run_identity(run_dir: Path, state: dict[str, Any], ckpt_path: Path) -> None:
    """Refuse a ``last.pt`` that another run wrote (copied into this folder): its ``run_id`` differs
    from the one the folder's ``env.json`` records. Runs older than run ids, and a folder whose
    env.json is missing or unreadable, have nothing to compare."""
    ours = state.get("run_id")
    try:
        theirs = json.loads((run_dir / "env.json").read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(ours, str) and isinstance(theirs, str) and ours != theirs:
        raise RunFolderError(f"{option('--resume', run_dir)}: '{ckpt_path}' was written by another run (run id {ours[:12]}; the folder's "
                             f"env.json names {theirs[:12]}): resume that run in its own folder, or start a new run from "
                             f"these weights with {option('--init-from')}")


def check_resume_location(ckpt_path: Path) -> Path:
    """The run folder ``--resume`` continues: the one holding ``ckpt_path`` as ``checkpoints/last.pt``.

    Any other file would be continued in a folder that is not its run (a copy's grandparent)
    or rewind its run over the later checkpoints (``best.pt``, an older copy). The folder must
    be sciformer's (its ``.lock`` with a process id, a ``config.yaml``), and what the run opens
    in place or writes into (``.lock``, ``train.log``, ``checkpoints/``, ``tensorboard/``,
    ``predictions/``) must be its own: no link, hard link or special file. Refused in one line.
    """
    folder = Path(os.path.abspath(ckpt_path.parent))
    if ckpt_path.name != "last.pt" or folder.name != "checkpoints":
        raise RunFolderError(f"{option('--resume')} continues a run from its checkpoints/last.pt, and '{ckpt_path}' is not one "
                             "(resuming it would rewind or misplace the run); give the run folder, or start a new run "
                             f"from these weights with {option('--init-from')}")
    run_dir = folder.parent.resolve()
    if not _our_lock(run_dir / ".lock") or not (run_dir / "config.yaml").is_file():
        raise RunFolderError(f"{option('--resume', ckpt_path, quoted=True)}: {run_dir} is not a sciformer run folder (no .lock with a process id, "
                             "or no config.yaml); a run continues in its own folder: copy the whole run folder "
                             f"(with its .lock), or start a new run from these weights with {option('--init-from')}")
    odd = [n for n in OWN_FOLDERS if (run_dir / n).exists() or (run_dir / n).is_symlink()]
    odd = [n + "/" for n in odd if not _folder(run_dir / n)]
    log = run_dir / "train.log"
    if (log.exists() or log.is_symlink()) and not _regular(log):
        odd.append("train.log")
    if odd:
        raise RunFolderError(f"{option('--resume', run_dir)}: {', '.join(odd)} is a link, a hard link or a special file where the run "
                             "keeps its own; it would write through it into other files: restore the run folder's own entries")
    return run_dir


def check_resume_state(state: dict[str, Any], where: str) -> dict[str, Any]:
    """The training-position fields of a checkpoint, checked; one-line CheckpointError otherwise."""
    out: dict[str, Any] = {
        "epoch": checkpoint_int(state, "epoch", where),
        "step_in_epoch": checkpoint_int(state, "step_in_epoch", where, 0),
        "global_step": checkpoint_int(state, "global_step", where),
    }
    partial = state.get("partial", (0.0, 0))
    if (not isinstance(partial, (list, tuple)) or len(partial) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in partial)
            or not math.isfinite(partial[0]) or not (math.isfinite(partial[1]) and partial[1] >= 0)):
        raise CheckpointError(f"checkpoint '{where}': 'partial' is {str(partial)[:60]!r}; expected [loss sum, loss weight]")
    out["partial"] = (float(partial[0]), float(partial[1]))
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
    data = state.get("data_state") or {}
    wl = data.get("wavelengths")
    if wl is not None and not data.get("bands_ascending") and any(b < a for a, b in zip(list(wl)[:-1], list(wl)[1:])):
        raise CheckpointError(f"checkpoint '{where}': trained on bands out of wavelength order, which runs now sort; "
                              f"it cannot be resumed: train a new run ({option('--init-from', where)} to start from its weights)")
    return out


# sections that define the weights and their meaning: a resumed run may not change them
_FIXED_SECTIONS = ("model", "data")


def check_resume_config(stored: dict[str, Any], asked: dict[str, Any], where: str) -> None:
    """Refuse overrides on ``--resume`` that change the model, the data, the optimizer type or the seed."""
    for section in _FIXED_SECTIONS:
        a, b = stored.get(section, {}), asked.get(section, {})
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) if isinstance(a, dict) and isinstance(b, dict) else []
            key = f"{section}.{keys[0]}" if keys else section
            old = a.get(keys[0]) if keys else a
            new = b.get(keys[0]) if keys else b
            raise CheckpointError(f"{option('--resume')} cannot change {key} (checkpoint '{where}' has {str(old)[:60]!r}, asked {str(new)[:60]!r}); "
                                  f"start a new run with {option('--config')} instead")
    a_opt, b_opt = stored.get("optimizer", {}).get("name"), asked.get("optimizer", {}).get("name")
    if a_opt != b_opt:
        raise CheckpointError(f"{option('--resume')} cannot change optimizer.name (checkpoint '{where}' has {a_opt!r}, asked {b_opt!r}); start a new run instead")
    a_seed, b_seed = (stored.get("train") or {}).get("seed"), (asked.get("train") or {}).get("seed")
    if a_seed != b_seed:  # it drew the first weights and, where data.split.seed is null, the split: a new one would test on training pixels
        raise CheckpointError(f"{option('--resume')} cannot change train.seed (checkpoint '{where}' has {a_seed!r}, asked {b_seed!r}): it drew "
                              "the run's first weights and, unless data.split.seed is set, its split; start a new run instead")


TEST_RESULT_FILES = (*EVALUATION_TABLES, "confusion_matrix.png")  # the finished mark first


def retire_test_result(run_dir: Path, log: Any = print) -> None:
    """Remove a run's test result and its predictions before its best.pt is replaced (a resumed
    run that trains on): they describe the old best.pt, so a run that fails from then on never
    shows them beside the new one. ``predictions/`` is the run's own folder (never a link:
    :func:`check_resume_location`); the final evaluation writes both anew."""
    removed = []
    for name in TEST_RESULT_FILES:
        path = run_dir / name
        if _regular(path):
            path.unlink()
            removed.append(name)
    predictions = run_dir / "predictions"
    if _folder(predictions):
        shutil.rmtree(predictions)
        removed.append("predictions/")
    if removed:
        log(f"best.pt changes: the earlier test result ({', '.join(removed)}) no longer describes it and was removed; "
            "the final evaluation writes it anew")


def resume_command(run_dir: Path, world_size: int) -> str:
    """The command (or, from Python, the call) that continues ``run_dir`` as it ran: on ``world_size`` processes under torchrun."""
    return resume_hint(run_dir, world_size)


def check_resume_layout(state: dict[str, Any], where: str, steps_per_epoch: int, world_size: int, batch_size: int) -> None:
    """Refuse a resume that changes the epoch's batches: a new ``train.batch_size`` mid-epoch (the samples split anew: some trained
    twice or skipped), and a process count that changes the steps per epoch (the schedule is built on the steps)."""
    old_batch, step = ((state.get("config") or {}).get("train") or {}).get("batch_size"), state.get("step_in_epoch")
    if isinstance(old_batch, int) and isinstance(step, int) and step > 0 and old_batch != batch_size:
        effect = "redo its steps in other batches (all trained; only its validation and checkpoint are left)" if step >= (state.get(
            "steps_per_epoch") or step + 1) else "train some of that epoch's samples twice" if batch_size < old_batch else "skip some of that epoch's samples altogether"
        raise CheckpointError(f"checkpoint '{where}' was written at step {step} of epoch {state.get('epoch', 0) + 1} with train.batch_size={old_batch}: "
                              f"batches of {batch_size} would {effect}; resume with train.batch_size={old_batch} (another size may follow a checkpoint written at an epoch's end)")
    old_steps, old_world = state.get("steps_per_epoch"), state.get("world_size")
    if not isinstance(old_steps, int) or not isinstance(old_world, int) or old_steps == steps_per_epoch or old_world == world_size:
        return  # written before these were recorded, the same batches, or the same processes (other data: checked elsewhere)
    raise CheckpointError(f"checkpoint '{where}': the run took {old_steps} steps per epoch on {old_world} process(es), and on "
                          f"{world_size} it would take {steps_per_epoch} (its last batch has too few samples for "
                          f"{max(old_world, world_size)} processes); continue with: {resume_command(Path(where).parents[1], old_world)}")

