"""The coordinate system of an ENVI ``map info``, and the ``units=`` a coordinate system takes there.

ENVI headers give a coordinate system in two ways: a ``coordinate system string`` (WKT), or
only the ``map info`` (``UTM, ..., 16, North, North America 1983``, ``Geographic Lat/Lon,
..., WGS-84``, ``State Plane (NAD 83), ..., 403``, with ``projection info`` for other
projections). The second is read here as GDAL reads it (:func:`crs_of_map_info`: a header
holding just those keys is opened with rasterio), so a GeoTIFF map carries the coordinate
system GDAL shows for the input; what GDAL cannot make a coordinate system of (a projection
name it does not know, a datum it would replace by WGS-84) comes back as a reason instead.

:func:`envi_units` spells a coordinate system's units for a ``map info`` written from a
GeoTIFF: GDAL applies ``units=`` on top of the ``coordinate system string`` (``Feet`` is the
international foot, ``Meters`` the metre), so the entry must name the system's own unit, or
be left out where GDAL has no word for it (the US survey foot: ``US Survey Feet``, which GDAL
passes over, keeping the string's unit).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NO_CRS_NAMES = ("arbitrary", "pixel", "")  # map info names that state no coordinate system at all

# metres per unit -> ENVI's word (GDAL reads the first six; the US survey foot it passes over)
_LINEAR_UNITS = ((1.0, "Meters"), (0.3048, "Feet"), (1000.0, "Km"), (0.9144, "Yards"), (1609.344, "Miles"),
                 (1852.0, "Nautical Miles"), (1200.0 / 3937.0, "US Survey Feet"))
_ANGULAR_UNITS = ((math.pi / 180.0, "Degrees"), (1.0, "Radians"))


def envi_units(crs: Any) -> str | None:
    """``units=<word>`` of a rasterio CRS for an ENVI ``map info`` (``units=Meters``,
    ``units=US Survey Feet``, ``units=Degrees``); None where ENVI has no word for its unit
    (GDAL then keeps the ``coordinate system string``'s own unit)."""
    try:
        _, factor = crs.units_factor
    except AttributeError:  # rasterio < 1.4
        _, factor = crs.linear_units_factor if crs.is_projected else ("degree", math.pi / 180.0)
    except Exception:  # noqa: BLE001 - a coordinate system without units
        return None
    table = _ANGULAR_UNITS if crs.is_geographic else _LINEAR_UNITS if crs.is_projected else ()
    for size, word in table:
        if math.isclose(float(factor), size, rel_tol=1e-9):
            return f"units={word}"
    return None


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(re.sub(r"^CPLE_\w+ in ", "", " ".join(record.getMessage().split())))


@contextlib.contextmanager
def _gdal_warnings() -> Iterator[list[str]]:
    """GDAL's warnings (which rasterio logs) while a header is read, held instead of printed."""
    logger = logging.getLogger("rasterio._env")
    held, propagate = _Held(), logger.propagate
    logger.addHandler(held)
    logger.propagate = False
    try:
        yield held.messages
    finally:
        logger.removeHandler(held)
        logger.propagate = propagate


def crs_of_map_info(map_info: list[str], projection_info: list[str] | None = None) -> tuple[str | None, str | None]:
    """(WKT, None) of the coordinate system GDAL reads from an ENVI ``map info`` (and
    ``projection info``) without a ``coordinate system string``; (None, reason) where it reads
    none, or only by a guess of its own; (None, None) for a ``map info`` that states none
    (``Arbitrary``) and where rasterio is not installed."""
    if not map_info or map_info[0].strip().lower() in NO_CRS_NAMES:
        return None, None
    try:
        import rasterio  # noqa: F401 - GDAL reads the header
    except ImportError:
        return None, None
    return _gdal_crs(tuple(map_info), tuple(projection_info) if projection_info else None)


@functools.lru_cache(maxsize=64)
def _gdal_crs(map_info: tuple[str, ...], projection_info: tuple[str, ...] | None) -> tuple[str | None, str | None]:
    import rasterio

    text = ("ENVI\nsamples = 1\nlines = 1\nbands = 1\nheader offset = 0\nfile type = ENVI Standard\ndata type = 1\n"
            f"interleave = bsq\nbyte order = 0\nmap info = {{{', '.join(map_info)}}}\n")
    if projection_info:
        text += f"projection info = {{{', '.join(projection_info)}}}\n"
    named = f"'map info' {{{', '.join(map_info[:1] + map_info[7:])[:80]}}}"
    with tempfile.TemporaryDirectory() as folder, _gdal_warnings() as warned:
        (Path(folder) / "h.hdr").write_text(text, encoding="utf-8")
        (Path(folder) / "h.img").write_bytes(bytes(16))  # GDAL does not open a file shorter than its probe
        try:
            with rasterio.open(Path(folder) / "h.img") as src:
                crs = src.crs
        except Exception as exc:  # noqa: BLE001 - an unreadable map info: no coordinate system
            return None, f"GDAL reads no coordinate system from its {named} ({' '.join(str(exc).split())[:120]})"
    if warned:  # e.g. "Unrecognized datum 'X', defaulting to WGS84.": a guess, not the input's system
        return None, f"GDAL reads its {named} only by a guess ({warned[0][:120]})"
    if crs is None or not (crs.is_projected or crs.is_geographic):  # a LOCAL_CS named after the projection
        return None, f"GDAL makes no coordinate system of its {named} (write the input with a 'coordinate system string')"
    return str(crs.to_wkt()), None
