"""Readers of hyperspectral scenes: MATLAB .mat (v5 and v7.3), ENVI, ERDAS .lan, .npy/.npz.

Every format goes through one path: a *container* lists its arrays (name, shape, dtype)
without loading them, the image and label arrays are picked by name or found
automatically, and only those are loaded::

    scene = read_scene("PaviaU.mat")                            # keys found automatically
    scene = read_scene("Salinas.mat", image_key="salinas_corrected",
                       label_path="Salinas_gt.mat")             # labels from another file
    scene.cube   # (H, W, B) native dtype     scene.gt  # (H, W) int64, 0 = unlabelled

Automatic keys: the cube is the largest 3-D array; the labels are the 2-D integer
array (or integer-valued float array) with the cube's height and width, label-like
names first, never one named like a mask; band centres an array of a known wavelength
name. Several equally good candidates raise a :class:`~sciformer.errors.DataError`
listing the keys.

MATLAB v7.3 files are HDF5 files in which every array is stored with its axes
reversed (column-major order); they are transposed back here, so a cube saved in
MATLAB as ``H x W x B`` comes back ``(H, W, B)``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sciformer.data.hsi.containers import (
    Container,
    fmt_shape,
    open_container,
)
from sciformer.data.hsi.wavelengths import check_one_column, check_wavelengths, to_nanometres
from sciformer.errors import DataError, LabelsMissing
from sciformer.utils.limits import MAX_CLASS_ID

LabelMode = Literal["required", "optional", "none"]


@dataclass
class Scene:
    """A hyperspectral scene in memory.

    Attributes:
        cube: (H, W, B) image, float32 or the file's native dtype.
        gt: (H, W) int64 label map, 0 = unlabelled, classes 1..K; None when absent.
        wavelengths: (B,) band centres in nm, or None.
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


# ----------------------------------------------------------------------------- key choice


