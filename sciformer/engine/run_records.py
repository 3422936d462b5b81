"""What a training run records beside its checkpoints: the epoch's console line, TensorBoard scalars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sciformer.errors import SciformerError


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
