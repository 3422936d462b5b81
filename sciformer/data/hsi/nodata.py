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


def bad_bands(cube: np.ndarray, listed: np.ndarray | None, file_band: np.ndarray | None = None,
              zeros: bool = False) -> tuple[np.ndarray, str]:
    """(B,) bool: the bands an ENVI header's ``bbl`` marks bad (``listed``), non-finite on every pixel,
    or with ``zeros`` 0 on every pixel (a dead or zero-filled detector band); and what they are, for a
    note (``''`` when none), numbered as the file's bands (``file_band``: the file's band of each of
    the cube's, when they were put in another order).

    Shapes:
        cube: (H, W, B), listed: (B,), file_band: (B,) -> (B,)
    """
    b = cube.shape[-1]
    listed = np.zeros(b, dtype=bool) if listed is None else np.asarray(listed, dtype=bool)
    empty = np.zeros(b, dtype=bool)
    zero = np.full(b, bool(zeros and cube.size))
    if cube.size and (cube.dtype.kind == "f" or zeros):
        empty[:] = cube.dtype.kind == "f"
        for r in range(0, cube.shape[0], _ROWS):
            rows = cube[r : r + _ROWS]  # (rows, W, B)
            if cube.dtype.kind == "f":
                empty &= ~np.isfinite(rows).any(axis=(0, 1))
            if zeros:
                zero &= ~(rows != 0).any(axis=(0, 1))  # NaN != 0: a NaN band is not a zero band
    parts = [f"{what}: band(s) {_numbers(np.nonzero(flag)[0], file_band)} of the file (1-based)" for what, flag in
             (("ENVI bbl = 0", listed), ("NaN/Inf on every pixel", empty & ~listed),
              ("0 on every pixel", zero & ~listed & ~empty)) if flag.any()]
    return listed | empty | zero, "; ".join(parts)


def nodata_warning(cube: np.ndarray, mask: np.ndarray, where: str, file_band: np.ndarray | None = None) -> str | None:
    """One line when more than half the pixels are no-data, naming the bands non-finite on most of the
    other pixels (a bad band), or saying the pixels are NaN in every band (fill outside the image);
    None otherwise. ``file_band`` numbers the bands as the file does (see :func:`bad_bands`).

    Shapes:
        cube: (H, W, B), mask: (H, W), file_band: (B,) -> str | None
    """
    if not mask.size or mask.mean() <= 0.5:
        return None
    line = f"WARNING: {where}: {int(mask.sum())} of {mask.size} pixels are no-data and left unclassified"
    if cube.dtype.kind != "f":
        return line + " (the file's no-data value in every band)"
    counts = np.zeros(cube.shape[-1], dtype=np.int64)  # (B,) non-finite pixels per band, fill pixels aside
    fill = 0  # pixels non-finite in every band
    for r in range(0, cube.shape[0], _ROWS):
        bad = ~np.isfinite(cube[r : r + _ROWS])  # (rows, W, B)
        everywhere = bad.all(axis=-1)  # (rows, W)
        fill += int(everywhere.sum())
        counts += bad[~everywhere].sum(axis=0)
    advice = "(1-based); a bad band? mark it 0 in the header's bbl or drop it"
    worst = np.nonzero(counts > 0.5 * (mask.size - fill))[0]  # on most of the pixels the image covers
    if worst.size:
        return line + f": NaN/Inf in band(s) {_numbers(worst, file_band)} {advice}"
    if fill:
        return line + f" ({fill} of them NaN/Inf in every band: fill outside the image, not a bad band)"
    if counts.any():
        return line + f": NaN/Inf in band(s) {_numbers(np.array([int(counts.argmax())]), file_band)} {advice}"
    return line + " (the file's no-data value in every band)"


def _numbers(idx: np.ndarray, file_band: np.ndarray | None = None) -> str:
    """1-based band numbers of the 0-based ``idx``: ``'104, 105'`` (the first 8, then a count); the
    file's band numbers where ``file_band`` (B,) gives the file's band of each index."""
    if file_band is not None:
        idx = np.sort(np.asarray(file_band)[idx])
    shown = ", ".join(str(int(i) + 1) for i in idx[:8])
    return shown + (f" and {idx.size - 8} more" if idx.size > 8 else "")
