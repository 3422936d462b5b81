"""GeoTIFF cubes, label maps and classification maps (the optional ``raster`` extra: rasterio).

Georeferences travel as the plain dicts of :mod:`sciformer.data.hsi.georef`.

GeoTIFF maps (:func:`write_geotiff_map`) are single-band uint8 (uint16 beyond 255
classes) with no-data 0 (unclassified), a colour table (index 0 black, classes as in
the PNG and ENVI maps) and the class names as tags (``CLASS_NAMES`` JSON, ``CLASS_<k>``).
Probability rasters (:func:`write_geotiff_probabilities`, ``predict --probabilities``) are
float32 with one band per class, each described by its class name.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.palette import class_colors
from sciformer.errors import DataError
from sciformer.utils.atomic import atomic_write_with
from sciformer.utils.text import utf8_safe

GEOTIFF_SUFFIXES = (".tif", ".tiff")
NO_DATA = 0  # unclassified / unlabelled pixel of a map


def _rasterio() -> Any:
    try:
        import rasterio
    except ImportError as exc:
        raise DataError('GeoTIFF needs rasterio: pip install "sciformer[raster]" (or pip install rasterio)') from exc
    return rasterio


@contextlib.contextmanager
def _open(rasterio: Any, path: str | os.PathLike[str]) -> Iterator[Any]:
    """``rasterio.open(path)`` for reading. GDAL takes UTF-8 names only: a path of bytes that
    are not UTF-8 is opened here and given to GDAL by its descriptor's name in ``/proc``
    (read in place, header first), or as an open Python file where there is no ``/proc``."""
    if utf8_safe(os.fspath(path)) == os.fspath(path):
        with _quiet_without_georef(rasterio), rasterio.open(path) as src:  # a file without georeference reads as pixels
            yield src
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        by_descriptor = f"/proc/self/fd/{fd}"
        with _quiet_without_georef(rasterio):
            if os.path.exists(by_descriptor):
                with rasterio.open(by_descriptor) as src:
                    yield src
            else:
                with os.fdopen(os.dup(fd), "rb") as handle, rasterio.open(handle) as src:
                    yield src
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- GeoTIFF


def _scaling(src: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-band (scales, offsets) of an open GeoTIFF, None when every band is (1, 0), for a
    one-band file (a label map: its values are class ids, read as stored) and for complex
    data (refused as a cube, whole, rather than cut to its real part)."""
    if src.count == 1 or np.dtype(src.dtypes[0]).kind == "c":
        return None
    scales = np.asarray([1.0 if v is None else float(v) for v in src.scales], dtype=np.float64)  # (B,)
    offsets = np.asarray([0.0 if v is None else float(v) for v in src.offsets], dtype=np.float64)  # (B,)
    return None if np.all(scales == 1.0) and np.all(offsets == 0.0) else (scales, offsets)


def read_geotiff(path: str | os.PathLike[str]) -> tuple[np.ndarray, dict[str, Any]]:
    """A GeoTIFF's bands as (H, W, B) and its georef.

    Native dtype, unless a band of a cube (several bands) declares a scale or offset other than (1, 0): then every band
    is ``value * scale + offset`` (GDAL's unscaling) in float32 (float64 for a float64 file),
    and pixels equal to the declared nodata in every band become NaN (see :func:`geotiff_nodata`).
    """
    from sciformer.data.hsi.nodata import nodata_pixels

    rasterio = _rasterio()
    try:
        with _open(rasterio, path) as src:
            data = np.moveaxis(src.read(), 0, -1)  # (H, W, B)
            scaling, nodata = _scaling(src), src.nodata
            georef = {"transform": list(src.transform)[:6], "crs_wkt": src.crs.to_wkt() if src.crs else None,
                      "map_info": None, "coordinate_system_string": None, "nodata": nodata}
    except rasterio.errors.RasterioError as exc:
        raise DataError(f"{path}: not a readable GeoTIFF ({exc})") from exc
    if scaling is not None:
        missing = nodata_pixels(data, nodata) if nodata is not None else None  # (H, W), in the file's own values
        out = data.astype(np.float64 if data.dtype == np.float64 else np.float32)
        out *= scaling[0].astype(out.dtype)
        out += scaling[1].astype(out.dtype)
        if missing is not None:
            out[missing] = np.nan
        data = out
    return data, georef


def geotiff_layout(path: Path) -> tuple[tuple[int, int, int], str, int]:
    """(height, width, bands), the numpy dtype kind (``f`` when it is scaled) and the bytes per
    value once read of a GeoTIFF, from its header only."""
    rasterio = _rasterio()
    try:
        with _open(rasterio, path) as src:
            dtype = np.dtype(src.dtypes[0])
            if _scaling(src) is not None:
                dtype = np.dtype(np.float64 if dtype == np.float64 else np.float32)
            return (int(src.height), int(src.width), int(src.count)), dtype.kind, dtype.itemsize
    except rasterio.errors.RasterioError as exc:
        raise DataError(f"{path}: not a readable GeoTIFF ({exc})") from exc


