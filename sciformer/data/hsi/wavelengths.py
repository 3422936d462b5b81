"""Band centres (wavelengths) of hyperspectral cubes, always in nanometres.

Where centres come from, in one place:

- ENVI headers: ``wavelength = {...}`` with ``wavelength units = {...}``; the units are
  converted to nm (:func:`to_nanometres`: nanometres, micrometres, millimetres,
  centimetres, metres, wavenumbers in cm^-1). A header without units (or with
  ``Unknown``) is read by magnitude: all values below 30 are micrometres (no imaging
  sensor has band centres below 30 nm; thermal sensors reach ~14 um), else nanometres.
  ``fwhm = {...}`` (band widths), when present, is converted the same way.
- ``.mat`` / ``.npz`` arrays (``data.wavelength_key``, or an array named like
  ``wavelength``): no units are stored, so the same magnitude rule applies.
- Numbers the user gives (``data.wavelengths`` in the YAML, ``--wavelengths`` on the
  command line, ``wavelengths=`` in the Python API): nanometres; values that all look
  like micrometres are refused (:func:`given_nanometres`).

Every list is checked: finite, positive, one value per band (:func:`check_wavelengths`).
A cube with centres has its bands put in ascending order of centre before anything uses
them (:func:`bands_ascending`); two bands of the same centre are refused.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.errors import DataError
from sciformer.utils.limits import check_npy

MICROMETRE_LIMIT = 30.0  # unit-less centres all below this are micrometres
MAX_TEXT_BYTES = 8 * 2**20  # an ENVI header or a band-centre list (a real one is a few kB; parsing costs ~20x its size)
TOLERANCE_NM = 1.0  # two band sets are the same when every centre agrees within this
MIN_NM, MAX_NM = 10.0, 1e6  # plausible band centres (nm) after unit conversion: extreme UV to far infrared

# ENVI 'wavelength units' spellings -> factor to nm (lower case, spaces removed)
_FACTORS = {
    "nanometers": 1.0, "nanometres": 1.0, "nanometer": 1.0, "nanometre": 1.0, "nm": 1.0,
    "micrometers": 1e3, "micrometres": 1e3, "micrometer": 1e3, "micrometre": 1e3, "microns": 1e3, "micron": 1e3,
    "um": 1e3, "µm": 1e3, "μm": 1e3,
    "millimeters": 1e6, "millimetres": 1e6, "millimeter": 1e6, "millimetre": 1e6, "mm": 1e6,
    "centimeters": 1e7, "centimetres": 1e7, "cm": 1e7,
    "meters": 1e9, "metres": 1e9, "meter": 1e9, "metre": 1e9, "m": 1e9,
}
_WAVENUMBER = ("wavenumber", "wavenumbers", "cm-1", "cm^-1", "1/cm")
_UNKNOWN = ("", "unknown", "<unspecified>", "unspecified", "none")
_NOT_WAVELENGTHS = ("index", "indices", "bandnumber", "band", "bands")
ACCEPTED_UNITS = "Nanometers/nm, Micrometers/um/µm, Millimeters/mm, Centimeters/cm, Meters/m, Wavenumber (cm^-1)"


def check_text_size(path: Path, where: str) -> None:
    """Refuse a header or band-centre list above :data:`MAX_TEXT_BYTES` before it is read (one line)."""
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DataError(f"{where}: {size} bytes; a header or list of band centres is at most {MAX_TEXT_BYTES} bytes (is it a data file?)")


def header_numbers(raw: Any, where: str) -> list[float]:
    """The numbers of an ENVI ``{...}`` field as parsed into strings (a trailing comma allowed); one line
    naming the first entry that is not a number otherwise."""
    items = [str(v).strip() for v in (raw if isinstance(raw, (list, tuple)) else [raw])]
    if len(items) > 1 and not items[-1]:
        items = items[:-1]  # '{400, 500,}'
    out = []
    for item in items:
        try:
            out.append(float(item))
        except ValueError:
            raise DataError(f"{where}: '{item[:20]}' is not a number; expected band centres separated by commas") from None
    return out


def to_nanometres(values: Any, units: str | None, where: str) -> np.ndarray | None:
    """``values`` (B,) in ``units`` as float64 nanometres; None when ``units`` says they are band indices.

    ``units`` None, empty or ``Unknown``: by magnitude (all < 30: micrometres, else nm).
    An unknown unit name is a one-line DataError listing the accepted ones.
    """
    arr = np.asarray(values, dtype=np.float64)
    check_one_column(arr.shape, where)
    arr = arr.reshape(-1)  # (B,)
    if isinstance(units, (list, tuple)) and len(units) == 1:  # 'wavelength units = {Micrometers}'
        units = units[0]
    key = re.sub(r"\s+", "", str(units or "")).lower()
    if key in _NOT_WAVELENGTHS:
        return None
    if key in _UNKNOWN:
        finite = arr[np.isfinite(arr)]
        factor = 1e3 if finite.size and float(np.abs(finite).max()) < MICROMETRE_LIMIT else 1.0
        return arr * factor
    if key in _WAVENUMBER:
        if np.any(arr <= 0):
            raise DataError(f"{where}: wavenumber {float(arr[arr <= 0][0]):g} cm^-1 has no wavelength; "
                            "expected positive wavenumbers")
        with np.errstate(divide="ignore"):
            return np.where(arr > 0, 1e7 / np.where(arr > 0, arr, 1.0), np.nan)  # cm^-1 -> nm
    if key not in _FACTORS:
        raise DataError(f"{where}: wavelength units '{str(units)[:40]}' not understood; expected one of {ACCEPTED_UNITS}")
    return arr * _FACTORS[key]


def check_one_column(shape: tuple[int, ...], where: str, error: type[Exception] = DataError) -> None:
    """Refuse band centres of ``shape`` unless one column ((B,), (B, 1) or (1, B)): a (B, 2) table
    (band numbers and centres, or centres and widths) or a grid is a one-line ``error`` naming ``where``."""
    if sum(n > 1 for n in shape) > 1:
        raise error(f"{where}: a table of shape {tuple(shape)}; expected one column of band centres (nm), one per band")


def check_wavelengths(values: Any, bands: int | None, where: str, error: type[Exception] = DataError, *,
                      plausible: bool = True) -> np.ndarray:
    """``values`` as a float64 (B,) array after the checks every source shares.

    One column, finite, positive, (when ``bands`` is given) exactly one value per band and,
    unless not ``plausible``, :func:`check_plausible`; each failure is a one-line ``error``
    naming ``where``.
    """
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise error(f"{where}: expected a list of numbers (band centres in nm)") from None
    check_one_column(arr.shape, where, error)
    arr = arr.reshape(-1)  # (B,)
    if arr.size == 0:
        raise error(f"{where}: no wavelengths given; expected one band centre (nm) per band")
    if not np.all(np.isfinite(arr)):
        raise error(f"{where}: {int((~np.isfinite(arr)).sum())} wavelength(s) are NaN or infinite; expected finite band centres in nm")
    if np.any(arr <= 0):
        raise error(f"{where}: wavelengths must be positive (nm); found {float(arr.min()):g}")
    if bands is not None and arr.size != bands:
        raise error(f"{where}: {arr.size} wavelengths for a cube of {bands} band{'s' if bands != 1 else ''}; expected one band centre per band")
    return arr if not plausible else check_plausible(arr, where, error)


def check_plausible(arr: np.ndarray, where: str, error: type[Exception] = DataError) -> np.ndarray:
    """``arr`` (B,) nm after checking every centre lies in :data:`MIN_NM`..:data:`MAX_NM` and none repeats."""
    if float(arr.min()) < MIN_NM or float(arr.max()) > MAX_NM:
        bad = float(arr.min()) if float(arr.min()) < MIN_NM else float(arr.max())
        raise error(f"{where}: band centre {bad:.15g} nm lies outside {MIN_NM:g}-{MAX_NM:g} nm; are the units right?")
    if np.unique(arr).size != arr.size:
        ordered = np.sort(arr)
        twice = float(ordered[np.nonzero(np.diff(ordered) == 0)[0][0]])
        raise error(f"{where}: band centre {twice:g} nm is given more than once; each band needs its own centre")
    return arr


def given_nanometres(values: Any, bands: int | None, where: str, error: type[Exception] = DataError) -> np.ndarray:
    """Wavelengths a user typed (YAML, ``--wavelengths``, API): checked, in nm, never micrometres."""
    arr = check_wavelengths(values, bands, where, error, plausible=False)
    if float(arr.max()) < MICROMETRE_LIMIT:
        raise error(f"{where}: values {float(arr.min()):g}..{float(arr.max()):g} look like micrometres; "
                    "give band centres in nanometres (multiply by 1000)")
    return check_plausible(arr, where, error)


def same_wavelengths(a: np.ndarray | None, b: np.ndarray | None, tol: float = TOLERANCE_NM) -> bool:
    """True when both band sets have the same count and every centre agrees within ``tol`` nm."""
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol + 1e-6 * np.maximum(1.0, np.abs(a))))  # + rounding (float32 centres in checkpoints)


def ascending_order(wl: np.ndarray, where: str, error: type[Exception] = DataError) -> np.ndarray | None:
    """The stable permutation that puts bands in ascending order of centre (None: already so).

    Neighbouring bands are grouped into tokens and the normaliser is read along the
    spectrum, so a cube's bands always go in ascending order of centre (a Wavenumber header
    lists them descending in nm). Two bands of exactly the same centre are a one-line
    ``error`` naming ``where``.
    """
    wl = np.asarray(wl, dtype=np.float64).reshape(-1)
    order = np.argsort(wl, kind="stable")
    same = np.nonzero(np.diff(wl[order]) == 0)[0]
    if same.size:
        i, j = sorted(int(k) for k in order[same[0] : same[0] + 2])
        raise error(f"{where}: bands {i} and {j} have the same centre ({wl[i]:g} nm); each band needs its own centre")
    return None if np.array_equal(order, np.arange(wl.size)) else order


def bands_ascending(cube: np.ndarray, wl: np.ndarray | None, where: str,
                    error: type[Exception] = DataError) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``cube`` (H, W, B) and its centres ``wl`` (B,) with the bands in ascending order of centre
    (:func:`ascending_order`), and the permutation applied (None: none was needed)."""
    if wl is None:
        return cube, None, None
    order = ascending_order(wl, where, error)
    if order is None:
        return cube, np.asarray(wl, dtype=np.float64), None
    return np.ascontiguousarray(np.take(cube, order, axis=-1)), np.asarray(wl, dtype=np.float64)[order], order


