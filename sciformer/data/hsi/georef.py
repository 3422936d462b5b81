"""Georeference of hyperspectral scenes, carried from an input to its maps (ENVI and GeoTIFF).

A *georef* is a plain dict carried from an input scene to its classification maps::

    {"transform": [a, b, c, d, e, f],        # x = a*col + b*row + c, y = d*col + e*row + f (pixel corners)
     "crs_wkt": "PROJCS[...]" or None,        # the coordinate reference system as WKT
     "map_info": ["UTM", "1", "1", ...],      # ENVI 'map info' as read (kept verbatim for ENVI outputs)
     "coordinate_system_string": "...",       # ENVI 'coordinate system string' (WKT)
     "crs_note": "..."}                       # why an ENVI 'map info' gives no crs_wkt (ENVI inputs only)

ENVI inputs give ``map_info`` / ``coordinate_system_string`` (and the transform derived from
them, ``rotation=`` included; a ``map info`` alone gives the CRS GDAL reads from it,
:mod:`sciformer.data.hsi.envi_crs`); GeoTIFF inputs give ``transform`` / ``crs_wkt``. ENVI
outputs write the ENVI keys, GeoTIFF outputs the transform and CRS; each is derived
from the other when missing. A georeference an output cannot carry whole (a sheared
transform in ENVI, a coordinate system without a transform) is dropped with a one-line
warning (:func:`writable_georef`), never written in part.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from sciformer.data.hsi.envi_crs import crs_of_map_info, envi_units
from sciformer.data.hsi.geotiff import GEOTIFF_SUFFIXES, _rasterio, read_geotiff_georef
from sciformer.errors import DataError


def georef_of(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The georeference of an input scene file (ENVI header or GeoTIFF), None when it has none."""
    path = Path(path)
    if path.suffix.lower() in GEOTIFF_SUFFIXES:
        georef = read_geotiff_georef(path)
        return georef if georef.get("crs_wkt") or georef.get("transform") != [1.0, 0.0, 0.0, 0.0, 1.0, 0.0] else None
    header = envi_header_of(path)
    return georef_from_envi_header(header) if header is not None else None


def check_same_grid(image: str | os.PathLike[str], labels: str | os.PathLike[str], what: str = "label map") -> None:
    """A one-line DataError when ``image`` and ``labels`` both carry a georeference and their
    coordinate systems or transforms differ (pixel (i, j) of one would be paired with another
    place on the ground). Files without a georeference are paired by pixel, unchecked."""
    a, b = georef_of(image), georef_of(labels)
    if not a or not b:
        return
    ta, tb = a.get("transform"), b.get("transform")
    if ta and tb:
        size = max(abs(float(v)) for i, v in enumerate(ta) if i in (0, 1, 3, 4)) or 1.0
        steps = max(abs(float(ta[i]) - float(tb[i])) for i in (0, 1, 3, 4))
        origin = max(abs(float(ta[i]) - float(tb[i])) for i in (2, 5))
        if steps > 1e-6 * size or origin > 1e-3 * size:
            raise DataError(f"{labels}: the {what}'s grid (transform {_short(tb)}) is not the image's, {image} "
                            f"(transform {_short(ta)}); resample it onto the image's grid")
    ca, cb = a.get("crs_wkt"), b.get("crs_wkt")
    if ca and cb and not _same_crs(ca, cb):
        raise DataError(f"{labels}: the {what}'s coordinate system ({_crs_name(cb)}) is not the image's, {image} "
                        f"({_crs_name(ca)}); reproject it onto the image's grid")


def _short(transform: list[float]) -> list[float]:
    return [float(f"{float(v):.10g}") for v in transform]


def _same_crs(a: str, b: str) -> bool:
    try:
        crs = _rasterio().crs.CRS
        return bool(crs.from_wkt(a) == crs.from_wkt(b))
    except Exception:  # noqa: BLE001 - no rasterio, or a WKT it cannot parse: compare the text
        return " ".join(a.split()) == " ".join(b.split())


def _crs_name(wkt: str) -> str:
    try:
        crs = _rasterio().crs.CRS.from_wkt(wkt)
        epsg = crs.to_epsg()
        return f"EPSG:{epsg}" if epsg else str(crs.to_dict().get("proj") or wkt[:40])
    except Exception:  # noqa: BLE001
        return wkt[:40]