def geotiff_nodata(path: Path) -> float | None:
    """The no-data value a GeoTIFF declares (None when it declares none; NaN for a scaled file,
    whose no-data pixels :func:`read_geotiff` gives as NaN)."""
    rasterio = _rasterio()
    try:
        with _open(rasterio, path) as src:
            if src.nodata is None:
                return None
            return float("nan") if _scaling(src) is not None else float(src.nodata)
    except rasterio.errors.RasterioError as exc:
        raise DataError(f"{path}: not a readable GeoTIFF ({exc})") from exc


def read_geotiff_georef(path: Path) -> dict[str, Any]:
    rasterio = _rasterio()
    try:
        with _open(rasterio, path) as src:
            return {"transform": list(src.transform)[:6], "crs_wkt": src.crs.to_wkt() if src.crs else None,
                    "map_info": None, "coordinate_system_string": None}
    except rasterio.errors.RasterioError as exc:
        raise DataError(f"{path}: not a readable GeoTIFF ({exc})") from exc


@contextlib.contextmanager
def _quiet_without_georef(rasterio: Any) -> Iterator[None]:
    """No NotGeoreferencedWarning for a map of an input that has no georeference (a .mat, a .npy)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        yield


def _georef_profile(path: Path, georef: dict[str, Any] | None, rasterio: Any) -> dict[str, Any]:
    """``transform`` / ``crs`` entries of a rasterio profile from ``georef`` (none without a transform)."""
    from rasterio.transform import Affine

    out: dict[str, Any] = {}
    if not georef or not georef.get("transform"):
        return out  # a CRS without its transform would place the map at the origin
    out["transform"] = Affine(*georef["transform"])
    if georef.get("crs_wkt"):
        try:
            out["crs"] = rasterio.crs.CRS.from_wkt(georef["crs_wkt"])
        except rasterio.errors.CRSError as exc:
            raise DataError(f"{path}: the input's coordinate system cannot be written to GeoTIFF ({exc})") from exc
    return out


@contextlib.contextmanager
def _gdal_messages() -> Iterator[list[str]]:
    """Hold what GDAL / libtiff print on the process's stderr (``_tiffWriteProc: File too
    large.``) while a GeoTIFF is written; the list gets those lines at the end. They are
    given back to stderr by the caller when the write turns out to be good."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    lines: list[str] = []
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines.extend(held.read().decode("utf-8", "replace").splitlines())


def _write_checked(rasterio: Any, writer: Callable[[Path], None], tmp: Path, path: Path, expected: np.ndarray) -> None:
    """``writer(tmp)``, then :func:`_check_written`; GDAL's messages become part of the one-line
    error of a failed write (and go to stderr as they were when the file is good)."""
    failed: Exception | None = None
    with _gdal_messages() as messages:
        try:
            writer(tmp)
        except (OSError, rasterio.errors.RasterioError) as exc:  # GDAL's reason is in its messages
            failed = exc
    if failed is not None:
        said = [m.strip() for m in messages if m.strip()][:1] or [" ".join(str(failed).split())]
        raise DataError(f"{path}: the GeoTIFF could not be written ({said[0][:200]}): is the disk full or a file-size limit "
                        "reached? (no file was written or replaced)")
    _check_written(rasterio, tmp, path, expected, messages)
    if messages:
        print("\n".join(messages), file=sys.stderr)


