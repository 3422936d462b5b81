"""Georeference of hyperspectral scenes, carried from an input to its maps (ENVI and GeoTIFF).

A *georef* is a plain dict carried from an input scene to its classification maps::

    {"transform": [a, b, c, d, e, f],        # x = a*col + b*row + c, y = d*col + e*row + f (pixel corners)
     "crs_wkt": "PROJCS[...]" or None,        # the coordinate reference system as WKT
     "map_info": ["UTM", "1", "1", ...],      # ENVI 'map info' as read (kept verbatim for ENVI outputs)
     "coordinate_system_string": "..."}       # ENVI 'coordinate system string' (WKT)

ENVI inputs give ``map_info`` / ``coordinate_system_string`` (and a transform derived from
them when the map is not rotated); GeoTIFF inputs give ``transform`` / ``crs_wkt``. ENVI
outputs write the ENVI keys, GeoTIFF outputs the transform and CRS; each is derived
from the other when missing.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

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
        if georef["crs_wkt"] is None:
            georef["crs_wkt"] = _utm_wkt(georef["map_info"])
    return georef


def transform_from_map_info(map_info: list[str]) -> list[float] | None:
    """Affine ``[a, b, c, d, e, f]`` of an ENVI ``map info`` (None for rotated maps or bad values).

    ``map info = {proj, ref col, ref row, ref x, ref y, pixel x, pixel y, ...}``; reference
    pixel (1, 1) is the upper-left corner of the upper-left pixel.
    """
    if any(str(v).strip().lower().startswith("rotation") and float(str(v).split("=")[1]) != 0 for v in map_info if "=" in str(v)):
        return None
    try:
        ref_col, ref_row, x, y, sx, sy = (float(v) for v in map_info[1:7])
    except (ValueError, IndexError):
        return None
    return [sx, 0.0, x - (ref_col - 1.0) * sx, 0.0, -sy, y + (ref_row - 1.0) * sy]


def _utm_wkt(map_info: list[str]) -> str | None:
    """WKT of a WGS-84 UTM ``map info`` (``UTM, ..., zone, North, WGS-84``); None otherwise."""
    if not map_info or map_info[0].strip().upper() != "UTM" or len(map_info) < 10:
        return None
    if "WGS-84" not in map_info[9].upper().replace(" ", ""):
        return None
    try:
        zone = int(map_info[7])
    except ValueError:
        return None
    epsg = (32600 if map_info[8].strip().lower().startswith("n") else 32700) + zone
    try:
        return str(_rasterio().crs.CRS.from_epsg(epsg).to_wkt())
    except DataError:
        return None


def envi_metadata(georef: dict[str, Any] | None) -> dict[str, Any]:
    """ENVI header keys of a georef: its own ``map info`` when it has one, else one from the transform."""
    if not georef:
        return {}
    out: dict[str, Any] = {}
    css = georef.get("coordinate_system_string") or georef.get("crs_wkt")
    if georef.get("map_info"):
        out["map info"] = list(georef["map_info"])
    elif georef.get("transform"):
        a, b, c, d, e, f = georef["transform"]
        if b == 0 and d == 0:
            name = "Arbitrary"
            if css:
                with contextlib.suppress(Exception):  # an unusual CRS still travels as the WKT string
                    crs = _rasterio().crs.CRS.from_wkt(css)
                    name = "Geographic Lat/Lon" if crs.is_geographic else (crs.to_dict().get("proj", "Arbitrary") or "Arbitrary")
                    name = "UTM" if str(name).lower() == "utm" else name
            out["map info"] = [name, "1", "1", repr(float(c)), repr(float(f)), repr(float(a)), repr(float(-e)), "units=Meters"]
    if css:
        out["coordinate system string"] = "{" + str(css) + "}"
    return out


