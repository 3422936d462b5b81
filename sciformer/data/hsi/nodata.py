"""No-data pixels of hyperspectral cubes: found once, never classified, never in a neighbour's patch.

A pixel is no-data when any band is NaN or infinite, or when every band equals the file's
declared no-data value (ENVI ``data ignore value``, GeoTIFF ``nodata``). Such pixels are
filled with the normaliser's shift (0 once normalised: the training mean for ``standard``)
before normalising, so they neither fail nor disturb their neighbours' patches; ``predict``
gives them label 0 (unclassified) and NaN probabilities, and training refuses labelled ones.
A band NaN on every pixel, or marked 0 in an ENVI ``bbl``, is a bad band (:func:`bad_bands`):
``predict`` leaves it out for a model placing bands by wavelength rather than lose every pixel.
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


def bad_bands(cube: np.ndarray, listed: np.ndarray | None) -> tuple[np.ndarray, str]:
    """(B,) bool: the bands an ENVI header's ``bbl`` marks bad (``listed``), or non-finite on every
    pixel; and what they are, for a note (``''`` when none).

    Shapes:
        cube: (H, W, B), listed: (B,) -> (B,)
    """
    b = cube.shape[-1]
    listed = np.zeros(b, dtype=bool) if listed is None else np.asarray(listed, dtype=bool)
    empty = np.zeros(b, dtype=bool)
    if cube.dtype.kind == "f" and cube.size:
        empty = np.ones(b, dtype=bool)
        for r in range(0, cube.shape[0], _ROWS):
            empty &= ~np.isfinite(cube[r : r + _ROWS]).any(axis=(0, 1))
    parts = [f"{what}: band(s) {_numbers(np.nonzero(flag)[0])} of the file (1-based)" for what, flag in
             (("ENVI bbl = 0", listed), ("NaN/Inf on every pixel", empty & ~listed)) if flag.any()]
    return listed | empty, "; ".join(parts)


def nodata_warning(cube: np.ndarray, mask: np.ndarray, where: str) -> str | None:
    """One line when more than half the pixels are no-data, naming the bands non-finite on most of them
    (None otherwise).

    Shapes:
        cube: (H, W, B), mask: (H, W) -> str | None
    """
    if not mask.size or mask.mean() <= 0.5:
        return None
    line = f"WARNING: {where}: {int(mask.sum())} of {mask.size} pixels are no-data and left unclassified"
    if cube.dtype.kind != "f":
        return line + " (the file's no-data value in every band)"
    counts = np.zeros(cube.shape[-1], dtype=np.int64)  # (B,) non-finite pixels per band
    for r in range(0, cube.shape[0], _ROWS):
        counts += (~np.isfinite(cube[r : r + _ROWS])).sum(axis=(0, 1))
    if not counts.any():
        return line + " (the file's no-data value in every band)"
    worst = np.nonzero(counts > 0.5 * mask.size)[0]
    worst = worst if worst.size else np.array([int(counts.argmax())])
    return line + f": NaN/Inf in band(s) {_numbers(worst)} (1-based); a bad band? mark it 0 in the header's bbl or drop it"


def _numbers(idx: np.ndarray) -> str:
    """1-based band numbers of the 0-based ``idx``: ``'104, 105'`` (the first 8, then a count)."""
    shown = ", ".join(str(int(i) + 1) for i in idx[:8])
    return shown + (f" and {idx.size - 8} more" if idx.size > 8 else "")