def _check_written(rasterio: Any, tmp: Path, path: Path, expected: np.ndarray, messages: list[str]) -> None:
    """Read the GeoTIFF just written to ``tmp`` back in full, in blocks of rows (about 32 MiB
    each: the check's memory stays small whatever the raster's size), and compare it with
    ``expected`` (bands, H, W): GDAL only logs a failed write (a file-size limit, a full disk)
    and leaves a truncated file, which must not replace ``path``."""
    from rasterio.windows import Window

    back: Exception | None = None
    try:
        with _quiet_without_georef(rasterio), rasterio.open(tmp) as src:
            good = (src.count, src.height, src.width) == expected.shape
            bands, height, width = expected.shape
            rows = max(1, (32 << 20) // max(1, bands * width * expected.itemsize))
            for top in range(0, height if good else 0, rows):
                block = src.read(window=Window(0, top, width, min(rows, height - top)))  # (bands, r, W)
                if not np.array_equal(block, expected[:, top : top + rows], equal_nan=expected.dtype.kind == "f"):
                    good = False
                    break
    except Exception as exc:  # noqa: BLE001 - any failure to read it back is a failed write
        back, good = exc, False
    if good:
        return
    said = [" ".join(str(back).split())] if back is not None else []
    said += [m.strip() for m in messages if m.strip()][:1]
    why = f" ({'; '.join(said)})" if said else ""
    raise DataError(f"{path}: the GeoTIFF was not written completely{why}: is the disk full or a file-size limit reached? "
                    "(no file was written or replaced)")


def write_geotiff_map(
    path: str | os.PathLike[str],
    label_map: np.ndarray,
    class_names: list[str],
    georef: dict[str, Any] | None = None,
    description: str = "sciformer classification map",
) -> Path:
    """Write a classification map (0 = unclassified, 1..K) as a GeoTIFF, atomically.

    Keeps ``georef``'s transform and CRS; no-data 0; a colour table; class names as tags.
    """
    rasterio = _rasterio()
    path = Path(path)
    m = np.asarray(label_map)
    if m.ndim != 2 or m.dtype.kind not in "uib" or (m.size and (m.min() < 0 or m.max() > len(class_names))):
        raise DataError(f"{path}: expected a 2-D map of 0..{len(class_names)}, got shape {m.shape} dtype {m.dtype}")
    dtype = "uint8" if len(class_names) < 256 else "uint16"
    located = _georef_profile(path, georef, rasterio)
    colors = class_colors(len(class_names))  # (K + 1, 3) uint8, row 0 black
    names = ["Unclassified", *class_names]

    def write(tmp: Path) -> None:
        profile = {"driver": "GTiff", "height": m.shape[0], "width": m.shape[1], "count": 1, "dtype": dtype,
                   "nodata": NO_DATA, "compress": "deflate"}
        if dtype == "uint8":
            profile["photometric"] = "palette"  # a colour-mapped image for every TIFF reader, not only GDAL
        profile.update(located)
        with _quiet_without_georef(rasterio), rasterio.open(tmp, "w", **profile) as dst:
            dst.write(m.astype(dtype), 1)
            if dtype == "uint8":
                dst.write_colormap(1, {i: (*map(int, colors[i]), 255) for i in range(len(names))})
            dst.update_tags(CLASS_NAMES=json.dumps(names), TIFFTAG_IMAGEDESCRIPTION=description,
                            **{f"CLASS_{i}": n for i, n in enumerate(names)})
            dst.set_band_description(1, "class (0 = unclassified)")

    atomic_write_with(path, lambda tmp: _write_checked(rasterio, write, tmp, path, m.astype(dtype)[None]))
    return path


def check_probabilities(probs: np.ndarray, class_names: list[str], path: Path) -> np.ndarray:
    """``probs`` as float32 after checking it is a float (H, W, len(class_names)) array (else a
    DataError naming ``path``, the file it was to be written to)."""
    p = np.asarray(probs)
    if p.ndim != 3 or p.shape[2] != len(class_names) or p.dtype.kind != "f":
        raise DataError(f"{path}: expected float (H, W, {len(class_names)}) probabilities, got shape {p.shape} dtype {p.dtype}")
    return p.astype(np.float32, copy=False)


def write_geotiff_probabilities(
    path: str | os.PathLike[str],
    probs: np.ndarray,
    class_names: list[str],
    georef: dict[str, Any] | None = None,
) -> Path:
    """Write class probabilities as a float32 GeoTIFF, one band per class, atomically.

    Band ``k`` (1-based) holds class ``k``'s probability and is described by its name; the
    input's transform and CRS are kept.

    Shapes:
        probs: (H, W, K), K = len(class_names)
    """
    rasterio = _rasterio()

    path = Path(path)
    p = check_probabilities(probs, class_names, path)
    profile: dict[str, Any] = {"driver": "GTiff", "height": p.shape[0], "width": p.shape[1], "count": p.shape[2],
                               "dtype": "float32", "compress": "deflate", "interleave": "band",
                               "nodata": float("nan")}  # no-data pixels have no probabilities
    profile.update(_georef_profile(path, georef, rasterio))

    def write(tmp: Path) -> None:
        with _quiet_without_georef(rasterio), rasterio.open(tmp, "w", **profile) as dst:
            dst.write(np.moveaxis(p, 2, 0))  # (K, H, W)
            dst.update_tags(CLASS_NAMES=json.dumps(list(class_names)), TIFFTAG_IMAGEDESCRIPTION="sciformer class probabilities")
            for k, name in enumerate(class_names, start=1):
                dst.set_band_description(k, name)

    atomic_write_with(path, lambda tmp: _write_checked(rasterio, write, tmp, path, np.moveaxis(p, 2, 0)))
    return path
