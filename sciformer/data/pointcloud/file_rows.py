"""Rows of a scene's file that its reader left out (points without finite coordinates or
features), and the file row of each loaded point: predictions and error messages speak in
file rows (:meth:`~sciformer.data.pointcloud.scenes.SceneSource.left_out_rows`)."""

from __future__ import annotations

import numpy as np


def file_rows(pred: np.ndarray, left_out: tuple[np.ndarray, int] | None) -> np.ndarray:
    """Predictions of a scene's loaded points laid out on every row of its file, -1 on the
    rows left out (``left_out``: those rows and the file's row count, or None).

    Shapes: pred (n,) -> (rows,) int64
    """
    if left_out is None:
        return pred
    out = np.full(left_out[1], -1, dtype=np.int64)  # (rows,)
    out[loaded_file_rows(left_out)] = pred
    return out


def loaded_file_rows(left_out: tuple[np.ndarray, int] | None) -> np.ndarray | None:
    """The file row of each loaded point (``left_out``: the rows left out and the file's row
    count; None: every row loaded, the rows are the points' positions).

    Shapes: -> (n,) int64, n = row count - left-out rows
    """
    if left_out is None:
        return None
    rows, total = left_out
    keep = np.ones(total, dtype=bool)
    keep[rows] = False
    return np.flatnonzero(keep)
