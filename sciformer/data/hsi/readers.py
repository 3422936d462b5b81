"""Readers of hyperspectral scenes: MATLAB .mat (v5 and v7.3), ENVI, ERDAS .lan, .npy/.npz.

Every format goes through one path: a *container* lists its arrays (name, shape, dtype)
without loading them, the image and label arrays are picked by name or found
automatically, and only those are loaded::

    scene = read_scene("PaviaU.mat")                            # keys found automatically
    scene = read_scene("Salinas.mat", image_key="salinas_corrected",
                       label_path="Salinas_gt.mat")             # labels from another file
    scene.cube   # (H, W, B) native dtype     scene.gt  # (H, W) int64, 0 = unlabelled

Automatic keys: the cube is the largest 3-D array; the labels are the 2-D integer
array (or integer-valued float array) with the cube's height and width. Several
equally good candidates raise a :class:`~sciformer.errors.DataError` listing the keys.

MATLAB v7.3 files are HDF5 files in which every array is stored with its axes
reversed (column-major order); they are transposed back here, so a cube saved in
MATLAB as ``H x W x B`` comes back ``(H, W, B)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sciformer.errors import DataError

MAT_SUFFIXES = (".mat",)
ENVI_SUFFIXES = (".hdr",)
NPY_SUFFIXES = (".npy", ".npz")
LAN_SUFFIXES = (".lan",)
SUPPORTED = ".mat (v5/v7.3), .hdr (+ data file), .img/.dat/.raw with a .hdr beside, .lan, .npy, .npz"

LabelMode = Literal["required", "optional", "none"]


@dataclass
class Scene:
    """A hyperspectral scene in memory.

    Attributes:
        cube: (H, W, B) image, float32 or the file's native dtype.
        gt: (H, W) int64 label map, 0 = unlabelled, classes 1..K; None when absent.
        wavelengths: (B,) band centres (nm for most sensors) or None.
        class_names: names of classes 1..K or None.
        source: where the scene came from (a path or a built-in name).
    """

    cube: np.ndarray
    gt: np.ndarray | None = None
    wavelengths: np.ndarray | None = None
    class_names: list[str] | None = None
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int]:
        h, w, b = self.cube.shape
        return int(h), int(w), int(b)

    @property
    def num_bands(self) -> int:
        return int(self.cube.shape[2])

    @property
    def num_labelled(self) -> int:
        return 0 if self.gt is None else int(np.count_nonzero(self.gt))

    def __repr__(self) -> str:
        h, w, b = self.shape
        gt = "none" if self.gt is None else f"{self.num_labelled} labelled, {int(self.gt.max())} classes"
        wl = "none" if self.wavelengths is None else f"{self.wavelengths.min():g}-{self.wavelengths.max():g}"
        return (
            f"Scene(source={self.source!r}, cube=({h}, {w}, {b}) {self.cube.dtype}, gt={gt}, "
            f"wavelengths={wl})"
        )


# ----------------------------------------------------------------------------- containers


@dataclass
class _ArrayInfo:
    shape: tuple[int, ...]
    kind: str  # numpy dtype kind: 'u', 'i', 'f', 'b', ...


class _Container:
    """Named arrays of one file; shapes known up front, arrays loaded on demand."""

    def __init__(
        self,
        path: Path,
        arrays: dict[str, _ArrayInfo],
        loader: Callable[[str], np.ndarray],
        wavelengths: np.ndarray | None = None,
        class_names: list[str] | None = None,
    ) -> None:
        self.path = path
        self.arrays = arrays
        self._loader = loader
        self.wavelengths = wavelengths
        self.class_names = class_names

    def keys(self) -> list[str]:
        return list(self.arrays)

    def load(self, key: str) -> np.ndarray:
        if key not in self.arrays:
            raise DataError(f"{self.path}: no array '{key}'; available keys: {self._listing()}")
        try:
            return np.asarray(self._loader(key))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
            raise DataError(
                f"{self.path}: cannot read array '{key}'; the file looks truncated or damaged ({_short(exc)})"
            ) from exc

    def _listing(self) -> str:
        if not self.arrays:
            return "(none)"
        return ", ".join(f"{k} {_fmt_shape(v.shape)}" for k, v in self.arrays.items())


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


_NUMERIC_KINDS = "uifb"
_MATLAB_NUMERIC = {
    "double", "single", "int8", "uint8", "int16", "uint16", "int32", "uint32",
    "int64", "uint64", "logical",
}


def _open_mat_v5(path: Path) -> _Container:
    import scipy.io

    try:
        listing = scipy.io.whosmat(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable MATLAB .mat file: {_short(exc)}") from exc
    arrays: dict[str, _ArrayInfo] = {}
    for name, shape, mclass in listing:
        if mclass not in _MATLAB_NUMERIC:
            continue
        kind = "f" if mclass in ("double", "single") else ("b" if mclass == "logical" else "i")
        arrays[name] = _ArrayInfo(tuple(int(s) for s in shape), kind)

    def load(key: str) -> np.ndarray:
        return scipy.io.loadmat(str(path), variable_names=[key])[key]

    return _Container(path, arrays, load)


def _open_mat_v73(path: Path) -> _Container:
    import h5py

    arrays: dict[str, _ArrayInfo] = {}
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
                kind = "b" if mclass == "logical" else obj.dtype.kind
                arrays[name] = _ArrayInfo(tuple(int(s) for s in obj.shape[::-1]), kind)
    except Exception as exc:  # noqa: BLE001 - h5py reports damage as OSError, RuntimeError, KeyError, ...
        raise DataError(f"{path}: not a readable MATLAB v7.3 (HDF5) file: {_short(exc)}") from exc

    def load(key: str) -> np.ndarray:
        with h5py.File(path, "r") as f:
            data = f[key][()]  # MATLAB column-major: axes reversed on disk
        return np.ascontiguousarray(np.asarray(data).T)

    return _Container(path, arrays, load)


def _open_npy(path: Path) -> _Container:
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: _ArrayInfo(tuple(z[k].shape), z[k].dtype.kind) for k in z.files}

            def load(key: str) -> np.ndarray:
                with np.load(path, allow_pickle=False) as z:
                    return z[key]

            return _Container(path, arrays, load)
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable .npy/.npz file: {_short(exc)}") from exc
    key = path.stem
    info = _ArrayInfo(tuple(int(s) for s in arr.shape), arr.dtype.kind)
    return _Container(path, {key: info}, lambda _k: np.array(arr))


def _spy_to_container(path: Path, img: Any) -> _Container:
    """Wrap an opened spectral SpyFile (ENVI or ERDAS) as a one-array container."""
    shape = (int(img.nrows), int(img.ncols), int(img.nbands))
    meta = getattr(img, "metadata", {}) or {}
    is_class = str(meta.get("file type", "")).lower() == "envi classification"
    kind = np.dtype(img.dtype).kind
    wavelengths = None
    centers = getattr(getattr(img, "bands", None), "centers", None)
    if centers is not None and len(centers) == shape[2]:
        wavelengths = np.asarray(centers, dtype=np.float64)
    class_names = None
    if is_class and "class names" in meta:
        names = [str(n).strip() for n in meta["class names"]]
        class_names = names[1:] if names and names[0].lower() in ("unclassified", "unlabelled", "unlabeled") else names
    key = path.stem
    arr_shape = shape[:2] if shape[2] == 1 else shape  # one band: a label map

    def load(_key: str) -> np.ndarray:
        data = np.array(img.open_memmap(interleave="bip"))  # (H, W, B) native dtype
        return data[:, :, 0] if len(arr_shape) == 2 else data

    return _Container(path, {key: _ArrayInfo(arr_shape, kind)}, load, wavelengths, class_names)


def _open_envi(header: Path, data_file: Path | None) -> _Container:
    import spectral.io.envi as envi

    try:
        img = envi.open(str(header), None if data_file is None else str(data_file))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{header}: not a readable ENVI header/data pair: {_short(exc)}") from exc
    _check_envi_size(header, img)
    return _spy_to_container(data_file or header, img)


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


def _open_lan(path: Path) -> _Container:
    import spectral

    try:
        img = spectral.open_image(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: not a readable ERDAS .lan file: {_short(exc)}") from exc
    return _spy_to_container(path, img)


def _envi_header_for(path: Path) -> Path | None:
    for cand in (Path(str(path) + ".hdr"), path.with_suffix(".hdr"), path.with_suffix(".HDR")):
        if cand.is_file() and cand != path:
            return cand
    return None


def open_container(path: str | os.PathLike[str]) -> _Container:
    """Open ``path`` and list its numeric arrays (nothing is loaded yet)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if not p.is_file():
        raise DataError(f"{p}: not a file (a directory?); expected an image or label file")
    suffix = p.suffix.lower()
    if suffix in MAT_SUFFIXES:
        import h5py

        return _open_mat_v73(p) if h5py.is_hdf5(str(p)) else _open_mat_v5(p)
    if suffix in NPY_SUFFIXES:
        return _open_npy(p)
    if suffix in ENVI_SUFFIXES:
        return _open_envi(p, None)
    if suffix in LAN_SUFFIXES:
        return _open_lan(p)
    header = _envi_header_for(p)
    if header is not None:
        return _open_envi(header, p)
    raise DataError(f"{p}: unsupported file type '{p.suffix}'; supported: {SUPPORTED}")


