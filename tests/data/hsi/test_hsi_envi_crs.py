"""The coordinate system of an ENVI ``map info`` without a ``coordinate system string``, carried
into GeoTIFF maps; GDAL (through rasterio) reading the input header is the oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer.data.hsi.envi_crs import crs_of_map_info, envi_units
from sciformer.data.hsi.georef import georef_from_envi_header, writable_georef
from sciformer.data.hsi.geotiff import write_geotiff_map
from tests.data.hsi.test_hsi_georef import _envi

rasterio = pytest.importorskip("rasterio")


UTM16 = ["UTM", "1", "1", "500000.0", "4500000.0", "20.0", "20.0", "16", "North"]
GEO = ["Geographic Lat/Lon", "1", "1", "-86.5", "40.5", "0.0001", "0.0001"]


@pytest.mark.parametrize(("map_info", "epsg"), [
    ([*UTM16, "North America 1983", "units=Meters"], 26916),
    ([*UTM16, "WGS-84", "units=Meters"], 32616),
    ([*UTM16, "North America 1927"], 26716),
    ([*GEO, "WGS-84", "units=Degrees"], 4326),
    ([*GEO, "North America 1927"], 4267),
])
def test_a_map_info_alone_gives_the_geotiff_map_the_crs_gdal_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   map_info: list[str], epsg: int) -> None:
    """Only WGS-84 UTM was carried: a NAD83 UTM or a geographic ``map info`` gave a GeoTIFF map
    without a CRS, silently."""
    header = _envi(tmp_path / "a.hdr", map_info)
    georef = writable_georef(georef_from_envi_header(header), tmp_path / "m.tif")
    assert capsys.readouterr().err == ""
    write_geotiff_map(tmp_path / "m.tif", np.ones((4, 5), np.int64), ["a"], georef)
    with rasterio.open(header.with_suffix(".img")) as src, rasterio.open(tmp_path / "m.tif") as out:
        assert src.crs.to_epsg() == epsg  # the oracle reads what the header says
        assert out.crs == src.crs and out.crs.to_epsg() == epsg
        np.testing.assert_allclose(list(out.transform)[:6], list(src.transform)[:6], atol=1e-9)


@pytest.mark.parametrize(("map_info", "said"), [
    ([*UTM16, "Datum Of Nowhere", "units=Meters"], "Unrecognized datum 'Datum Of Nowhere'"),
    (["Lambert Conformal Conic", "1", "1", "6000000.0", "2100000.0", "30.0", "30.0", "units=Feet"],
     "GDAL makes no coordinate system of its 'map info' {Lambert Conformal Conic"),
])
def test_a_crs_that_cannot_be_carried_is_said_in_one_line_and_the_transform_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], map_info: list[str], said: str) -> None:
    header = _envi(tmp_path / "a.hdr", map_info)
    georef = writable_georef(georef_from_envi_header(header), tmp_path / "m.tif")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("WARNING: m.tif is written with the input's transform but without")
    assert said in err
    write_geotiff_map(tmp_path / "m.tif", np.ones((4, 5), np.int64), ["a"], georef)
    with rasterio.open(header.with_suffix(".img")) as src, rasterio.open(tmp_path / "m.tif") as out:
        assert out.crs is None
        np.testing.assert_allclose(list(out.transform)[:6], list(src.transform)[:6], atol=1e-9)
    assert writable_georef(georef, tmp_path / "m.hdr") is georef and capsys.readouterr().err == ""  # ENVI: map info verbatim


def test_an_arbitrary_map_info_has_no_crs_to_carry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = _envi(tmp_path / "a.hdr", ["Arbitrary", "1", "1", "0.0", "0.0", "1.0", "1.0", "0", "North"])
    assert writable_georef(georef_from_envi_header(header), tmp_path / "m.tif") is not None
    assert capsys.readouterr().err == ""
    assert crs_of_map_info(["Arbitrary", "1", "1", "0", "0", "1", "1"]) == (None, None)


@pytest.mark.parametrize(("epsg", "units"), [(2227, "units=US Survey Feet"), (2222, "units=Feet"), (32616, "units=Meters"),
                                             (4326, "units=Degrees")])
def test_envi_units_name_the_crs_own_unit(epsg: int, units: str) -> None:
    assert envi_units(rasterio.crs.CRS.from_epsg(epsg)) == units
