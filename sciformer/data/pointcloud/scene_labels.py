"""Labels of scene files as the class table sees them: which raw label ids no class takes, and
the check that a training split holds at least one labelled point before any training step."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from sciformer.data.pointcloud.fields import LOWER16_HINT
from sciformer.errors import DataError


class UnmappedIds:
    """Running count and range of the raw label ids no class of the table takes (over the files read)."""

    def __init__(self) -> None:
        self.count, self.low, self.high = 0, 0, 0

    def add(self, raw: np.ndarray, mapped: np.ndarray) -> None:
        """Note the raw labels (n,) whose class id in ``mapped`` (n,) is the ignore value -1."""
        off = np.asarray(raw).reshape(-1)[np.asarray(mapped).reshape(-1) < 0]  # (m,)
        if off.size:
            lo, hi = int(off.min()), int(off.max())
            self.low, self.high = (lo, hi) if not self.count else (min(self.low, lo), max(self.high, hi))
            self.count += int(off.size)

    def hint(self) -> str:
        """``"; N labels unmapped: ids a..b"`` (with :data:`LOWER16_HINT` for ids of 65536 and up), or ""."""
        if not self.count:
            return ""
        return (f"; {self.count:,} labels unmapped: ids {self.low}..{self.high}"
                + (f"; {LOWER16_HINT}" if self.high >= 1 << 16 else ""))


def check_labelled(labels: Iterable[np.ndarray], scenes: int, hint: Callable[[], str] = str) -> None:
    """Refuse (one-line DataError) a training split none of whose ``scenes`` holds a labelled
    point: every label ignored, the model would never get a gradient. ``labels`` yields each
    scene's class ids (n,) in turn and is read only until one holds an id >= 0 (the first
    scene, as a rule); ``hint()``, asked once every scene was read, says why (or "")."""
    for label in labels:
        if (np.asarray(label) >= 0).any():  # (n,)
            return
    raise DataError(f"data: no training point has a class of data.classes (every label of the {scenes} training "
                    f"scene{'s' if scenes != 1 else ''} is ignored{hint()}); list their label ids under data.classes "
                    "or name a class in data.unmapped")


def check_class_spelling(classes: Any) -> Any:
    """``data.classes`` before its type is applied: every class name a printable, non-blank
    string and every label value an integer (a ValueError naming the class otherwise, instead
    of the type's "Input should be a valid list"); what else it holds is left to the type."""
    for name in classes if isinstance(classes, (dict, list)) else []:
        if isinstance(name, str) and (not name.strip() or not name.isprintable()):
            raise ValueError(f"class name {name!r} is blank or holds a control character; name every class")
    for name, values in classes.items() if isinstance(classes, dict) else []:
        for v in values if isinstance(values, list) else []:
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()) or not isinstance(v, (int, float, str)):
                raise ValueError(f"class '{name}': label value {v!r} is not an integer; label values are integer class ids")
    return classes