# ----------------------------------------------------------------------------- key choice


def _pick_image_key(c: _Container, image_key: str | None) -> str:
    if image_key is not None:
        if image_key not in c.arrays:
            raise DataError(f"{c.path}: image_key '{image_key}' not found; available keys: {c._listing()}")
        if len(c.arrays[image_key].shape) != 3:
            raise DataError(
                f"{c.path}: image_key '{image_key}' has shape {_fmt_shape(c.arrays[image_key].shape)}; "
                "expected a 3-D (H, W, B) cube"
            )
        return image_key
    cubes = {k: v for k, v in c.arrays.items() if len(v.shape) == 3}
    if not cubes:
        raise DataError(f"{c.path}: no 3-D (H, W, B) array found; available keys: {c._listing()}")
    sizes = {k: int(np.prod(v.shape)) for k, v in cubes.items()}
    biggest = max(sizes.values())
    best = [k for k, s in sizes.items() if s == biggest]
    if len(best) > 1:
        raise DataError(
            f"{c.path}: several equally large 3-D arrays ({', '.join(best)}); "
            "name the cube with image_key"
        )
    return best[0]


def _is_integral(arr: np.ndarray) -> bool:
    if arr.dtype.kind in "uib":
        return True
    if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)):
        return False
    return bool(np.all(arr == np.round(arr)))


