"""What a run started from ``sciformer pretrain`` weights says and records about them.

Kept apart from :mod:`sciformer.engine.pretrain` so that the trainer depends on it alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def train_pixels_digest(task: Any) -> str | None:
    """SHA-256 of a hyperspectral task's training-pixel mask (which pixels fit the normalisation)."""
    split = getattr(task, "split", None)
    if split is None:
        return None
    train = np.ascontiguousarray(split.maps()["train"] > 0)  # (H, W) bool
    return hashlib.sha256(str(train.shape).encode() + train.tobytes()).hexdigest()


def pretrain_note(init_record: dict[str, Any] | None, task: Any) -> str | None:
    """What a fine-tuning run should say about an encoder that ``sciformer pretrain`` wrote (None otherwise)."""
    pre = (init_record or {}).get("pretrain")
    if not pre:
        return None
    if pre.get("pixels") == "all":
        return (f"note: the encoder was pre-trained without labels on every pixel of '{pre.get('source')}', test pixels included "
                "(a transductive protocol: declare it with the results)")
    if pre.get("train_pixels_sha256") != train_pixels_digest(task):
        return (f"note: the encoder was pre-trained on the training pixels of another split (seed {pre.get('seed')}, "
                f"'{pre.get('source')}'); on this scene some of them may be this run's validation or test pixels")
    return None
