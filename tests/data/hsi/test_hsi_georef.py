"""ENVI ``map info`` <-> affine transform, rotated grids included; GDAL (through rasterio) is the oracle."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sciformer.data.hsi.export import save_map_envi
from sciformer.data.hsi.georef import georef_from_envi_header, georef_of, transform_from_map_info, writable_georef
from sciformer.data.hsi.geotiff import write_geotiff_map

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import Affine  # noqa: E402
from rasterio.warp import transform as warp  # noqa: E402

UTM33 = ["33", "North", "WGS-84", "units=Meters"]


def _envi(path: Path, map_info: list[str], h: int = 4, w: int = 5) -> Path:
    np.zeros((h, w), np.uint8).tofile(path.with_suffix(".img"))
    path.with_suffix(".hdr").write_text(
        f"ENVI\nsamples = {w}\nlines = {h}\nbands = 1\nheader offset = 0\nfile type = ENVI Standard\n"
        f"data type = 1\ninterleave = bsq\nbyte order = 0\nmap info = {{{', '.join(map_info)}}}\n")
    return path.with_suffix(".hdr")


def _gdal_transform(path: Path) -> list[float]:
    with rasterio.open(path) as src:
        return list(src.transform)[:6]


@pytest.mark.parametrize("degrees", [15.0, -40.0, 90.0, 0.0, 180.0, -180.0, 179.9])
def test_rotated_map_info_reads_as_gdal_reads_it(tmp_path: Path, degrees: float) -> None:
    info = ["UTM", "1", "1", "500000.0", "4000000.0", "30.0", "30.0", *UTM33, f"rotation={degrees}"]
    header = _envi(tmp_path / "a.hdr", info)
    np.testing.assert_allclose(transform_from_map_info(info), _gdal_transform(header.with_suffix(".img")), atol=1e-6)


def test_rotated_map_info_places_its_tie_point_and_turns_the_grid() -> None:
    theta = math.radians(15)
    info = ["UTM", "10.5", "20.5", "500300.0", "3999600.0", "30", "20", *UTM33, "rotation=15"]
    a, b, c, d, e, f = transform_from_map_info(info)
    col, row = 9.5, 19.5  # 1-based pixel (10.5, 20.5) in 0-based corner coordinates
    assert (a * col + b * row + c, d * col + e * row + f) == pytest.approx((500300.0, 3999600.0))
    assert (a, d) == pytest.approx((30 * math.cos(theta), 30 * math.sin(theta)))  # a column step: 30 m, turned 15 deg
    assert (b, e) == pytest.approx((20 * math.sin(theta), -20 * math.cos(theta)))  # a row step: 20 m, at right angles


@pytest.mark.parametrize("degrees", [15.0, -120.0])
def test_rotated_geotiff_georef_round_trips_through_envi_and_geotiff(tmp_path: Path, degrees: float) -> None:
    t = math.radians(degrees)
    transform = [30 * math.cos(t), 30 * math.sin(t), 500000.0, 30 * math.sin(t), -30 * math.cos(t), 4000000.0]
    crs = rasterio.crs.CRS.from_epsg(32633)
    georef = {"transform": transform, "crs_wkt": crs.to_wkt(), "map_info": None, "coordinate_system_string": None}
    labels = np.ones((4, 5), np.int64)
    hdr, img = save_map_envi(tmp_path / "m.hdr", labels, ["a"], georef=georef)
    np.testing.assert_allclose(_gdal_transform(img), transform, atol=1e-6)  # GDAL reads the ENVI map back
    with rasterio.open(img) as src:
        assert src.crs.to_epsg() == 32633
    back = georef_from_envi_header(hdr)  # and sciformer reads its own map info back
    np.testing.assert_allclose(back["transform"], transform, atol=1e-6)
    write_geotiff_map(tmp_path / "m.tif", labels, ["a"], back)
    with rasterio.open(tmp_path / "m.tif") as src:
        np.testing.assert_allclose(list(src.transform)[:6], transform, atol=1e-6)
        assert src.crs.to_epsg() == 32633


def test_a_south_up_grid_round_trips_and_a_half_turn_is_not_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GDAL reads ``rotation=180`` as a south-up grid (pixel y added per row), not as a turned one:
    a south-up transform is written that way and read back whole; a grid turned by exactly 180
    degrees would be read back as south-up (mirrored), so it is not written (one-line warning)."""
    south_up = [30.0, 0.0, 500000.0, 0.0, 30.0, 4000000.0]
    georef = {"transform": south_up, "crs_wkt": rasterio.crs.CRS.from_epsg(32633).to_wkt(), "map_info": None,
              "coordinate_system_string": None}
    labels = np.ones((4, 5), np.int64)
    hdr, img = save_map_envi(tmp_path / "s.hdr", labels, ["a"], georef=georef)
    np.testing.assert_allclose(_gdal_transform(img), south_up, atol=1e-6)
    np.testing.assert_allclose(georef_from_envi_header(hdr)["transform"], south_up, atol=1e-6)
    turned = {**georef, "transform": [-30.0, 0.0, 500000.0, 0.0, 30.0, 4000000.0]}
    capsys.readouterr()
    hdr, _ = save_map_envi(tmp_path / "t.hdr", labels, ["a"], georef=writable_georef(turned, tmp_path / "t.hdr"))
    assert "map info" not in hdr.read_text()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_sheared_transform_is_not_written_to_envi_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    georef = {"transform": list(Affine(30, 5, 500000, 4, -20, 4000000))[:6], "crs_wkt": rasterio.crs.CRS.from_epsg(4326).to_wkt(),
              "map_info": None, "coordinate_system_string": None}
    kept = writable_georef(georef, tmp_path / "m.hdr")
    err = capsys.readouterr().err
    assert kept is None and err.count("\n") == 1 and "m.hdr" in err and "sheared" in err
    assert writable_georef(georef, tmp_path / "m.tif") is georef  # a GeoTIFF carries it whole
    _, img = save_map_envi(tmp_path / "m.hdr", np.ones((4, 5), np.int64), ["a"], georef=georef)  # even if handed over
    with rasterio.open(img) as src:
        assert src.crs is None  # no CRS with an identity transform
    assert "map info" not in (tmp_path / "m.hdr").read_text()


