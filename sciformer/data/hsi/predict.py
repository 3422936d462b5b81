"""``sciformer predict`` for hyperspectral scenes: a trained model over every pixel of a cube file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sciformer.contracts import (
    CLASS_MASK,
    Batch,
    PredictFn,
    PredictOptions,
)
from sciformer.data.hsi.bandmatch import BandPlan, TrainedBands, checkpoint_order, input_wavelengths, plan_bands
from sciformer.data.hsi.builtin import is_builtin, load_builtin
from sciformer.data.hsi.config import HSISceneConfig
from sciformer.data.hsi.export import (
    probability_paths,
    save_map_envi,
    save_map_npy,
    save_map_png,
    save_probabilities_envi,
    save_probabilities_npy,
)
from sciformer.data.hsi.georef import check_same_grid, georef_of, writable_georef
from sciformer.data.hsi.geotiff import (
    GEOTIFF_SUFFIXES,
    write_geotiff_map,
    write_geotiff_probabilities,
)
from sciformer.data.hsi.nodata import bad_bands, fill_nodata, nodata_pixels, nodata_warning
from sciformer.data.hsi.normalize import Normalizer
from sciformer.data.hsi.patches import pad_transformed, predict_scene
from sciformer.data.hsi.readers import (
    Scene,
    list_arrays,
    read_labels,
    read_scene,
    read_valid_mask,
)
from sciformer.data.hsi.wavelengths import bands_ascending, read_wavelength_spec, same_wavelengths
from sciformer.data.predicting import check_class_names, start_prediction, state_value
from sciformer.errors import DataError
from sciformer.frontend import option
from sciformer.utils.progress import progress

PREDICT_SUFFIXES = (".npy", ".png", ".hdr", ".img", *GEOTIFF_SUFFIXES)


def _read_for_prediction(cfg: HSISceneConfig, input_path: Path, trained: dict[str, Any]) -> tuple[Scene, dict[str, Any] | None]:
    """The scene of an input file (and its georeference: ENVI map info or GeoTIFF transform + CRS).

    An ``image_key`` / ``wavelength_key`` the input lacks is looked for automatically when it is
    the training file's (``trained``: the checkpoint's data config), and refused when it was
    given for this prediction (an override). A valid-pixel mask the file carries beside the cube
    (:func:`~sciformer.data.hsi.readers.read_valid_mask`) goes to ``scene.meta["valid"]`` (H, W) bool,
    with a note naming it: its 0 pixels are predicted as no-data pixels are.
    """
    if is_builtin(str(input_path)) and not input_path.exists():
        return load_builtin(str(input_path)), None
    keys = list_arrays(input_path)
    image_key, wavelength_key = (getattr(cfg, name) if getattr(cfg, name) in keys or getattr(cfg, name) != trained.get(name) else None
                                 for name in ("image_key", "wavelength_key"))
    scene = read_scene(input_path, image_key, labels="none", wavelength_key=wavelength_key)
    try:  # a label map in the same file only decorates the PNG
        scene.gt = read_labels(input_path, None, scene.cube.shape[:2], label_file=False)
    except DataError:
        scene.gt = None
    valid, note = read_valid_mask(input_path, scene.cube.shape[:2], exclude=scene.meta.get("image_key"))
    if valid is not None:
        scene.meta["valid"] = valid  # (H, W) bool
    if note:
        print(note, file=sys.stderr)
    return scene, georef_of(input_path)


def arrange_bands(state: dict[str, Any], cube: np.ndarray, wl: np.ndarray | None,
                  where: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """An input cube's bands in the order the model was trained on, whatever the file's order,
    and the file's band of each (``cube_out[..., i]`` is ``cube[..., order[i]]``).

    When the training scene had centres (``bands_ascending`` in the state, or training
    centres recorded) and the input has them: ascending order of centre, or, for a checkpoint
    trained on bands out of that order (before they were sorted) and an input of the same
    band set, the checkpoint's order. An input of as many bands without centres is read in
    the training file's order (``band_order``). Otherwise the file's order.
    """
    kept = np.arange(cube.shape[-1])  # (B,)
    trained = state.get("wavelengths")
    trained = None if trained is None else np.asarray(trained.tolist() if hasattr(trained, "tolist") else trained, dtype=np.float64)
    if not state.get("bands_ascending") and trained is None:
        return cube, wl, kept
    if wl is None:
        order = state.get("band_order")
        if order is not None and cube.shape[-1] == len(order):
            order = np.asarray(order.tolist() if hasattr(order, "tolist") else order, dtype=np.int64)
            return np.ascontiguousarray(np.take(cube, order, axis=-1)), wl, order
        return cube, wl, kept
    cube, wl, order = bands_ascending(cube, wl, f"{where}: band centres")
    kept = kept if order is None else order
    back = checkpoint_order(trained, wl)  # ascending -> an older checkpoint's order
    if back is not None:
        cube, wl, kept = np.ascontiguousarray(np.take(cube, back, axis=-1)), wl[back], kept[back]
    return cube, wl, kept


def _leave_out_bands(scene: Scene, plan: BandPlan, trained: TrainedBands, norm: Normalizer, file_band: np.ndarray,
                     where: str) -> Normalizer:
    """Feed the model the bands ``plan`` keeps, less the bad ones (ENVI ``bbl`` = 0, NaN on every pixel, or, on
    another band set than the trained one, 0 on every pixel) for a model placing bands by wavelength (an index model needs every band: they stay, with a note); ``scene.cube``
    is cut in place, ``plan.wavelengths`` too, and the normaliser returned is read at the bands fed.
    ``file_band``: the file's band of each of ``scene.cube``'s (:func:`arrange_bands`)."""
    listed = scene.meta.get("bad_bands")
    placed = trained.by_wavelength and plan.wavelengths is not None  # bands fed by wavelength: any set the model can take
    other_set = placed and not same_wavelengths(np.sort(plan.wavelengths), np.sort(trained.wavelengths))  # type: ignore[arg-type]
    if listed is not None and np.any(listed) and placed and not other_set:  # the trained band set: trained on them all
        print(f"note: {where}: the ENVI bbl marks {int(np.asarray(listed, dtype=bool).sum())} band(s) bad; kept, the "
              "model was trained on this band set with them", file=sys.stderr)
        listed = None
    bad, what = bad_bands(scene.cube, None if listed is None else np.asarray(listed)[file_band], file_band, zeros=other_set)  # (B,)
    keep = np.ones(scene.num_bands, dtype=bool) if plan.keep is None else plan.keep.copy()  # (B,)
    if bad.any() and not trained.by_wavelength:
        print(f"note: {where}: bad bands kept, the model places bands by index and takes all {trained.bands}: {what}",
              file=sys.stderr)
    elif bad.any() and plan.wavelengths is not None:
        if not (keep & ~bad).any():
            raise DataError(f"{where}: every band the model could take is bad ({what}); nothing is left to predict from")
        plan.wavelengths, plan.resample = plan.wavelengths[~bad[keep]], True  # (B',)
        keep &= ~bad
        print(f"note: {where}: {int(bad.sum())} bad band(s) left out: {what}", file=sys.stderr)
    if not keep.all():
        scene.cube = np.ascontiguousarray(scene.cube[..., keep])  # (H, W, B')
    if plan.resample:
        assert trained.wavelengths is not None and plan.wavelengths is not None
        return norm.at_wavelengths(trained.wavelengths, plan.wavelengths)
    return norm


def trained_class_mask(present: Any, num_classes: int) -> torch.Tensor | None:
    """(num_classes,) bool, True for the 0-based classes in ``present`` (those with training pixels,
    as a checkpoint's ``trained_classes`` records them); None when every class is there or no
    record exists (an older checkpoint: every class may be predicted, as before)."""
    if present is None:
        return None
    mask = torch.zeros(num_classes, dtype=torch.bool)
    ids = [int(i) for i in present if 0 <= int(i) < num_classes]
    mask[ids] = True
    return None if bool(mask.all()) or not ids else mask


def read_label_map(path: Path, shape: tuple[int, int], num_classes: int, image: Path | None = None) -> np.ndarray:
    """A ground-truth map for ``--labels`` (any label file, or a single-band GeoTIFF): (H, W) int64, 0..K
    (on ``image``'s grid where both carry a georeference)."""
    gt = read_labels(path, None, None)  # a single-band GeoTIFF is a label map too
    if image is not None and image.exists():
        check_same_grid(image, path, "--labels map")
    if gt.shape != tuple(shape):
        raise DataError(f"--labels {path}: the map is {gt.shape[0]} x {gt.shape[1]}, the scene {shape[0]} x {shape[1]}")
    if gt.max() > num_classes:
        raise DataError(f"--labels {path}: values up to {gt.max()} but the model has {num_classes} classes (0 = unlabelled, 1..{num_classes})")
    return gt


def map_scores(label_map: np.ndarray, gt: np.ndarray, num_classes: int) -> dict[str, float]:
    """Overall and mean per-class accuracy of a map on the labelled pixels of ``gt`` (0 = unlabelled)."""
    seen = (gt > 0) & (label_map > 0)  # no-data pixels have no prediction to score
    truth, pred = gt[seen] - 1, label_map[seen] - 1
    conf = np.bincount(truth * num_classes + pred, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    support = conf.sum(axis=1)
    acc = np.diag(conf)[support > 0] / support[support > 0]
    return {"pixels": int(seen.sum()), "skipped": int(((gt > 0) & (label_map == 0)).sum()),
            "oa": float(np.trace(conf) / max(1, conf.sum())), "aa": float(acc.mean()) if len(acc) else 0.0}


def scores_line(name: str, s: dict[str, float], labels: object) -> str:
    """The console line of :func:`map_scores` (labelled no-data pixels counted, never scored)."""
    skipped = f"; {s['skipped']} labelled no-data pixel(s) not scored" if s["skipped"] else ""
    if not s["pixels"]:
        return f"{name}: no labelled pixel to score in {labels}{skipped}"
    return f"{name}: OA {100 * s['oa']:.2f}  AA {100 * s['aa']:.2f} on {s['pixels']} labelled pixels of {labels}{skipped}"


def predict_hsi_file(
    cfg: HSISceneConfig,
    state: dict[str, Any],
    predict: PredictFn,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    *,
    options: PredictOptions | None = None,
) -> Path:
    """Predict every pixel of a cube file with a trained model; write the map (and only it).

    The output format follows ``output_path``'s suffix: ``.npy`` (label map, 0 =
    unclassified, classes 1..K), ``.png`` (map with legend, ground truth beside it when
    ``options.labels`` names a label map or the file has one), ``.hdr``/``.img`` (ENVI
    classification file, the input's ``map info`` / ``coordinate system string`` kept) or
    ``.tif``/``.tiff`` (GeoTIFF with the input's georeference, no-data 0, a colour table
    and class names; needs rasterio). Inputs: any cube file the dataset reads, or a GeoTIFF.
    With ``options.labels`` the overall / mean class accuracy on its labelled pixels is printed.
    With ``options.probabilities`` the class probabilities go to a second file beside the
    map, in the map's format (:func:`~sciformer.data.hsi.export.probability_paths`).
    The input's band set is matched to the model's by :func:`~sciformer.data.hsi.bandmatch.plan_bands`
    (centres from the file or ``options.wavelengths``; ``options.allow_band_mismatch``).
    No-data pixels (:mod:`~sciformer.data.hsi.nodata`), and those outside a valid-pixel mask the
    input file carries (``mask_sub``: :func:`~sciformer.data.hsi.readers.read_valid_mask`), get label 0 and NaN probabilities.
    A class without training pixels (the checkpoint's ``trained_classes``) is never predicted:
    its probability is 0.
    """
    options, input_path, output_path = start_prediction(
        "hsi_scene", options, input_path, output_path, PREDICT_SUFFIXES,
        refuse=("overlap", "rotations", "flip", "votes", "columns", "category"),
        accept=("wavelengths", "allow_band_mismatch"))
    suffix = output_path.suffix.lower()
    norm = Normalizer.from_state(state_value(state, "normaliser", "hsi_scene"))
    class_names = [str(n) for n in state_value(state, "class_names", "hsi_scene")]
    if cfg.class_names is not None:  # the checkpoint's names, or names for its unnamed classes (as evaluate takes them)
        check_class_names(class_names, cfg.class_names, "data.class_names")
        class_names = list(cfg.class_names)
    patch_size = int(state_value(state, "patch_size", "hsi_scene"))
    padding = str(state.get("padding", cfg.padding))
    trained = TrainedBands.from_state(state)
    given = None if options.wavelengths is None else read_wavelength_spec(options.wavelengths, option("--wavelengths"))
    scene, georef = _read_for_prediction(cfg, input_path, state.get("data_config") or {})
    wl = input_wavelengths(scene.wavelengths, given, scene.num_bands, str(input_path), option("--wavelengths"))
    scene.cube, wl, file_band = arrange_bands(state, scene.cube, wl, str(input_path))
    plan = plan_bands(trained, scene.num_bands, wl, str(input_path), allow_mismatch=options.allow_band_mismatch)
    norm = _leave_out_bands(scene, plan, trained, norm, file_band, str(input_path))
    if options.labels is not None:
        scene.gt = read_label_map(Path(options.labels), scene.cube.shape[:2], len(class_names), input_path)
    nodata = nodata_pixels(scene.cube, scene.meta.get("nodata"))  # (H, W): label 0, NaN probabilities
    warning = nodata_warning(scene.cube, nodata, str(input_path), file_band)
    if warning:
        print(warning, file=sys.stderr)
    if "valid" in scene.meta:
        nodata |= ~scene.meta["valid"]  # outside the file's valid-pixel mask: as no-data
    padded = pad_transformed(  # no-data pixels filled with the shift: 0 once normalised, neighbours' patches stay clean
        scene.cube, lambda rows, y: norm.transform(fill_nodata(rows, nodata[y : y + len(rows)], norm.shift), str(input_path), y),
        norm.out_channels, patch_size, padding)  # (C, H + 2r, W + 2r)
    h, w = scene.cube.shape[:2]
    scene.cube = np.empty((0, 0, scene.cube.shape[2]), scene.cube.dtype)  # the padded tensor is all the model reads: the cube is let go
    wavelength = None if plan.wavelengths is None else torch.as_tensor(plan.wavelengths, dtype=torch.float32)  # (B,)
    class_mask = trained_class_mask(state.get("trained_classes"), len(class_names))  # (K,): classes never trained: never predicted

    def make_batch(patches: torch.Tensor) -> Batch:
        batch: Batch = {"patch": patches}
        if wavelength is not None:
            batch["wavelength"] = wavelength
        if class_mask is not None:
            batch[CLASS_MASK] = class_mask
        return batch

    bar: Any = progress(iter(()), input_path.name, total=-(-h * w // max(1, batch_size)))  # a bar on a terminal only

    def counted(batch: Batch) -> torch.Tensor:
        logits = predict(batch)
        if hasattr(bar, "update"):
            bar.update(1)
        return logits

    probs = np.full((h, w, len(class_names)), np.nan, dtype=np.float32) if options.probabilities else None  # (H, W, K)
    valid = ~nodata if nodata.any() else None
    try:
        ids = predict_scene(counted, padded, patch_size, batch_size, mask=valid, make_batch=make_batch, probabilities=probs,
                            where=str(input_path))  # (H, W)
    finally:
        if hasattr(bar, "close"):
            bar.close()
    label_map = ids + 1  # 0 (unclassified) on no-data pixels
    if options.labels is not None:
        print(scores_line(input_path.name, map_scores(label_map, scene.gt, len(class_names)), options.labels))
    georef = writable_georef(georef, output_path)  # one line where the output cannot carry it whole
    if probs is None:
        return _write_map(output_path, label_map, class_names, scene.gt, georef)
    prob_paths = probability_paths(output_path)  # written first: a map on disk means its probabilities are there too
    if suffix in GEOTIFF_SUFFIXES:
        write_geotiff_probabilities(prob_paths[0], probs, class_names, georef)
    elif suffix in (".hdr", ".img"):
        save_probabilities_envi(prob_paths[0], probs, class_names, georef)
    else:
        save_probabilities_npy(prob_paths[0], probs, class_names)
    try:
        return _write_map(output_path, label_map, class_names, scene.gt, georef)
    except BaseException:  # no probabilities without their map
        for path in prob_paths:
            path.unlink(missing_ok=True)
        raise


def _write_map(output_path: Path, label_map: np.ndarray, class_names: list[str], gt: np.ndarray | None,
               georef: dict[str, Any] | None) -> Path:
    """The map in the format of ``output_path``'s suffix (see :func:`predict_hsi_file`)."""
    suffix = output_path.suffix.lower()
    if suffix == ".npy":
        return save_map_npy(output_path, label_map)
    if suffix == ".png":
        gt = gt if gt is not None and gt.max() <= len(class_names) else None
        return save_map_png(output_path, label_map, class_names, gt=gt)
    if suffix in GEOTIFF_SUFFIXES:
        return write_geotiff_map(output_path, label_map, class_names, georef)
    hdr, _ = save_map_envi(output_path.with_suffix(".hdr"), label_map, class_names, georef=georef)
    return hdr  # map.HDR / map.IMG: written as map.hdr + map.img


def written_beside(output_path: Path, options: PredictOptions) -> list[Path]:
    """Files ``predict_hsi_file`` writes besides ``output_path`` (and its ENVI companion)."""
    return probability_paths(output_path) if options.probabilities else []


predict_hsi_file.suffixes = PREDICT_SUFFIXES  # type: ignore[attr-defined]  # checked before the model loads
predict_hsi_file.written_beside = written_beside  # type: ignore[attr-defined]  # checked like the output itself