def _pick_label_key(
    c: _Container, label_key: str | None, hw: tuple[int, int] | None, exclude: str | None, mode: LabelMode
) -> str | None:
    if label_key is not None:
        if label_key not in c.arrays:
            raise DataError(f"{c.path}: label_key '{label_key}' not found; available keys: {c._listing()}")
        return label_key
    cands = [k for k, v in c.arrays.items() if k != exclude and len(v.shape) == 2]
    if hw is not None:
        cands = [k for k in cands if c.arrays[k].shape == hw]
    ints = [k for k in cands if c.arrays[k].kind in "uib"]
    if not ints:  # MATLAB often stores label maps as double
        ints = [k for k in cands if c.arrays[k].kind == "f" and _is_integral(c.load(k))]
    if len(ints) == 1:
        return ints[0]
    if len(ints) > 1:
        raise DataError(
            f"{c.path}: several candidate label maps ({', '.join(ints)}); name one with label_key"
        )
    if mode == "required":
        want = "" if hw is None else f" of size {hw[0]} x {hw[1]}"
        raise DataError(
            f"{c.path}: no 2-D integer label map{want} found; available keys: {c._listing()}; "
            "name it with label_key or give label_path"
        )
    return None


def _pick_wavelengths(c: _Container, key: str | None, bands: int) -> np.ndarray | None:
    if key is not None:
        arr = c.load(key).astype(np.float64).ravel()
        if arr.size != bands:
            raise DataError(f"{c.path}: wavelength_key '{key}' has {arr.size} values; expected {bands} (one per band)")
        return arr
    if c.wavelengths is not None and c.wavelengths.size == bands:
        return c.wavelengths
    for name, info in c.arrays.items():
        low = name.lower()
        if ("wave" in low or low in ("wl", "wavelength", "lambda")) and int(np.prod(info.shape)) == bands:
            return c.load(name).astype(np.float64).ravel()
    return None


# ----------------------------------------------------------------------------- public API


def validate_labels(gt: np.ndarray, where: str) -> np.ndarray:
    """Check a label map (2-D, integral, >= 0) and return it as int64."""
    gt = np.asarray(gt)
    if gt.ndim == 3 and gt.shape[2] == 1:
        gt = gt[:, :, 0]
    if gt.ndim != 2:
        raise DataError(f"{where}: label map has shape {_fmt_shape(gt.shape)}; expected 2-D (H, W)")
    if not _is_integral(gt):
        raise DataError(f"{where}: label map has non-integer or non-finite values; expected integer class ids")
    out = np.ascontiguousarray(gt, dtype=np.int64)  # (H, W)
    if out.size and out.min() < 0:
        raise DataError(f"{where}: label map has negative values (min {out.min()}); expected 0 = unlabelled, 1..K")
    return out


