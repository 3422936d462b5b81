"""Devices, seeding and environment facts.

Training needs no generator state in checkpoints: the batch order depends on (seed, epoch),
augmentation on (seed, epoch, sample) and dropout on (seed, step, sample); see
:mod:`sciformer.engine.noise`.
"""

from __future__ import annotations

import os
import platform
import random
import sys
from typing import Any

import numpy as np
import torch

import sciformer
from sciformer.errors import ConfigError


def pick_device(name: str) -> torch.device:
    """``auto`` -> CUDA if present, else CPU; explicit names are checked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: unknown device '{name}'; expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device: '{name}' requested but CUDA is not available on this machine")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """A distinct, reproducible seed for each epoch (shuffling, augmentation, dropout)."""
    return (seed * 1_000_003 + epoch * 7_919) % 2**31


# Intra-op threads for ``train.threads: null``, by the cores this process may use. Measured
# (benchmarks/bench_cpu_threads.py, benchmarks/README.md): on 2 cores one thread trained
# every model measured 1.24-3x faster per step than two (small clouds and patches make many
# small operations, whose OpenMP synchronisation costs more than a second core gains).
# Other core counts are not measured and keep torch's own default.
MEASURED_BEST_THREADS = {1: 1, 2: 1}


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(cores: int | None = None) -> int:
    """Intra-op threads for ``train.threads: null``: the measured best for this many cores."""
    cores = available_cores() if cores is None else cores
    return MEASURED_BEST_THREADS.get(cores, torch.get_num_threads())


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to ``train.threads`` (``None``: :func:`default_threads`), for
    training and inference alike; returns the count set."""
    count = threads if threads is not None else default_threads()
    torch.set_num_threads(count)
    return count


def environment(device: torch.device, seed: int) -> dict[str, Any]:
    """Versions, device and seed recorded in every run folder."""
    info: dict[str, Any] = {
        "sciformer": sciformer.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "seed": seed,
        "command": " ".join(sys.argv),
        "pid": os.getpid(),
    }
    return info
