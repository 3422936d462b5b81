"""No-data pixels of hyperspectral cubes: found once, never classified, never in a neighbour's patch.

A pixel is no-data when any band is NaN or infinite, or when every band equals the file's
declared no-data value (ENVI ``data ignore value``, GeoTIFF ``nodata``). Such pixels are
filled with the normaliser's shift (0 once normalised: the training mean for ``standard``)
before normalising, so they neither fail nor disturb their neighbours' patches; ``predict``
gives them label 0 (unclassified) and NaN probabilities, and training refuses labelled ones.
"""

from __future__ import annotations

import numpy as np

from sciformer.errors import DataError

_ROWS = 256  # rows per chunk (bounded temporaries on large scenes)


def nodata_pixels(cube: np.ndarray, value: float | None = None) -> np.ndarray:
    """(H, W) bool: pixels with a non-finite band, or equal to ``value`` in every band.

    Shapes:
        cube: (H, W, B) -> (H, W)
    """
    h, w = cube.shape[:2]
    out = np.zeros((h, w), dtype=bool)
    check_value = value is not None and np.isfinite(value)
    if cube.dtype.kind != "f" and not check_value:
        return out
    for r in range(0, h, _ROWS):
        block = cube[r : r + _ROWS]
        bad = out[r : r + _ROWS]
        if cube.dtype.kind == "f":
            bad |= ~np.isfinite(block).all(axis=-1)
        if check_value:
            bad |= (block == value).all(axis=-1)
    return out


def fill_nodata(cube: np.ndarray, mask: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """A copy of ``cube`` whose ``mask`` pixels hold ``fill`` (B,) (``cube`` itself when none is masked).

    Shapes:
        cube: (H, W, B), mask: (H, W), fill: (B,) -> (H, W, B) float
    """
    if not mask.any():
        return cube
    out = cube.astype(np.result_type(cube.dtype, np.float32))
    out[mask] = np.asarray(fill, dtype=np.float64)
    return out


def refuse_labelled_nodata(mask: np.ndarray, labelled: np.ndarray, where: str, value: float | None) -> None:
    """One line when a labelled pixel is no-data (its class would be learnt from nothing)."""
    bad = mask & labelled
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        what = "NaN/Inf in a band" + ("" if value is None or not np.isfinite(value) else f", or {value:g} (the file's no-data value) in every band")
        raise DataError(f"{where}: {int(bad.sum())} labelled pixel(s) are no-data ({what}; first at row {r}, column {c}); "
                        "set them to 0 (unlabelled) in the label map or fix the cube")