def describe(wl: np.ndarray | None) -> str:
    """``'200 bands, 400.0-2499.0 nm'`` (``'1 band, 646.7 nm'``) for messages."""
    if wl is None:
        return "no wavelengths"
    if wl.size == 1:
        return f"1 band, {float(wl[0]):.1f} nm"
    return f"{wl.size} bands, {float(wl.min()):.1f}-{float(wl.max()):.1f} nm"


def read_wavelength_spec(spec: str | Sequence[float] | np.ndarray, where: str = "--wavelengths") -> np.ndarray:
    """The band centres (nm) a ``--wavelengths`` value names.

    ``spec`` is a list of numbers (nm), an inline ``'400,410,...'`` string, or a file:
    ``.hdr`` (its ``wavelength`` and ``wavelength units``), ``.npy``, or text with numbers
    separated by commas, spaces or new lines (nm).
    """
    if not isinstance(spec, str):
        return given_nanometres(spec, None, where)
    text = spec.strip()
    if re.fullmatch(r"[\s,;0-9.eE+-]+|[\s,;0-9.eE+naNifINF-]+", text) and re.search(r"[\s,;]", text):  # '400,410,...' (not a file '400')
        try:
            values = [float(t) for t in re.split(r"[\s,;]+", text) if t]
        except ValueError:
            values = []
        if values:
            return given_nanometres(values, None, where)
    try:
        path = Path(text).expanduser()
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        is_file = False
    if is_file:
        return _read_wavelength_file(path, where)
    if re.fullmatch(r"[0-9.eE+-]+", text):  # one band centre, for a one-band cube ('550'; a file of that name was read above)
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is not None:
            return given_nanometres([value], None, where)
    raise DataError(f"{where} '{text[:60]}': neither a file nor a comma-separated list of band centres in nm")


