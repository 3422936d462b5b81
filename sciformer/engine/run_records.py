"""What a training run records beside its checkpoints: ``env.json``, the epoch's console line,
TensorBoard scalars.

``env.json`` is written when a run starts and names its environment (versions, device,
threads, seed, command line, pid, run id). ``--resume`` keeps that record and appends one
entry to its ``resumed`` list (the epoch and step it continued from, time, command line,
pid, versions, device), so the run's start is never lost.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

from sciformer.errors import SciformerError

MAX_ENV_BYTES = 1 << 20  # env.json as sciformer writes it is a few hundred bytes per resume
RESUME_KEYS = ("sciformer", "python", "torch", "numpy", "platform", "device", "cuda_device", "threads", "command", "pid", "world_size")


def _recorded(path: Path) -> dict[str, Any] | None:
    """The run's env.json as a dict, or None where it is missing, not a regular file, or not a JSON object."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENV_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def env_record(path: Path, env: dict[str, Any], resumed_at: tuple[int, int] | None) -> dict[str, Any]:
    """The env.json to write: ``env`` for a new run; for a run resumed at (epoch, step) the
    recorded one with this resume appended to ``resumed`` and the checkpoint's run id (a run
    older than run ids gets one on its first resume); where no readable record is there,
    ``env`` whole with ``resumed_from_epoch`` and this resume."""
    if resumed_at is None:
        return {**env, "resumed_from_epoch": None}
    entry = {"from_epoch": resumed_at[0], "from_step": resumed_at[1], "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             **{k: env.get(k) for k in RESUME_KEYS}}
    old = _recorded(path)
    if old is None:
        return {**env, "resumed_from_epoch": resumed_at[0], "resumed": [entry]}
    earlier = old.get("resumed")
    return {**old, "run_id": env.get("run_id"), "resumed": [*(earlier if isinstance(earlier, list) else []), entry]}


def open_tensorboard(run_dir: Path, on: bool) -> Any:
    """A SummaryWriter under ``<run>/tensorboard`` when ``on`` (train.tensorboard, rank 0)."""
    if not on:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise SciformerError("train.tensorboard: the tensorboard package is not installed; pip install 'sciformer[tensorboard]' or set train.tensorboard=false") from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def log_scalars(writer: Any, row: dict[str, Any]) -> None:
    """An epoch's metrics.csv row as TensorBoard scalars (``val_oa`` as ``val/oa``)."""
    if writer is None:
        return
    for key, value in row.items():
        if key not in ("epoch", "step") and value is not None:
            writer.add_scalar(key.replace("_", "/", 1), value, row["epoch"])
    writer.flush()


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """The console line of one epoch."""
    parts = [f"epoch {row['epoch']}/{epochs}", f"loss {row['train_loss']:.4f}"]
    if row.get("val_oa") is not None:
        parts += [f"val_loss {row['val_loss']:.4f}", f"val_oa {100 * row['val_oa']:.2f}", f"val_aa {100 * row['val_aa']:.2f}"]
    parts += [f"lr {row['lr']:.2e}", f"{row['epoch_time_s']:.1f}s"]
    return "  ".join(parts)
