"""Devices, seeding, RNG state capture and environment facts."""

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


def capture_rng() -> dict[str, Any]:
    """RNG states as weights_only-safe data (tensors, lists, ints)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(_to_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(obj: Any) -> Any:
    return [_to_lists(o) for o in obj] if isinstance(obj, (tuple, list)) else obj


def _to_tuples(obj: Any) -> Any:
    return tuple(_to_tuples(o) for o in obj) if isinstance(obj, list) else obj


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