def envi_header_of(path: Path) -> Path | None:
    """The ENVI header of ``path`` (itself, ``<path>.hdr`` or ``<stem>.hdr``), if any."""
    if path.suffix.lower() == ".hdr":
        return path
    for cand in (Path(str(path) + ".hdr"), path.with_suffix(".hdr"), path.with_suffix(".HDR")):
        if cand.is_file():
            return cand
    return None


def georef_from_envi_header(header: Path) -> dict[str, Any] | None:
    """``map info`` / ``coordinate system string`` of an ENVI header (None when it has neither)."""
    from spectral.io import envi

    try:
        with warnings.catch_warnings():  # mixed-case keys: a two-line UserWarning
            warnings.simplefilter("ignore", UserWarning)
            meta = envi.read_envi_header(str(header))
    except Exception:  # noqa: BLE001 - the reader reports a bad header itself; no georef here
        return None
    map_info = meta.get("map info")
    css = meta.get("coordinate system string")
    if map_info is None and css is None:
        return None
    if isinstance(css, list):
        css = ",".join(css)
    georef: dict[str, Any] = {"map_info": [str(v).strip() for v in map_info] if map_info else None,
                              "coordinate_system_string": css, "crs_wkt": css, "transform": None}
    if georef["map_info"]:
        georef["transform"] = transform_from_map_info(georef["map_info"])
        if georef["crs_wkt"] is None:  # the map info alone, as GDAL reads it (or why it cannot be carried)
            projection_info = meta.get("projection info")
            georef["crs_wkt"], georef["crs_note"] = crs_of_map_info(
                georef["map_info"], [str(v).strip() for v in projection_info] if isinstance(projection_info, list) else None)
    return georef


def _rotation(map_info: list[str]) -> float | None:
    """The ``rotation=<degrees>`` of an ENVI ``map info`` (0 when absent; None when not a number)."""
    for v in map_info:
        key, _, value = str(v).partition("=")
        if value and key.strip().lower() == "rotation":
            try:
                return float(value)
            except ValueError:
                return None
    return 0.0


def transform_from_map_info(map_info: list[str]) -> list[float] | None:
    """Affine ``[a, b, c, d, e, f]`` of an ENVI ``map info`` (None for bad values).

    ``map info = {proj, ref col, ref row, ref x, ref y, pixel x, pixel y, ..., rotation=<deg>}``;
    reference pixel (1, 1) is the upper-left corner of the upper-left pixel, which lies at
    (ref x, ref y). ``rotation`` turns the grid counter-clockwise by that angle (as GDAL reads it):
    a column step is ``pixel x * (cos, sin)``, a row step ``pixel y * (sin, -cos)``; except at
    exactly 180 degrees, which GDAL reads as a south-up grid (``pixel y`` added per row).
    """
    theta = _rotation(map_info)
    try:
        ref_col, ref_row, x, y, sx, sy = (float(v) for v in map_info[1:7])
    except (ValueError, IndexError):
        return None
    if theta is None or not all(math.isfinite(v) for v in (ref_col, ref_row, x, y, sx, sy, theta)):
        return None
    if abs(math.remainder(theta, 360.0)) == 180.0:  # GDAL reads exactly 180 as a south-up grid, not a turn
        a, b, d, e = sx, 0.0, 0.0, sy
    else:
        cos, sin = (1.0, 0.0) if theta == 0 else (math.cos(math.radians(theta)), math.sin(math.radians(theta)))
        a, b, d, e = sx * cos, sy * sin, sx * sin, -sy * cos
    return [a, b, x - (ref_col - 1.0) * a - (ref_row - 1.0) * b, d, e, y - (ref_col - 1.0) * d - (ref_row - 1.0) * e]


def map_info_numbers(transform: list[float]) -> tuple[float, float, float] | None:
    """(pixel x, pixel y, rotation in degrees) of an affine that ENVI ``map info`` can express
    (a grid turned by a rotation, square or not, not mirrored, or a south-up grid as ``rotation=180``);
    None for a sheared or mirrored one, and for a turn of exactly 180 degrees (GDAL would read it as south-up)."""
    a, b, _, d, e, _ = (float(v) for v in transform)
    sx, sy = math.hypot(a, d), math.hypot(b, e)
    if not (sx > 0 and sy > 0):
        return None
    if b == d == 0.0 and a > 0 and e > 0:  # south-up: what GDAL reads from rotation=180
        return float(f"{sx:.15g}"), float(f"{sy:.15g}"), 180.0
    theta = math.atan2(d, a)
    if abs(b - sy * math.sin(theta)) > 1e-9 * sy or abs(e + sy * math.cos(theta)) > 1e-9 * sy:
        return None
    degrees = float(f"{math.degrees(theta):.12g}")  # 15.0, not 14.999999999999998
    if abs(degrees) == 180.0:  # a grid turned by exactly 180: rotation=180 would be read back as south-up
        return None
    return float(f"{sx:.15g}"), float(f"{sy:.15g}"), 0.0 if abs(degrees) < 1e-9 else degrees


