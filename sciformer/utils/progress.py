"""The one progress helper: a tqdm bar on a terminal, the bare iterable otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from tqdm import tqdm

T = TypeVar("T")
ProgressMode = Literal["auto", "always", "never"]


def progress_enabled(mode: ProgressMode = "auto") -> bool:
    """Whether a bar shows: ``always``, ``never``, or ``auto`` = when stderr is a terminal."""
    return mode == "always" or (mode == "auto" and sys.stderr.isatty())


def progress(iterable: Iterable[T], desc: str, *, total: int | None = None, mode: ProgressMode = "auto") -> Iterable[T]:
    """``iterable`` wrapped in a tqdm bar (left on screen only while running) when :func:`progress_enabled`.

    ``train.progress`` sets ``mode`` for training and evaluation; data preparation uses ``auto``.
    """
    if not progress_enabled(mode):
        return iterable
    bar: Any = tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True)
    return bar
