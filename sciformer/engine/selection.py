"""Which validation makes ``best.pt``: the monitored metric, a tie broken by the validation loss.

On a small or easy validation split the metric saturates (OA reaches 100 % early and
stays there), so "the first epoch that got there" would choose the checkpoint. Here an
equal metric (exact equality: OA, AA, kappa and mIoU are ratios of counts, so equal
confusion counts give equal values) wins when its validation loss is lower than that of
the current ``best.pt``. A tie-broken improvement is an improvement like any other: it
replaces ``best.pt`` and resets ``train.early_stop_patience``.

The best record, stored in every checkpoint, is ``{"metric", "value", "epoch", "loss"}``;
checkpoints written before ``loss`` was recorded take it from their history row of the
best epoch (none there: ties keep the earlier checkpoint, as they did before).

A validation whose loss is NaN (batches without a labelled sample add no loss, so a NaN
means the model gave non-finite logits on some sample) never becomes ``best.pt``: the
arg-max of NaN scores is class 0, not a prediction, so the trainer records its metrics as
NaN. A best record with a NaN loss (written before this rule) yields to any finite one.
"""

from __future__ import annotations

import math
from typing import Any


def new_best(metric: str) -> dict[str, Any]:
    """The best record of a run that has not validated yet."""
    return {"metric": metric, "value": None, "epoch": -1, "loss": None}


def _finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def improves(best: dict[str, Any], value: float, loss: float | None) -> bool:
    """Whether a validation scoring ``value`` (of ``best['metric']``) with mean ``loss`` replaces best.pt."""
    if not math.isfinite(value) or _is_nan(loss):
        return False
    top = best.get("value")
    if top is None:
        return True
    new_nan, old_nan = _is_nan(loss), _is_nan(best.get("loss"))
    if new_nan != old_nan:  # a finite validation loss beats a NaN one, never the reverse
        return old_nan
    if best["metric"] == "loss":
        return value < top
    if value != top:
        return value > top
    old, new = _finite(best.get("loss")), _finite(loss)
    return old is not None and new is not None and new < old


def restore_best(best: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """A checkpoint's best record with its validation loss (from the best epoch's history row when absent)."""
    out = dict(best)
    loss = _finite(out.get("loss"))
    if loss is None:
        row = next((r for r in history if r.get("epoch") == out.get("epoch")), None)
        loss = _finite(row.get("val_loss")) if row is not None else None
    out["loss"] = loss
    return out


def stopped_early(best: dict[str, Any], history: list[dict[str, Any]], patience: int | None, val_every: int) -> bool:
    """Whether ``train.early_stop_patience`` ends the run after its last recorded epoch: that epoch
    validated without replacing best.pt, ``patience`` validations (``patience * val_every``
    epochs) after the best one. The one rule for the epoch loop and for ``--resume`` of a run
    stopped there (killed in its final evaluation, or finished), which then trains no further."""
    if not patience or not history:
        return False
    row = history[-1]
    epoch = row.get("epoch")
    return "val_loss" in row and isinstance(epoch, int) and epoch != best["epoch"] and epoch - best["epoch"] >= patience * val_every