def writable_georef(georef: dict[str, Any] | None, output: Path) -> dict[str, Any] | None:
    """``georef`` as it can be written to the map ``output`` (by its suffix), or None, with a
    one-line warning on stderr, where it cannot be written whole: a ``map info`` without a usable
    transform (tie point or pixel size not finite numbers) for any map; a sheared or mirrored
    transform (which no ENVI ``map info`` expresses) for an ENVI map; a coordinate system without
    a usable transform for a GeoTIFF map. A coordinate system is never written with another transform.
    A GeoTIFF map of an ENVI ``map info`` of which GDAL makes no coordinate system (``crs_note`` says
    why) keeps the transform, with a one-line warning that the coordinate system is not carried."""
    suffix = output.suffix.lower()
    if not georef or suffix not in (".hdr", ".img", *GEOTIFF_SUFFIXES):
        return georef
    transform = georef.get("transform")
    if georef.get("map_info") and not transform:  # non-finite or missing numbers: placed nowhere, in any format
        numbers = ", ".join(str(v)[:20] for v in georef["map_info"][1:7])
        why = f"its 'map info' gives no usable transform (tie point and pixel size {{{numbers}}} must be finite numbers)"
    elif suffix in (".hdr", ".img"):
        if georef.get("map_info") or not transform or map_info_numbers(transform) is not None:
            return georef  # the input's ENVI keys as read, or a map info made from the transform
        why = (f"its transform {[float(f'{v:.6g}') for v in transform]} is sheared or mirrored, which ENVI "
               "'map info' cannot express (write a .tif to keep it)")
    else:
        if transform and georef.get("crs_note") and not georef.get("crs_wkt"):
            print(f"WARNING: {output.name} is written with the input's transform but without its coordinate system: "
                  f"{georef['crs_note']}", file=sys.stderr)
            return georef
        if transform or not georef.get("crs_wkt"):
            return georef
        why = "it has no usable transform, and a coordinate system alone would place the map at the origin"
    print(f"WARNING: {output.name} is written without the input's georeference: {why}", file=sys.stderr)
    return None


def envi_metadata(georef: dict[str, Any] | None) -> dict[str, Any]:
    """ENVI header keys of a georef: its own ``map info`` when it has one, else one from the
    transform (with ``rotation=`` for a turned grid); neither key for a transform that ``map info``
    cannot express (:func:`writable_georef` warns of it)."""
    if not georef:
        return {}
    out: dict[str, Any] = {}
    css = georef.get("coordinate_system_string") or georef.get("crs_wkt")
    if georef.get("map_info"):
        out["map info"] = list(georef["map_info"])
    elif georef.get("transform"):
        numbers = map_info_numbers(georef["transform"])
        if numbers is None:
            return {}  # a coordinate system without its transform would place the map wrongly
        sx, sy, degrees = numbers
        _, _, c, _, _, f = georef["transform"]
        name, units = "Arbitrary", None  # no coordinate system: no unit to state
        if css:
            with contextlib.suppress(Exception):  # an unusual CRS still travels as the WKT string
                crs = _rasterio().crs.CRS.from_wkt(css)
                name = "Geographic Lat/Lon" if crs.is_geographic else (crs.to_dict().get("proj", "Arbitrary") or "Arbitrary")
                name = "UTM" if str(name).lower() == "utm" else name
                units = envi_units(crs)  # GDAL applies it over the string: the system's own unit, never another
        out["map info"] = [name, "1", "1", repr(float(c)), repr(float(f)), repr(sx), repr(sy), *([units] if units else []),
                           *([f"rotation={degrees!r}"] if degrees else [])]
    if css:
        out["coordinate system string"] = "{" + str(css) + "}"
    return out
