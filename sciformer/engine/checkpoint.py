"""Checkpoints: written atomically, loaded with ``weights_only=True``.

A checkpoint is a dict of plain data and tensors::

    {"format": "sciformer-checkpoint", "version": 1,
     "config": resolved experiment dict, "config_dir": str,
     "data_info": {...}, "data_state": {...},
     "model": state_dict, "optimizer": ..., "scheduler": ..., "scaler": ...,
     "epoch": int (completed epochs), "step_in_epoch": int, "global_step": int,
     "partial": [loss sum, loss weight] of the epoch in progress, "history": [per-epoch rows],
     "best": {"metric": str, "value": float, "epoch": int, "loss": float (validation loss; the tie-break)},
     "init_from": what ``train.init_from`` loaded (checkpoint, sha256, tensors) or None,
     "run_id": str (the run that wrote it; its env.json names it too)}

No generator state is stored: every random number of a step is decided by the seed, the
epoch, the step and the sample (:mod:`sciformer.engine.noise`).

Anything else (a foreign file, a truncated file, a pickle with code) is refused with
a one-line :class:`~sciformer.errors.CheckpointError`.
"""

from __future__ import annotations

import os
import pickle
import stat
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from sciformer.errors import CheckpointError, DataError
from sciformer.utils.atomic import atomic_write_with
from sciformer.utils.digest import stream_sha256
from sciformer.utils.limits import check_bytes, regular_file

MAX_CLASSES = 1_000_000
MAX_CHANNELS = 1_000_000

FORMAT = "sciformer-checkpoint"
VERSION = 1


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus format tags) atomically to ``path``.

    A failed write (full disk, file-size limit) raises the OSError that stopped it: torch's
    own writer reports it as a RuntimeError without the cause, so bytes pass through a
    Python file whose error is kept.
    """
    data = {"format": FORMAT, "version": VERSION, **payload}
    try:
        atomic_write_with(path, lambda tmp: _save_reporting_errors(data, tmp))
    except OSError as exc:
        if exc.filename is None:  # a write's error: name the checkpoint, not its temporary
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


class _ErrorKeepingWriter:
    """A file for ``torch.save`` that writes every byte it is given and keeps the OSError of a failed write."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.error = handle, None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):  # a raw write may take only part
                done += self.handle.write(view[done:])
        except OSError as exc:
            self.error = exc
            raise
        return done

    def flush(self) -> None:
        self.handle.flush()