def _read_wavelength_file(path: Path, where: str) -> np.ndarray:
    label = f"{where} {path}"
    suffix = path.suffix.lower()
    check_text_size(path, label)
    if suffix == ".hdr":
        from spectral.io.envi import read_envi_header

        from sciformer.data.hsi.envi_text import readable_header

        try:
            with warnings.catch_warnings():  # mixed-case keys: a two-line UserWarning
                warnings.simplefilter("ignore", UserWarning)
                with readable_header(path, None) as (text_header, _):  # BOM / cp1252 headers: a UTF-8 copy
                    header = read_envi_header(str(text_header))
        except Exception as exc:  # noqa: BLE001 - any parse failure is a bad header
            raise DataError(f"{label}: not a readable ENVI header ({' '.join(str(exc).split())[:120]})") from None
        if "wavelength" not in header:
            raise DataError(f"{label}: the header has no 'wavelength = {{...}}' field")
        raw = header_numbers(header["wavelength"], f"{label}: header field 'wavelength'")
        wl = to_nanometres(raw, header.get("wavelength units"), label)
        if wl is None:
            raise DataError(f"{label}: 'wavelength units = Index' gives band numbers, not band centres")
        return check_wavelengths(wl, None, label)
    try:
        if suffix == ".npy":
            check_npy(path)  # the magic and a numeric dtype first
            values = np.load(path, allow_pickle=False)
        else:
            text = path.read_text()
            rows = [r for r in (re.split(r"[\s,;]+", line.strip()) for line in text.splitlines()) if r != [""]]
            if len(rows) > 1 and all(len([t for t in r if t]) == len([t for t in rows[0] if t]) > 1 for r in rows):
                raise DataError(f"{label}: a table of {len(rows)} rows of {len([t for t in rows[0] if t])} numbers; "
                                "expected one band centre (nm) per line, or one line of centres")
            values = [float(t) for t in re.split(r"[\s,;]+", text) if t]
    except DataError:
        raise
    except (OSError, ValueError) as exc:
        raise DataError(f"{label}: cannot read band centres ({' '.join(str(exc).split())[:120]}); "
                        "expected .hdr, .npy or numbers in nm separated by commas or spaces") from None
    return given_nanometres(values, None, label)
