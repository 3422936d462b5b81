"""What a fine-tuning run (``train.init_from``) says about the weights it started from:
how ``sciformer pretrain`` trained them, and a change of band placement.

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


def placement_note(init_record: dict[str, Any] | None, task: Any, position_source: Any) -> str | None:
    """A note when the loaded weights placed bands otherwise than this run does (wavelength, band index, PCA)."""
    from sciformer.data.hsi.bandmatch import band_placement

    before = (init_record or {}).get("band_placement")
    now = band_placement(task.state(), position_source)
    if before is None or now is None or before == now:
        return None
    return (f"note: the loaded weights placed bands by {before}, this run places them by {now}: their band positions "
            "mean other bands here (the encoder still transfers; the positions are relearned)")


def init_notes(init_record: dict[str, Any] | None, task: Any, position_source: Any) -> list[str]:
    """Every note a fine-tuning run prints about the weights it loaded."""
    return [n for n in (pretrain_note(init_record, task), placement_note(init_record, task, position_source)) if n]