def _save_reporting_errors(data: dict[str, Any], path: Path) -> None:
    with open(path, "wb", buffering=0) as handle:
        writer = _ErrorKeepingWriter(handle)
        try:
            torch.save(data, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise


TRAINING_ONLY = ("optimizer", "scheduler", "scaler", "ema", "partial", "step_in_epoch")  # what only --resume reads (last.pt)


def without_training_state(payload: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint for inference and fine-tuning (``best.pt``): the payload less :data:`TRAINING_ONLY`."""
    return {k: v for k, v in payload.items() if k not in TRAINING_ONLY}


def checkpoint_file(path: str | Path, in_run: str = "last.pt") -> Path:
    """``path`` itself, or ``path/checkpoints/<in_run>`` when ``path`` is a run folder.

    Resuming wants ``last.pt`` (the latest state); evaluating and predicting want
    ``best.pt`` (the model the run's ``metrics.json`` reports).
    """
    path = Path(path)
    if not path.is_dir():
        return path
    candidate = path / "checkpoints" / in_run
    if not candidate.exists():
        raise CheckpointError(f"'{path}' is a directory without checkpoints/{in_run}")
    return candidate


def load_checkpoint(path: str | Path, in_run: str = "last.pt") -> dict[str, Any]:
    """Load and check a checkpoint (a file, or ``checkpoints/<in_run>`` of a run folder); never executes code from the file."""
    return load_checkpoint_and_digest(path, in_run, digest=False)[0]


def load_checkpoint_and_digest(path: str | Path, in_run: str = "last.pt", *, digest: bool = True) -> tuple[dict[str, Any], str | None]:
    """:func:`load_checkpoint`, and the SHA-256 of the file it loaded (None unless ``digest``).

    The file is opened once: its container check, its digest and torch.load read that one open
    file, so a file replaced meanwhile (a run writing a new best.pt) can never give the digest
    of one file and the tensors of another.
    """
    path = checkpoint_file(path, in_run)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        regular_file(path, "checkpoint")
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # never waits on a FIFO swapped in since
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{path}' does not exist (it was removed while being opened)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced by a folder, FIFO or device since the check
        os.close(fd)
        raise CheckpointError(f"checkpoint '{path}' is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        _check_container(handle, path, verify=True)
        sha = None
        if digest:
            handle.seek(0)
            sha = stream_sha256(handle)
        handle.seek(0)
        data = _torch_load(handle, path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a sciformer checkpoint (no '{FORMAT}' tag)")
    if data.get("version") != VERSION:
        raise CheckpointError(f"checkpoint '{path}' has format version {data.get('version')}; this sciformer reads version {VERSION}")
    for key in ("config", "model", "data_info"):
        if key not in data:
            raise CheckpointError(f"checkpoint '{path}' lacks '{key}'")
        if not isinstance(data[key], dict):
            raise CheckpointError(f"checkpoint '{path}': '{key}' is a {type(data[key]).__name__}; expected a mapping")
    _check_data_info(data["data_info"], path)
    return data, sha


def _torch_load(handle: Any, path: Path) -> Any:
    try:
        with warnings.catch_warnings():  # torch warns (several lines) about files written by other tools
            warnings.simplefilter("ignore")
            return torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        # torch's first line advises weights_only=False; the useful line names the blocked object
        first = next((ln for ln in lines if "GLOBAL" in ln or "nsupported" in ln), lines[0] if lines else "unsafe content")
        raise CheckpointError(f"checkpoint '{path}' was refused: it holds objects other than tensors and plain data ({first[:160]})") from None
    except Exception as exc:  # noqa: BLE001 - any other failure means a damaged or foreign file
        raise CheckpointError(f"checkpoint '{path}' is truncated or not a torch file ({type(exc).__name__})") from None


def _check_container(handle: Any, path: Path, verify: bool = False) -> None:
    """Zip members stored (as torch.save writes them), not marked encrypted, that fit the memory budget
    (``handle``: the open file); with ``verify``, every member's bytes also match the CRC-32 torch.save
    recorded for them (torch.load does not check it: a flipped bit in a tensor loads as a changed weight,
    silently). Whatever zipfile raises on a damaged directory (a multi-disk or newer-version trailer, an
    encryption flag) is the one-line error."""
    try:
        handle.seek(0)
        if not zipfile.is_zipfile(handle):
            return  # legacy (non-zip) torch files are size-bounded by the file itself; torch.load judges them
        handle.seek(0)
        with zipfile.ZipFile(handle) as archive:
            members = archive.infolist()
    except Exception as exc:  # noqa: BLE001 - zipfile's many errors for a damaged end record or directory
        raise _damaged(path, exc) from None
    odd = [(m.filename, "encrypted") for m in members if m.flag_bits & _ENCRYPTED]
    odd += [(m.filename, "a folder") for m in members if (m.external_attr & _DOS_FOLDER or m.filename.endswith("/"))
            and not (m.filename.endswith("/") and m.file_size == 0)]  # an empty folder entry (zip -r of an unpacked copy) holds nothing
    if odd:  # torch's reader skips a member marked a folder: its tensor would load as uninitialised memory
        raise CheckpointError(f"checkpoint '{path}' is damaged: member '{odd[0][0][:80]}' is marked {odd[0][1]}, which torch.save never "
                              "writes (changed on disk or in a copy); use another copy of the run")
    packed = [m.filename for m in members if m.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise CheckpointError(f"checkpoint '{path}' has compressed members ({packed[0][:80]}); torch.save writes them stored, so it was altered")
    try:
        check_bytes(sum(m.file_size for m in members), f"checkpoint '{path}'", "its tensors")
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if verify:
        _check_crc(handle, path)


_ENCRYPTED = 0x01 | 0x40  # zip general-purpose flag bits 0 (encrypted) and 6 (strong encryption)
_DOS_FOLDER = 0x10  # the MS-DOS attribute "directory" in a member's external attributes


def _damaged(path: Path, exc: BaseException) -> CheckpointError:
    return CheckpointError(f"checkpoint '{path}' is truncated or not a torch file ({type(exc).__name__})")


def _check_crc(handle: Any, path: Path) -> None:
    """One line when a stored member's bytes differ from its recorded CRC-32 (bytes changed on disk
    or in transfer after the file was written); a file recorded without any (CRC 0 for every
    member, as torch writes with its CRC computation switched off) is not checked."""
    handle.seek(0)
    bad = None
    try:
        with zipfile.ZipFile(handle) as archive:
            members = [m for m in archive.infolist() if m.file_size > 0]
            if all(m.CRC == 0 for m in members):
                return  # none recorded: torch.serialization.set_crc32_options(False) writes 0 for every member
            for member in members:
                try:
                    with archive.open(member) as stream:
                        while stream.read(1 << 20):  # zipfile compares the CRC-32 at the member's end
                            pass
                except zipfile.BadZipFile:
                    bad = member.filename
                    break
    except Exception as exc:  # noqa: BLE001 - zipfile's many errors for a damaged header or directory
        raise _damaged(path, exc) from None
    if bad is not None:
        raise CheckpointError(
            f"checkpoint '{path}' is damaged: the bytes of '{bad[:80]}' do not match the checksum written with them "
            "(changed on disk or in a copy); use another copy of the run"
        )


def _check_data_info(info: dict[str, Any], path: Path) -> None:
    """Sizes a model is built from: plausible integers, one name per class."""
    for key, low, top in (("num_classes", 1, MAX_CLASSES), ("in_channels", 0, MAX_CHANNELS)):
        value = info.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
            raise CheckpointError(f"checkpoint '{path}': data_info.{key} is {str(value)[:40]!r}; expected an integer in {low}..{top}")
    names = info.get("class_names")
    if names is not None and (not isinstance(names, (list, tuple)) or len(names) != info.get("num_classes") or not all(isinstance(n, str) for n in names)):
        raise CheckpointError(f"checkpoint '{path}': data_info.class_names must be {info.get('num_classes')} names")


def checkpoint_progress(path: Path) -> dict[str, Any]:
    """A checkpoint's records without reading its tensors: ``epoch``, ``step_in_epoch``, ``best_epoch``
    and ``last_row`` (the history's last epoch row; None when none). The tensors are memory-mapped,
    never read; loaded with ``weights_only=True``."""
    try:
        regular_file(path, "checkpoint")
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    with open(path, "rb") as handle:
        _check_container(handle, path)
        handle.seek(0)
        head = handle.read(4)
        if head != b"PK\x03\x04" and head[:1] != b"\x80":  # neither torch's zip nor its legacy pickle
            raise CheckpointError(f"checkpoint '{path}' is truncated or not a torch file")
        try:
            str(path).encode("utf-8")  # torch's memory map takes a UTF-8 name; another name is read whole
        except UnicodeEncodeError:
            head = b""
        if head != b"PK\x03\x04":  # torch's legacy format, or that name: read whole
            handle.seek(0)
            data = _torch_load(handle, path)
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # noqa: BLE001 - a damaged, foreign or pickled-code file
                raise CheckpointError(f"checkpoint '{path}' is truncated or not a torch file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a sciformer checkpoint (no '{FORMAT}' tag)")
    epoch, step, best = data.get("epoch"), data.get("step_in_epoch", 0), data.get("best")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (epoch, step)):
        raise CheckpointError(f"checkpoint '{path}': 'epoch' / 'step_in_epoch' are not counts")
    best_epoch = best.get("epoch") if isinstance(best, dict) else None
    history = data.get("history")
    last_row = history[-1] if isinstance(history, list) and history and isinstance(history[-1], dict) else None
    return {"epoch": epoch, "step_in_epoch": step, "best_epoch": best_epoch if isinstance(best_epoch, int) else None,
            "last_row": last_row}
