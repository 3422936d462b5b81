"""Hyperspectral file containers: the named arrays of a .mat (v5 / v7.3), ENVI, .lan, .npy or .npz file,
with shapes known up front and arrays loaded on demand."""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.hsi.mat_v5 import check_v5_file
from sciformer.errors import DataError
from sciformer.utils.limits import (
    check_hdf5_dataset,
    check_inflation,
    check_npy,
    check_shape,
    npz_members,
    read_errors,
    regular_file,
)

MAT_SUFFIXES = (".mat",)
ENVI_SUFFIXES = (".hdr",)
NPY_SUFFIXES = (".npy", ".npz")
LAN_SUFFIXES = (".lan",)
SUPPORTED = ".mat (v5/v7.3), .hdr (+ data file), .img/.dat/.raw with a .hdr beside, .lan, .npy, .npz, .tif (GeoTIFF)"




@dataclass
class ArrayInfo:
    shape: tuple[int, ...]
    kind: str  # numpy dtype kind: 'u', 'i', 'f', 'b', ...
    itemsize: int = 8  # bytes per value once loaded (8 when unknown: the conservative guess)
    stored: int | None = None  # bytes the array takes in the file when compressed or sparse (None: all of it)


class Container:
    """Named arrays of one file; shapes known up front, arrays loaded on demand."""

    def __init__(
        self,
        path: Path,
        arrays: dict[str, ArrayInfo],
        loader: Callable[[str], np.ndarray],
        wavelengths: np.ndarray | None = None,
        class_names: list[str] | None = None,
        fwhm: np.ndarray | None = None,
    ) -> None:
        self.path = path
        self.arrays = arrays
        self._loader = loader
        self.wavelengths = wavelengths  # (B,) band centres in nm, from a header
        self.class_names = class_names
        self.fwhm = fwhm  # (B,) band widths in nm, from a header
        self.bad_bands: np.ndarray | None = None  # (B,) bool, True where an ENVI header's 'bbl' is 0
        self.nodata: float | None = None  # the no-data value a header declares (ENVI 'data ignore value', GeoTIFF nodata)
        self.refused: dict[str, str] = {}  # members left out of ``arrays`` (Python objects): name -> why

    def missing(self, key: str, role: str) -> DataError:
        """The one-line error for ``key`` (given as ``role``, e.g. 'image_key') not in ``arrays``:
        why it was left out when it was refused, else 'not found' with the listing."""
        if key in self.refused:
            return DataError(self.refused[key])
        return DataError(f"{self.path}: {role} '{key}' not found; available keys: {self._listing()}")

    def keys(self) -> list[str]:
        return list(self.arrays)

    def load(self, key: str) -> np.ndarray:
        if key in self.refused or key not in self.arrays:
            raise self.missing(key, "array")
        info = self.arrays[key]
        where = f"{self.path} [{key}]"
        check_shape(info.shape, info.itemsize, where)  # before a byte is inflated or allocated
        if info.stored is not None:
            check_inflation(math.prod(info.shape) * info.itemsize, info.stored, where)
        try:
            return np.asarray(self._loader(key))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
            raise DataError(
                f"{self.path}: cannot read array '{key}'; the file looks truncated or damaged ({short_error(exc)})"
            ) from exc

    def _listing(self) -> str:
        if not self.arrays:
            return "(none)"
        return ", ".join(f"{k} {fmt_shape(v.shape)}" for k, v in self.arrays.items())


def short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


_NUMERIC_KINDS = "uifb"
_MATLAB_NUMERIC = {
    "double", "single", "int8", "uint8", "int16", "uint16", "int32", "uint32",
    "int64", "uint64", "logical",
}
_MATLAB_ITEMSIZE = {"double": 8, "single": 4, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
                    "int64": 8, "uint64": 8, "logical": 8}  # scipy loads logical as uint8, stored as double sometimes