def _pick_image_key(c: Container, image_key: str | None) -> str:
    if image_key is not None:
        if image_key not in c.arrays:
            raise c.missing(image_key, "image_key")
        if len(c.arrays[image_key].shape) != 3:
            raise DataError(
                f"{c.path}: image_key '{image_key}' has shape {fmt_shape(c.arrays[image_key].shape)}; "
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


_LABEL_WORDS = frozenset({"gt", "label", "labels", "groundtruth", "truth", "classes", "class", "classmap", "labelmap",
                          "labelled", "labeled", "annotation", "annotations", "tr", "te", "train", "test", "y"})
_MASK_WORDS = frozenset({"mask", "masks", "valid", "validity", "nodata", "roi"})


def _words(name: str) -> set[str]:
    """The words of an array name (``Indian_pines_gt`` -> indian, pines, gt; ``hsi/mask_sub`` -> hsi, mask, sub)."""
    low = name.lower()
    words = set(re.split(r"[^a-z0-9]+", low)) - {""}
    return words | {low.replace("_", "").replace("-", "").rsplit("/", 1)[-1]}


def _pick_label_key(
    c: Container, label_key: str | None, hw: tuple[int, int] | None, exclude: str | None, mode: LabelMode
) -> str | None:
    """The label map's key: ``label_key``, else the one 2-D integer(-valued) array of the cube's
    height and width. An array named like a mask (``mask``, ``valid``, ``roi``) is never taken;
    label-like names (``gt``, ``label(s)``, ``ground_truth``, ``classes``, ``class_map``) are
    preferred; several candidates left are a DataError listing them."""
    if label_key is not None:
        if label_key not in c.arrays:
            raise c.missing(label_key, "label_key")
        return label_key
    cands = [k for k, v in c.arrays.items() if k != exclude and len(v.shape) == 2 and not _words(k) & _MASK_WORDS]
    if hw is not None:
        cands = [k for k in cands if c.arrays[k].shape == hw]
    ints = [k for k in cands if c.arrays[k].kind in "uib"]
    ints += [k for k in cands if c.arrays[k].kind == "f" and _is_integral(_nodata_unlabelled(c, c.load(k)))]  # MATLAB often stores labels as double
    named = [k for k in ints if _words(k) & _LABEL_WORDS or "label" in k.lower() or "ground" in k.lower()]
    ints = named or ints
    if len(ints) == 1:
        return ints[0]
    if len(ints) > 1:
        raise DataError(
            f"{c.path}: several candidate label maps ({', '.join(ints)}); name one with label_key (data.label_key)"
        )
    if mode == "required":
        want = "" if hw is None else f" of size {hw[0]} x {hw[1]}"
        raise LabelsMissing(
            f"{c.path}: no 2-D integer label map{want} found (arrays named like a mask are not taken); available keys: "
            f"{c._listing()}; name it with label_key (data.label_key) or give label_path"
        )
    return None


# names of a band-centre array (case-insensitive); never one of a width, an index or a wavenumber
WAVELENGTH_NAMES = frozenset({
    "wavelength", "wavelengths", "wl", "wls", "lambda", "lambdas", "band_centers", "band_centres", "bandcenters",
    "bandcentres", "band_center", "band_centre", "centers", "centres", "wavelength_nm", "wavelengths_nm",
    "wavelength_um", "wavelengths_um", "wavelength_micrometers", "wavelength_micrometres", "wavelength_nanometers",
    "wavelength_nanometres", "wave", "waves", "wvl", "wavelen",
})


def _pick_wavelengths(c: Container, key: str | None, bands: int) -> np.ndarray | None:
    """Band centres in nm: ``key``'s array, else the header's, else the one array of one value per
    band whose name is a known wavelength name (:data:`WAVELENGTH_NAMES`, any case). Without one,
    such an array shaped as a table that would stand for the centres (a (B, 2) of centres and
    widths, or B values as (B/2, 2)) is a one-line DataError; other named arrays (k-means
    ``centers`` (K, B)) are skipped.

    Arrays carry no units: all values below 30 are read as micrometres (see
    :func:`~sciformer.data.hsi.wavelengths.to_nanometres`). Two or more such arrays are a
    DataError asking for ``wavelength_key``.
    """
    if key is not None:
        if key not in c.arrays:
            raise c.missing(key, "wavelength_key")
        where = f"{c.path} [{key}] (wavelength_key)"
        check_one_column(c.arrays[key].shape, where)
        if int(np.prod(c.arrays[key].shape)) != bands:
            raise DataError(f"{where}: {int(np.prod(c.arrays[key].shape))} values for a cube of {bands} band{'s' if bands != 1 else ''}; "
                            "expected one band centre per band")
        return check_wavelengths(to_nanometres(c.load(key), None, where), bands, where)
    if c.wavelengths is not None:
        return c.wavelengths  # checked and in nm (containers.py)
    named = {name: info.shape for name, info in c.arrays.items() if name.lower().rsplit("/", 1)[-1] in WAVELENGTH_NAMES}
    found = [name for name, shape in named.items() if int(np.prod(shape)) == bands and sum(n > 1 for n in shape) <= 1]
    if not found:  # a table that would be taken for the centres ((B, 2) centres and widths; B values in (B/2, 2))
        for name, shape in named.items():  # is refused, not skipped or flattened; others (k-means centres) are skipped
            size = int(np.prod(shape))
            if size == bands or (size == 2 * bands and bands in shape):
                check_one_column(shape, f"{c.path} [{name}]")
    if len(found) > 1:
        raise DataError(f"{c.path}: several band-centre arrays ({', '.join(found)}); name one with wavelength_key "
                        "(data.wavelength_key)")
    if found:
        where = f"{c.path} [{found[0]}]"
        return check_wavelengths(to_nanometres(c.load(found[0]), None, where), bands, where)
    return None


# ----------------------------------------------------------------------------- public API


def validate_labels(gt: np.ndarray, where: str) -> np.ndarray:
    """Check a label map (2-D, integral, >= 0) and return it as int64."""
    gt = np.asarray(gt)
    if gt.ndim == 3 and gt.shape[2] == 1:
        gt = gt[:, :, 0]
    if gt.ndim != 2:
        raise DataError(f"{where}: label map has shape {fmt_shape(gt.shape)}; expected 2-D (H, W)")
    if not _is_integral(gt):
        raise DataError(f"{where}: label map has non-integer or non-finite values; expected integer class ids")
    out = np.ascontiguousarray(gt, dtype=np.int64)  # (H, W)
    if out.size and out.min() < 0:
        raise DataError(f"{where}: label map has negative values (min {out.min()}); expected 0 = unlabelled, 1..K")
    if out.size and out.max() > MAX_CLASS_ID:
        raise DataError(f"{where}: label map has class id {out.max()}; expected class ids up to {MAX_CLASS_ID}")
    return out


def validate_cube(cube: np.ndarray, where: str) -> np.ndarray:
    """Check a cube (3-D, numeric, not empty) and return it unchanged (native dtype)."""
    cube = np.asarray(cube)
    if cube.ndim != 3:
        raise DataError(f"{where}: image has shape {fmt_shape(cube.shape)}; expected 3-D (H, W, B)")
    if cube.dtype.kind not in "uif":
        raise DataError(f"{where}: image dtype {cube.dtype} is not numeric")
    if min(cube.shape) == 0:
        raise DataError(f"{where}: image has an empty axis, shape {fmt_shape(cube.shape)}")
    return cube  # NaN / Inf pixels are no-data (sciformer.data.hsi.nodata)


def load_labels(c: Container, key: str) -> np.ndarray:
    """The label map ``key`` of ``c``, checked (:func:`validate_labels`), with the pixels equal to the
    no-data value its file declares (GeoTIFF ``nodata``, ENVI ``data ignore value``) unlabelled (0)."""
    return validate_labels(_nodata_unlabelled(c, c.load(key)), f"{c.path} [{key}]")


def _nodata_unlabelled(c: Container, raw: np.ndarray) -> np.ndarray:
    """``raw`` with the pixels equal to ``c``'s declared no-data value (NaN included) set to 0."""
    raw = np.asarray(raw)
    if c.nodata is None:
        return raw
    nodata = np.isnan(raw) if np.isnan(c.nodata) and raw.dtype.kind == "f" else raw == c.nodata
    return np.where(nodata, 0, raw) if np.any(nodata) else raw


def read_labels(
    path: str | os.PathLike[str], label_key: str | None = None, shape: tuple[int, int] | None = None,
    label_file: bool = True,
) -> np.ndarray:
    """Read a 2-D label map (int64, 0 = unlabelled, as are the file's declared no-data pixels) from any supported file.
    ``label_file`` False: ``path`` is a cube file searched for a label map (a one-band ENVI file with a
    wavelength is its cube then, not a label map)."""
    c = open_container(path, label_file)
    key = _pick_label_key(c, label_key, shape, None, "required")
    assert key is not None
    gt = load_labels(c, key)
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
        label_path: separate file holding the label map, paired pixel by pixel with the
            image (when both carry a georeference, their grids must agree: a DataError otherwise).
        wavelength_key: array of band centres; else taken from an ENVI header
            (``wavelength`` in its ``wavelength units``) or an array named like
            ``wavelength`` with one value per band. Returned in nm; unit-less values
            all below 30 are read as micrometres.
        class_names: names of classes 1..K (else from an ENVI classification header).
        labels: ``"required"`` (error if none), ``"optional"`` (None if none found)
            or ``"none"`` (do not look). Label pixels equal to the label file's declared
            no-data value (GeoTIFF ``nodata``, ENVI ``data ignore value``) are unlabelled (0).

    Raises:
        DataError: missing or unreadable file, missing key, ambiguous keys,
            size mismatch. NaN/Inf pixels and the file's no-data value
            (``meta["nodata"]``) mark no-data pixels (:mod:`sciformer.data.hsi.nodata`).
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
            from sciformer.data.hsi.georef import check_same_grid

            lc = open_container(label_path, label_file=True)
            lkey = _pick_label_key(lc, label_key, None, None, "required")
            check_same_grid(c.path, lc.path)
        else:
            lc = c
            lkey = _pick_label_key(c, label_key, hw, key, labels if label_key is None else "required")
        if lkey is not None:
            where = f"{lc.path} [{lkey}]"
            gt = load_labels(lc, lkey)
            if gt.shape != hw:
                raise DataError(
                    f"{where}: label map is {gt.shape[0]} x {gt.shape[1]}; image {c.path} is {hw[0]} x {hw[1]}"
                )
            if names is None and lc.class_names:
                names = list(lc.class_names)
    if gt is None and labels == "required":
        raise LabelsMissing(f"{c.path}: no label map found; give label_key or label_path")
    if gt is not None and labels == "required" and not gt.any():
        raise LabelsMissing(f"{lc.path} [{lkey}]: label map has no labelled pixels (all 0); expected classes 1..K")
    return Scene(
        cube=cube,
        gt=gt,
        wavelengths=wavelengths,
        class_names=names,
        source=str(path),
        meta={"image_key": key, **({} if c.fwhm is None else {"fwhm": c.fwhm}),
              **({} if c.nodata is None else {"nodata": c.nodata}),
              **({} if c.bad_bands is None else {"bad_bands": c.bad_bands})},
    )


# Names that say "the pixels to keep (1)" and nothing else: a name merely holding 'mask' may mark
# training pixels (train_mask), a class (water_mask) or, from numpy's masked arrays, invalid pixels.
_VALID_NAMES = frozenset({"mask_sub", "valid", "valid_mask", "validmask", "valid_pixels", "valid_area", "roi", "roi_mask"})


def read_valid_mask(path: str | os.PathLike[str], shape: tuple[int, int], exclude: str | None = None) -> tuple[np.ndarray | None, str | None]:
    """The valid-pixel mask a cube file carries beside the cube, and a note for the user (or None).

    A 2-D array of the cube's height and width named as a mask of pixels to keep (one of
    :data:`_VALID_NAMES`, any case: ``valid``, ``valid_mask``, ``roi``, MUUFL's ``mask_sub``)
    holding only 0 and 1 (bool or numbers): (H, W) bool, True where valid, with a note naming it and what it leaves out.
    None (with a note saying why) when several such arrays are found or the mask would leave no
    pixel; None without a note when there is none or it leaves every pixel valid.

    Shapes:
        shape: (H, W) -> mask (H, W) bool
    """
    c = open_container(path)
    keys = [k for k, v in c.arrays.items() if k != exclude and v.shape == tuple(shape) and v.kind in "uibf"
            and k.lower() in _VALID_NAMES]
    masks = {}
    for key in keys:
        arr = c.load(key)
        if arr.dtype.kind == "b" or bool(np.isin(arr, (0, 1)).all()):
            masks[key] = arr.astype(bool)
    if len(masks) > 1:
        return None, f"note: {c.path}: several valid-pixel masks ({', '.join(masks)}); none applied, every pixel is classified"
    if not masks:
        return None, None
    key, mask = next(iter(masks.items()))
    if not mask.any():
        return None, f"note: {c.path}: the mask '{key}' marks no pixel as valid (all 0); not applied, every pixel is classified"
    if mask.all():
        return None, None
    return mask, (f"note: {c.path}: the valid-pixel mask '{key}' marks {int((~mask).sum())} of {mask.size} pixels as outside "
                  "the valid area (0); they are not classified (0 in the map, NaN probabilities), as no-data pixels are")


def list_arrays(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the numeric arrays in ``path`` (for error messages and ``info``)."""
    c = open_container(path)
    return {k: v.shape for k, v in c.arrays.items()}