def validate_cube(cube: np.ndarray, where: str) -> np.ndarray:
    """Check a cube (3-D, numeric, finite) and return it unchanged (native dtype)."""
    cube = np.asarray(cube)
    if cube.ndim != 3:
        raise DataError(f"{where}: image has shape {_fmt_shape(cube.shape)}; expected 3-D (H, W, B)")
    if cube.dtype.kind not in "uif":
        raise DataError(f"{where}: image dtype {cube.dtype} is not numeric")
    if min(cube.shape) == 0:
        raise DataError(f"{where}: image has an empty axis, shape {_fmt_shape(cube.shape)}")
    if cube.dtype.kind == "f":
        bad = ~np.isfinite(cube)
        if bad.any():
            n = int(bad.sum())
            raise DataError(f"{where}: image has {n} NaN/Inf values; fill or mask them before training")
    return cube


def read_labels(
    path: str | os.PathLike[str], label_key: str | None = None, shape: tuple[int, int] | None = None
) -> np.ndarray:
    """Read a 2-D label map (int64, 0 = unlabelled) from any supported file."""
    c = open_container(path)
    key = _pick_label_key(c, label_key, shape, None, "required")
    assert key is not None
    gt = validate_labels(c.load(key), f"{c.path} [{key}]")
    if shape is not None and gt.shape != tuple(shape):
        raise DataError(
            f"{c.path} [{key}]: label map is {gt.shape[0]} x {gt.shape[1]}; image is {shape[0]} x {shape[1]}"
        )
    return gt


def read_scene(
    path: str | os.PathLike[str],
    image_key: str | None = None,
    label_key: str | None = None,
    *,
    label_path: str | os.PathLike[str] | None = None,
    wavelength_key: str | None = None,
    class_names: list[str] | None = None,
    labels: LabelMode = "optional",
) -> Scene:
    """Read a scene: cube (H, W, B), optional label map (H, W) and wavelengths.

    Args:
        path: image file (.mat, .hdr or ENVI data file, .lan, .npy, .npz).
        image_key: array holding the cube; found automatically when None.
        label_key: array holding the labels (in ``label_path`` if given, else in ``path``).
        label_path: separate file holding the label map.
        wavelength_key: array of band centres; else taken from an ENVI header or an
            array named like ``wavelength`` with one value per band.
        class_names: names of classes 1..K (else from an ENVI classification header).
        labels: ``"required"`` (error if none), ``"optional"`` (None if none found)
            or ``"none"`` (do not look).

    Raises:
        DataError: missing or unreadable file, missing key, ambiguous keys,
            size mismatch, NaN/Inf in the cube.
    """
    c = open_container(path)
    key = _pick_image_key(c, image_key)
    cube = np.ascontiguousarray(validate_cube(c.load(key), f"{c.path} [{key}]"))  # (H, W, B)
    hw = (int(cube.shape[0]), int(cube.shape[1]))
    wavelengths = _pick_wavelengths(c, wavelength_key, int(cube.shape[2]))

    gt: np.ndarray | None = None
    names = class_names
    if labels != "none":
        if label_path is not None:
            lc = open_container(label_path)
            lkey = _pick_label_key(lc, label_key, None, None, "required")
        else:
            lc = c
            lkey = _pick_label_key(c, label_key, hw, key, labels if label_key is None else "required")
        if lkey is not None:
            where = f"{lc.path} [{lkey}]"
            gt = validate_labels(lc.load(lkey), where)
            if gt.shape != hw:
                raise DataError(
                    f"{where}: label map is {gt.shape[0]} x {gt.shape[1]}; image {c.path} is {hw[0]} x {hw[1]}"
                )
            if names is None and lc.class_names:
                names = list(lc.class_names)
    if gt is None and labels == "required":
        raise DataError(f"{c.path}: no label map found; give label_key or label_path")
    if gt is not None and labels == "required" and not gt.any():
        raise DataError(f"{lc.path} [{lkey}]: label map has no labelled pixels (all 0); expected classes 1..K")
    return Scene(
        cube=cube,
        gt=gt,
        wavelengths=wavelengths,
        class_names=names,
        source=str(path),
        meta={"image_key": key},
    )


def list_arrays(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the numeric arrays in ``path`` (for error messages and ``info``)."""
    c = open_container(path)
    return {k: v.shape for k, v in c.arrays.items()}