def _open_mat_v5(path: Path) -> Container:
    import scipy.io

    check_v5_file(path)  # data tags against dimensions, before scipy inflates a byte
    try:
        listing = scipy.io.whosmat(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable MATLAB .mat file: {short_error(exc)}") from exc
    arrays: dict[str, ArrayInfo] = {}
    for name, shape, mclass in listing:
        if mclass not in _MATLAB_NUMERIC:
            continue
        kind = "f" if mclass in ("double", "single") else ("b" if mclass == "logical" else "i")
        shape = tuple(int(s) for s in shape)
        # v5 elements may be zlib-compressed: the whole file bounds what they may inflate from
        arrays[name] = ArrayInfo(shape, kind, _MATLAB_ITEMSIZE.get(mclass, 8), stored=os.path.getsize(path))

    def load(key: str) -> np.ndarray:
        return scipy.io.loadmat(str(path), variable_names=[key])[key]

    return Container(path, arrays, load)


def _open_mat_v73(path: Path) -> Container:
    import h5py

    arrays: dict[str, ArrayInfo] = {}
    try:
        with h5py.File(path, "r") as f:
            for name, obj in f.items():
                if not isinstance(obj, h5py.Dataset) or name.startswith("#"):
                    continue
                mclass = obj.attrs.get("MATLAB_class", b"")
                mclass = mclass.decode() if isinstance(mclass, bytes) else str(mclass)
                if mclass and mclass not in _MATLAB_NUMERIC:
                    continue  # char, cell, struct references
                if obj.dtype.kind not in _NUMERIC_KINDS:
                    continue
                if obj.attrs.get("MATLAB_empty", 0):
                    continue
                check_hdf5_dataset(obj, f"{path} [{name}]", stored=False)  # the ratio when loaded (Container.load)
                kind = "b" if mclass == "logical" else obj.dtype.kind
                stored = int(obj.id.get_storage_size())  # 0 for a dataset never written (its fill value only)
                arrays[name] = ArrayInfo(tuple(int(s) for s in obj.shape[::-1]), kind, int(obj.dtype.itemsize), stored)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - h5py reports damage as OSError, RuntimeError, KeyError, ...
        raise DataError(f"{path}: not a readable MATLAB v7.3 (HDF5) file: {short_error(exc)}") from exc

    def load(key: str) -> np.ndarray:
        with h5py.File(path, "r") as f:
            data = f[key][()]  # MATLAB column-major: axes reversed on disk
        return np.ascontiguousarray(np.asarray(data).T)

    return Container(path, arrays, load)


def _open_npy(path: Path) -> Container:
    try:
        if path.suffix.lower() == ".npz":
            refused: dict[str, str] = {}  # object members: left out, refused only when named
            members = npz_members(path, refused)
            arrays = {k: ArrayInfo(shape, dtype.kind, int(dtype.itemsize), stored) for k, (shape, dtype, stored) in members.items()}

            def load(key: str) -> np.ndarray:
                with np.load(path, allow_pickle=False) as z:
                    return z[key]

            container = Container(path, arrays, load)
            container.refused = refused
            return container
        check_npy(path)  # the magic and a numeric dtype, before numpy guesses (it calls any other file pickled)
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable .npy/.npz file: {short_error(exc)}") from exc
    key = path.stem
    info = ArrayInfo(tuple(int(s) for s in arr.shape), arr.dtype.kind, int(arr.dtype.itemsize))
    return Container(path, {key: info}, lambda _k: np.array(arr))


def _spy_to_container(path: Path, img: Any, label_file: bool = False) -> Container:
    """Wrap an opened spectral SpyFile (ENVI or ERDAS) as a one-array container; one band of a
    ``label_file`` is an (H, W) label map whatever its header's wavelength."""
    shape = (int(img.nrows), int(img.ncols), int(img.nbands))
    meta = getattr(img, "metadata", {}) or {}
    is_class = str(meta.get("file type", "")).lower() == "envi classification"
    kind = np.dtype(img.dtype).kind
    # one band: a label map when read as a label file, when the header says so (a classification, classes,
    # class names) or when it gives no centre; a one-band cube of a 'wavelength' stays (H, W, 1)
    label_map = shape[2] == 1 and (label_file or is_class or "classes" in meta or "class names" in meta
                                   or meta.get("wavelength") is None)
    wavelengths, fwhm = (None, None) if label_map else _envi_band_centres(path, img, shape[2])
    class_names = None
    if is_class and "class names" in meta:
        names = [str(n).strip() for n in meta["class names"]]
        class_names = names[1:] if names and names[0].lower() in ("unclassified", "unlabelled", "unlabeled") else names
    key = path.stem
    arr_shape = shape[:2] if label_map else shape  # (H, W) or (H, W, B)
    itemsize = int(np.dtype(img.dtype).itemsize)

    def load(_key: str) -> np.ndarray:
        data = np.array(img.open_memmap(interleave="bip"))  # (H, W, B) native dtype
        return data[:, :, 0] if len(arr_shape) == 2 else data

    c = Container(path, {key: ArrayInfo(arr_shape, kind, itemsize)}, load, wavelengths, class_names, fwhm)
    if not label_map and meta.get("bbl") is not None:  # ENVI bad band list: 0 marks a bad band
        try:
            flags = np.asarray([float(str(v).strip()) for v in meta["bbl"]], dtype=np.float64)  # (B,)
        except ValueError:
            raise DataError(f"{path}: header field 'bbl' holds a value that is not a number") from None
        if flags.size != shape[2]:
            raise DataError(f"{path}: header field 'bbl' lists {flags.size} values for {shape[2]} bands")
        c.bad_bands = flags == 0
    ignore = meta.get("data ignore value")
    if ignore is not None:
        try:
            c.nodata = float(str(ignore[0] if isinstance(ignore, list) else ignore).strip())
        except ValueError:
            raise DataError(f"{path}: header field 'data ignore value' = '{str(ignore)[:20]}' is not a number") from None
    return c


def _envi_band_centres(path: Path, img: Any, bands: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Band centres and widths (nm) of an ENVI/ERDAS image: its ``wavelength`` / ``fwhm`` fields
    in its ``wavelength units`` (see :mod:`sciformer.data.hsi.wavelengths`); None when absent."""
    from sciformer.data.hsi.wavelengths import check_wavelengths, header_numbers, to_nanometres

    info = getattr(img, "bands", None)
    centers, widths = getattr(info, "centers", None), getattr(info, "bandwidths", None)
    units = getattr(info, "band_unit", None)
    where = f"{path}: header field 'wavelength'"
    raw_field = (getattr(img, "metadata", {}) or {}).get("wavelength")
    if centers is None and raw_field is not None:  # the reader gave up on it (a trailing comma, a non-number): parse it here
        centers = header_numbers(raw_field, where)
    if centers is None:
        return None, None
    wavelengths = to_nanometres(centers, units, where)
    if wavelengths is None:  # 'wavelength units = Index': band numbers, not centres
        return None, None
    wavelengths = check_wavelengths(wavelengths, bands, where)
    fwhm = None
    raw = np.asarray(centers, dtype=np.float64)  # (B,) as written
    if widths is not None and len(widths) == bands and np.allclose(wavelengths, raw * (wavelengths[0] / raw[0])):
        fwhm = np.asarray(widths, dtype=np.float64) * (wavelengths[0] / raw[0])  # (B,) the centres' factor (not wavenumbers)
    return wavelengths, fwhm


def _open_envi(header: Path, data_file: Path | None, label_file: bool = False) -> Container:
    import spectral.io.envi as envi

    from sciformer.data.hsi.envi_text import readable_header
    from sciformer.data.hsi.wavelengths import check_text_size

    check_text_size(regular_file(header, "ENVI header"), str(header))  # parsing is ~20x the header's size in memory
    logger = logging.getLogger("spectral")  # its 'Unable to parse' warnings (extra stderr lines); 'wavelength' is re-read in _envi_band_centres
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # 'non-lowercase names ... converted to lowercase': two stderr lines, not a problem
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow while mapping an absurd size: _check_envi_size words it
            with readable_header(header, data_file) as (text_header, data):  # BOM / cp1252 headers: a UTF-8 copy
                img = envi.open(str(text_header), None if data is None else str(data))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{header}: not a readable ENVI header/data pair: {short_error(exc)}") from exc
    finally:
        logger.setLevel(level)
    meta = getattr(img, "metadata", {}) or {}
    interleave = str(meta.get("interleave", "bsq")).strip().lower()
    if interleave not in ("bsq", "bil", "bip"):
        raise DataError(f"{header}: ENVI interleave '{interleave[:20]}' is not supported; expected bsq, bil or bip")
    order = str(meta.get("byte order", "0")).strip()
    if order not in ("0", "1"):  # spectral reads anything but 0 as big-endian: garbage values
        raise DataError(f"{header}: ENVI 'byte order = {order[:20]}' is not 0 (little-endian) or 1 (big-endian)")
    _check_envi_size(header, img)
    return _spy_to_container(data_file or header, img, label_file)


def _check_envi_size(header: Path, img: Any) -> None:
    """The data file must hold what the header describes (a short file fails later, vaguely)."""
    try:
        need = int(img.offset) + int(img.nrows) * int(img.ncols) * int(img.nbands) * int(img.sample_size)
        have = os.path.getsize(img.filename)
    except (AttributeError, TypeError, ValueError, OSError):
        return
    if have < need:
        raise DataError(
            f"{img.filename}: ENVI data file has {have} bytes; header {header.name} describes "
            f"{img.nrows} lines x {img.ncols} samples x {img.nbands} bands of {img.sample_size} bytes = {need} bytes"
        )


def _open_lan(path: Path) -> Container:
    import spectral

    try:
        img = spectral.open_image(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable ERDAS .lan file: {short_error(exc)}") from exc
    return _spy_to_container(path, img)


def _open_geotiff(path: Path) -> Container:
    """A GeoTIFF as a one-array container: several bands are a cube (H, W, B), one band a label
    map (H, W); pixels are read on first use."""
    from sciformer.data.hsi.geotiff import geotiff_layout, geotiff_nodata, read_geotiff  # rasterio is optional

    shape, kind, itemsize = geotiff_layout(path)
    arr_shape = shape[:2] if shape[2] == 1 else shape

    def load(_key: str) -> np.ndarray:
        data, _ = read_geotiff(path)  # (H, W, B)
        return data[:, :, 0] if len(arr_shape) == 2 else data

    # the whole file as the stored size: a sparse or compressed file declaring far more is a bomb
    c = Container(path, {path.stem: ArrayInfo(arr_shape, kind, itemsize, stored=os.path.getsize(path))}, load)
    c.nodata = geotiff_nodata(path)
    return c


def _envi_header_for(path: Path) -> Path | None:
    for cand in (Path(str(path) + ".hdr"), path.with_suffix(".hdr"), path.with_suffix(".HDR")):
        if cand.is_file() and cand != path:
            return cand
    return None


def open_container(path: str | os.PathLike[str], label_file: bool = False) -> Container:
    """Open ``path`` and list its numeric arrays (nothing is loaded yet). A ``label_file`` (read
    for its label map, never its cube) lists a one-band ENVI file as (H, W) whatever its header's
    wavelength."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if p.is_dir():
        raise DataError(f"{p}: not a file (a directory?); expected an image or label file")
    regular_file(p, "image or label file")  # a FIFO would hang, /dev/zero never ends
    with read_errors(p):  # an OS error of any format's opener (EIO, no permission): one line naming the file
        suffix = p.suffix.lower()
        if suffix in MAT_SUFFIXES:
            import h5py

            return _open_mat_v73(p) if h5py.is_hdf5(str(p)) else _open_mat_v5(p)
        if suffix in NPY_SUFFIXES:
            return _open_npy(p)
        if suffix in ENVI_SUFFIXES:
            return _open_envi(p, None, label_file)
        if suffix in LAN_SUFFIXES:
            return _open_lan(p)
        if suffix in (".tif", ".tiff"):
            return _open_geotiff(p)
        header = _envi_header_for(p)
        if header is not None:
            return _open_envi(header, p, label_file)
    raise DataError(f"{p}: unsupported file type '{p.suffix}'; supported: {SUPPORTED}")


