"""``sciformer predict`` for hyperspectral scenes: a trained model over every pixel of a cube file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sciformer.contracts import (
    Batch,
    PredictFn,
    PredictOptions,
)
from sciformer.data.hsi.builtin import is_builtin, load_builtin
from sciformer.data.hsi.config import HSISceneConfig
from sciformer.data.hsi.export import save_map_envi, save_map_npy, save_map_png
from sciformer.data.hsi.normalize import Normalizer
from sciformer.data.hsi.patches import pad_cube, predict_scene
from sciformer.data.hsi.readers import (
    Scene,
    list_arrays,
    read_labels,
    read_scene,
)
from sciformer.errors import DataError

_PRED_SUFFIXES = (".npy", ".png", ".hdr", ".img")


def _read_for_prediction(cfg: HSISceneConfig, input_path: Path) -> Scene:
    if is_builtin(str(input_path)) and not input_path.exists():
        return load_builtin(str(input_path))
    keys = list_arrays(input_path)
    image_key = cfg.image_key if cfg.image_key in keys else None
    scene = read_scene(input_path, image_key, labels="none")
    try:  # a label map in the same file only decorates the PNG
        scene.gt = read_labels(input_path, None, scene.cube.shape[:2])
    except DataError:
        scene.gt = None
    return scene


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
    """Predict every pixel of a cube file with a trained model; write the map.

    The output format follows ``output_path``'s suffix: ``.npy`` (label map, 0 =
    unclassified, classes 1..K), ``.png`` (map with legend, ground truth beside it when
    the file has one; plus a ``.npy`` sibling) or ``.hdr``/``.img`` (ENVI classification
    file; plus a ``.npy`` sibling).
    """
    (options or PredictOptions()).require_defaults("hsi_scene", "overlap", "rotations", "flip", "votes")
    input_path, output_path = Path(input_path), Path(output_path)
    suffix = output_path.suffix.lower()
    if suffix not in _PRED_SUFFIXES:
        raise DataError(
            f"{output_path}: unsupported output suffix '{output_path.suffix}'; use one of {', '.join(_PRED_SUFFIXES)}"
        )
    try:
        norm = Normalizer.from_state(state["normaliser"])
        class_names = [str(n) for n in state["class_names"]]
        patch_size = int(state["patch_size"])
        padding = str(state.get("padding", cfg.padding))
        in_bands = int(state["in_bands"])
    except KeyError as exc:
        raise DataError(f"checkpoint data state: missing key {exc.args[0]!r}; not an hsi_scene checkpoint") from exc
    scene = _read_for_prediction(cfg, input_path)
    if scene.num_bands != in_bands:
        raise DataError(
            f"{input_path}: the cube has {scene.num_bands} bands but the model was trained on {in_bands} bands"
        )
    padded = pad_cube(norm.transform(scene.cube), patch_size, padding)  # (C, H + 2r, W + 2r)
    wl = state.get("wavelengths")
    wavelength = torch.as_tensor(wl, dtype=torch.float32) if wl is not None else None

    def make_batch(patches: torch.Tensor) -> Batch:
        batch: Batch = {"patch": patches}
        if wavelength is not None:
            batch["wavelength"] = wavelength
        return batch

    ids = predict_scene(predict, padded, patch_size, batch_size, make_batch=make_batch)  # (H, W)
    label_map = ids + 1
    if suffix == ".npy":
        return save_map_npy(output_path, label_map)
    save_map_npy(output_path.with_suffix(".npy"), label_map)
    if suffix == ".png":
        gt = scene.gt if scene.gt is not None and scene.gt.max() <= len(class_names) else None
        return save_map_png(output_path, label_map, class_names, gt=gt)
    save_map_envi(output_path.with_suffix(".hdr"), label_map, class_names)
    return output_path


