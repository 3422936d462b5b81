"""The ``units=`` a coordinate system takes in an ENVI ``map info``.

:func:`envi_units` spells a coordinate system's units for a ``map info`` written from a
GeoTIFF: GDAL applies ``units=`` on top of the ``coordinate system string`` (``Feet`` is the
international foot, ``Meters`` the metre), so the entry must name the system's own unit, or
be left out where GDAL has no word for it (the US survey foot: ``US Survey Feet``, which GDAL
passes over, keeping the string's unit).
"""

from __future__ import annotations

import math
from typing import Any

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