def test_a_crs_without_a_usable_transform_is_never_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = _envi(tmp_path / "a.hdr", ["UTM", "1", "1", "x", "y", "30", "30", *UTM33])  # numbers that are not
    georef = georef_from_envi_header(header)
    assert georef["transform"] is None and georef["crs_wkt"]
    assert writable_georef(georef, tmp_path / "m.tif") is None
    assert capsys.readouterr().err.count("WARNING") == 1
    write_geotiff_map(tmp_path / "m.tif", np.ones((4, 5), np.int64), ["a"], georef)
    with rasterio.open(tmp_path / "m.tif") as src:
        assert src.crs is None


@pytest.mark.parametrize("suffix", [".hdr", ".tif"])
def test_a_non_finite_map_info_is_no_georeference_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              suffix: str) -> None:
    """A map info with a nan/inf tie point places the map nowhere: dropped with one warning line
    (it was copied verbatim into .hdr maps, and a .tif was written without it silently)."""
    header = _envi(tmp_path / "a.hdr", ["UTM", "1", "1", "nan", "inf", "30", "30", "13", "North"])
    georef = georef_from_envi_header(header)
    assert writable_georef(georef, tmp_path / f"m{suffix}") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"WARNING: m{suffix}") and "'map info' gives no usable transform" in err


@pytest.mark.parametrize(("epsg", "transform", "units"), [
    (2227, Affine(30.0, 0, 6000000.0, 0, -30.0, 2100000.0), "units=US Survey Feet"),  # California III, US survey feet
    (2222, Affine(30.0, 0, 700000.0, 0, -30.0, 1000000.0), "units=Feet"),  # Arizona East, international feet
    (3310, Affine(20.0, 0, -200000.0, 0, -20.0, -100000.0), "units=Meters"),  # California Albers, metres
    (4326, Affine(0.0001, 0, -86.9, 0, -0.0001, 40.6), "units=Degrees"),  # geographic
])
def test_a_geotiff_georef_written_to_envi_reads_back_in_gdal_in_place(tmp_path: Path, epsg: int, transform: Affine,
                                                                      units: str) -> None:
    """The ``map info`` made from a GeoTIFF's CRS names that CRS's units: GDAL applies ``units=``
    over the ``coordinate system string`` (a US-feet map written ``units=Meters`` was read in
    metres, its corner some 4,000 km off, San Francisco -> off Massachusetts). GDAL reading the
    ENVI map back is the oracle: the same CRS, transform and upper-left corner on the ground."""
    crs = rasterio.crs.CRS.from_epsg(epsg)
    with rasterio.open(tmp_path / "in.tif", "w", driver="GTiff", width=5, height=4, count=1, dtype="uint8", crs=crs,
                       transform=transform) as dst:
        dst.write(np.zeros((1, 4, 5), np.uint8))
    hdr, img = save_map_envi(tmp_path / "m.hdr", np.ones((4, 5), np.int64), ["a"], georef=georef_of(tmp_path / "in.tif"))
    assert units in hdr.read_text().split("map info")[1].split("}")[0]
    with rasterio.open(img) as src:
        assert src.crs == crs and src.crs.to_epsg() == epsg
        np.testing.assert_allclose(list(src.transform)[:6], list(transform)[:6], rtol=1e-12)
        corner = warp(src.crs, "EPSG:4326", [src.transform.c], [src.transform.f])
    np.testing.assert_allclose(corner, warp(crs, "EPSG:4326", [transform.c], [transform.f]), atol=1e-9)
