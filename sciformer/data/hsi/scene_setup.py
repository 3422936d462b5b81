"""Building an ``hsi_scene`` task's inputs: the scene of ``data.source``, its split and class names."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sciformer.contracts import BuildContext
from sciformer.data.hsi.bandmatch import input_wavelengths
from sciformer.data.hsi.builtin import is_builtin, load_builtin
from sciformer.data.hsi.config import HSISceneConfig
from sciformer.data.hsi.readers import Scene, load_labels, open_container, read_labels, read_scene
from sciformer.data.hsi.splits import Split, block_split, fixed_split, stratified_split
from sciformer.data.hsi.wavelengths import bands_ascending
from sciformer.errors import ConfigError, DataError


def load_source(cfg: HSISceneConfig, ctx: BuildContext) -> Scene:
    """The scene named by ``cfg.source`` (built-in name or file relative to the config)."""
    if is_builtin(cfg.source):
        for key in ("image_key", "label_key", "label_path", "wavelength_key"):
            if getattr(cfg, key) is not None:
                raise ConfigError(f"data.{key}: does not apply to the built-in source '{cfg.source}'; remove it")
        scene = load_builtin(cfg.source)
    else:
        path = ctx.resolve(cfg.source)
        label_path = ctx.resolve(cfg.label_path) if cfg.label_path else None
        needs_gt = cfg.split.kind != "fixed"
        scene = read_scene(
            path,
            cfg.image_key,
            cfg.label_key,
            label_path=label_path,
            wavelength_key=cfg.wavelength_key,
            labels="required" if needs_gt else "optional",
        )
    if cfg.wavelengths is not None:  # the YAML's centres: one per band, and not against the file's
        scene.wavelengths = input_wavelengths(scene.wavelengths, np.asarray(cfg.wavelengths), scene.num_bands,
                                              scene.source, "data.wavelengths", ConfigError)
    where = f"{scene.source}: band centres" + (" (data.wavelengths)" if cfg.wavelengths is not None else "")
    scene.cube, scene.wavelengths, order = bands_ascending(scene.cube, scene.wavelengths, where,
                                                           ConfigError if cfg.wavelengths is not None else DataError)
    if order is not None:  # bands in ascending order of centre from here on (the file's order is kept in the state)
        scene.meta["band_order"] = order
        if scene.meta.get("fwhm") is not None:
            scene.meta["fwhm"] = np.asarray(scene.meta["fwhm"])[order]
    return scene


def _read_split_map(path: Path, key: str | None, default_key: str, hw: tuple[int, int]) -> np.ndarray:
    """A fixed split's map (``TR`` / ``TE`` by default) of the image's height and width."""
    c = open_container(path, label_file=True)
    if key is None and default_key in c.arrays:
        key = default_key
    if key is None:
        return read_labels(path, None, hw)
    where = f"{path} [{key}]"
    gt = load_labels(c, key)
    if gt.shape != hw:
        raise DataError(f"{where}: split map is {gt.shape[0]} x {gt.shape[1]}; the image is {hw[0]} x {hw[1]}")
    return gt


def make_split(cfg: HSISceneConfig, scene: Scene, ctx: BuildContext) -> Split:
    """Apply ``cfg.split`` to the scene."""
    s = cfg.split
    seed = ctx.seed if s.seed is None else s.seed
    hw = scene.cube.shape[:2]
    common = dict(val_fraction=s.val_fraction, val_per_class=s.val_per_class, seed=seed, patch_size=cfg.patch_size)
    if s.kind == "fixed":
        assert s.train_path is not None
        train_path = ctx.resolve(s.train_path)
        test_path = ctx.resolve(s.test_path) if s.test_path else train_path
        if Path(scene.source).is_file():  # split maps on another grid or CRS: refused, as a label map is
            from sciformer.data.hsi.georef import check_same_grid

            for path in dict.fromkeys((train_path, test_path)):
                if Path(path).is_file():  # a missing map is named by its reader
                    check_same_grid(scene.source, path, "split map")
        tr = _read_split_map(train_path, s.train_key, "TR", hw)
        te = _read_split_map(test_path, s.test_key, "TE", hw)
        split = fixed_split(tr, te, **common)
        split.protocol["files"] = {"train": str(train_path), "test": str(test_path)}
        return split
    if scene.gt is None:
        raise DataError(f"{scene.source}: no label map; give data.label_key or data.label_path")
    if s.kind == "stratified":
        return stratified_split(scene.gt, s.train_per_class, **common)
    return block_split(scene.gt, s.block_size, train_fraction=s.train_fraction, margin=cfg.margin, **common)


def class_names_for(cfg: HSISceneConfig, scene: Scene, max_label: int) -> list[str]:
    """Names of classes 1..max_label: ``data.class_names``, else the file's, else ``class_<k>``."""
    if cfg.class_names is not None:
        if len(cfg.class_names) < max_label:
            raise ConfigError(
                f"data.class_names: {len(cfg.class_names)} names given but the labels go up to {max_label}"
            )
        return list(cfg.class_names)
    if scene.class_names and len(scene.class_names) >= max_label:
        return list(scene.class_names)
    return [f"class_{k}" for k in range(1, max_label + 1)]
