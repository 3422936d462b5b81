"""The ``hsi_scene`` dataset: one labelled hyperspectral scene, split, normalised, patched.

An experiment's ``data:`` section (every key optional; shown with its default)::

    data:
      name: hsi_scene
      source: indian_pines        # built-in scene, or a file relative to the config file
      image_key: null             # array names inside .mat/.npz files (found automatically)
      label_key: null
      label_path: null            # labels in a separate file
      wavelength_key: null        # array of band centres in a .mat/.npz (ENVI headers: read automatically)
      wavelengths: null           # band centres in nm, one per band, e.g. [400.0, 410.0, ...]
                                  #   (an error if the file carries different ones)
      patch_size: 7               # odd
      padding: reflect            # reflect | symmetric | edge | zero
      normalise: standard         # standard | minmax | none, fitted on training pixels
      pca_components: null        # e.g. 30; PCA fitted on training pixels
      augment: {flip: true, rotate: true}   # training patches only; `augment: false` turns both off
                                  #   also illumination: 0.1 (raw spectra x U[0.9, 1.1] per patch), noise: 0.05
      split:
        kind: blocks              # fixed | stratified | blocks
        block_size: 12            # blocks: square tiles, ~train_fraction of each class to train
        train_fraction: 0.5
        margin: null              # blocks: drop test pixels this close to training pixels
                                  #   (null = patch_size // 2: no test pixel inside a training window)
        val_fraction: 0.1         # validation carved from training pixels (or val_per_class)
        seed: null                # null = the run's seed

Targets are 0-based class ids (label ``k >= 1`` in the files becomes ``k - 1``);
unlabelled pixels never appear in a split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sciformer.contracts import (
    CLASS_MASK,
    Batch,
    BuildContext,
    DataInfo,
    PredictFn,
    PredictOptions,
    ScoreFn,
    TaskData,
)
from sciformer.data.hsi.bandmatch import EVALUATE_CENTRES, TrainedBands, checkpoint_order, plan_bands
from sciformer.data.hsi.config import AugmentConfig, HSISceneConfig
from sciformer.data.hsi.export import save_map_envi, save_map_npy, save_map_png
from sciformer.data.hsi.nodata import fill_nodata, nodata_pixels, refuse_labelled_nodata
from sciformer.data.hsi.normalize import Normalizer
from sciformer.data.hsi.patches import PatchDataset, pad_transformed, predict_scene
from sciformer.data.hsi.predict import predict_hsi_file, trained_class_mask
from sciformer.data.hsi.scene_setup import class_names_for, load_source, make_split
from sciformer.data.hsi.splits import Split
from sciformer.errors import ConfigError, DataError
from sciformer.registry import DATASETS
from sciformer.utils.atomic import atomic_write_text, atomic_write_with


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


@dataclass
class _SceneFacts:
    source: str
    height: int
    width: int
    bands: int
    labelled: int


class HSISceneTask(TaskData):
    """A scene ready for training: split maps, fitted normaliser, padded cube (B, H+2r, W+2r)."""

    def __init__(
        self,
        cfg: HSISceneConfig,
        split: Split,
        normalizer: Normalizer,
        padded: torch.Tensor,
        class_names: list[str],
        wavelengths: np.ndarray | None,
        gt: np.ndarray | None,
        facts: _SceneFacts,
    ) -> None:
        self.cfg = cfg
        self.split = split
        self.normalizer = normalizer
        self.padded = padded  # (C, H + 2r, W + 2r) float32, shared by every split
        self.class_names = class_names
        self.wavelengths = wavelengths
        self.gt = gt
        self.facts = facts
        channels = normalizer.out_channels
        use_wl = wavelengths is not None and normalizer.pca_components is None
        self._wavelength = torch.as_tensor(wavelengths, dtype=torch.float32) if use_wl else None  # (B,)
        self.info = DataInfo(
            num_classes=len(class_names),
            class_names=list(class_names),
            in_channels=channels,
            patch_size=cfg.patch_size,
            wavelengths=[float(w) for w in wavelengths] if use_wl else None,
        )
        self._datasets: dict[str, PatchDataset] = {}
        self.band_order: np.ndarray | None = None  # the permutation that sorted the training file's bands, if any
        self.nodata: np.ndarray | None = None  # (H, W) no-data pixels: label 0 in exported maps
        present = [i for i, n in enumerate(self.class_counts()) if n > 0]
        self.class_mask = trained_class_mask(present, self.info.num_classes)  # (K,) False: no training pixel, never predicted

    # ------------------------------------------------------------------ data
    def dataset(self, split: str) -> PatchDataset:
        maps = self.split.maps()
        if split not in maps:
            raise ConfigError(f"split: unknown split '{split}'; expected one of train, val, test")
        if split not in self._datasets:
            label_map = maps[split]
            rows, cols = np.nonzero(label_map)  # row-major order
            coords = np.stack([rows, cols], axis=1)  # (n, 2)
            targets = label_map[rows, cols] - 1  # (n,) 0-based
            self._datasets[split] = self._patches(coords, targets, augment=split == "train")
        return self._datasets[split]

    def pretrain_dataset(self, pixels: str = "all") -> PatchDataset:
        """Patches for self-supervised pre-training (targets are 0; no label is read): every
        pixel of the scene (``"all"``: unlabelled and test pixels included) or the training
        pixels (``"train"``), in row-major order, with the training augmentation."""
        if pixels == "all":
            rows, cols = np.divmod(np.arange(self.facts.height * self.facts.width), self.facts.width)
        elif pixels == "train":
            rows, cols = np.nonzero(self.split.maps()["train"])
        else:
            raise ConfigError(f"pretrain --pixels: expected 'all' or 'train', got {pixels!r}")
        return self._patches(np.stack([rows, cols], axis=1), np.zeros(len(rows), dtype=np.int64), augment=True)

    def _patches(self, coords: np.ndarray, targets: np.ndarray, *, augment: bool) -> PatchDataset:
        aug = self.cfg.augment if augment else AugmentConfig(flip=False, rotate=False)
        zero = self.normalizer.transform(np.zeros((1, self.facts.bands), dtype=np.float32))[0] if aug.illumination else None
        return PatchDataset(self.padded, coords, targets, self.cfg.patch_size, flip=aug.flip, rotate=aug.rotate,
                            illumination=aug.illumination, noise=aug.noise, zero=zero)

    def class_counts(self) -> list[int]:
        """Training pixels per class."""
        train = self.split.maps()["train"]  # (H, W) 1-based labels, 0 = not training
        return [int(c) for c in np.bincount(train[train > 0] - 1, minlength=self.info.num_classes)[: self.info.num_classes]]

    def collate(self, items: list[dict[str, Any]]) -> Batch:
        batch: Batch = {
            "patch": torch.stack([it["patch"] for it in items]),  # (n, C, p, p)
            "target": torch.stack([torch.as_tensor(it["target"], dtype=torch.int64) for it in items]),  # (n,)
        }
        if self._wavelength is not None:
            batch["wavelength"] = self._wavelength  # (B,)
        if self.class_mask is not None:
            batch[CLASS_MASK] = self.class_mask  # (K,)
        return batch

    def make_batch(self, patches: torch.Tensor) -> Batch:
        """Batch dict for inference on (n, C, p, p) patches (no targets)."""
        batch: Batch = {"patch": patches}
        if self._wavelength is not None:
            batch["wavelength"] = self._wavelength
        if self.class_mask is not None:
            batch[CLASS_MASK] = self.class_mask
        return batch

    # ------------------------------------------------------------------ reporting
    def describe(self) -> dict[str, Any]:
        proto = dict(self.split.protocol)
        names = self.class_names
        per_class = proto.pop("per_class", {})
        proto["per_class"] = {
            part: {names[i]: int(n) for i, n in enumerate(counts) if i < len(names)}
            for part, counts in per_class.items()
        }
        proto["classes_without_train"] = [n for n, c in proto["per_class"].get("train", {}).items() if c == 0]
        proto["classes_without_test"] = [n for n, c in proto["per_class"].get("test", {}).items() if c == 0]
        return _jsonable(
            {
                "dataset": "hsi_scene",
                "source": self.facts.source,
                "scene": {
                    "height": self.facts.height,
                    "width": self.facts.width,
                    "bands": self.facts.bands,
                    "labelled_pixels": self.facts.labelled,
                },
                "split": proto,
                "normalisation": self.normalizer.describe(),
                "in_channels": self.info.in_channels,
                "patch_size": self.cfg.patch_size,
                "padding": self.cfg.padding,
                "augment": self.cfg.augment.model_dump(),
            }
        )

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "normaliser": self.normalizer.state_dict(),
            "class_names": list(self.class_names),
            "patch_size": int(self.cfg.patch_size),
            "padding": str(self.cfg.padding),
            "in_bands": int(self.facts.bands),
            "in_channels": int(self.info.in_channels),
            "trained_classes": [i for i, n in enumerate(self.class_counts()) if n > 0],  # 0-based; the others are never predicted
        }
        if self._wavelength is not None:
            state["wavelengths"] = self._wavelength.clone()
        elif self.wavelengths is not None:  # PCA: the centres its components were fitted on, checked like an index model's
            state["wavelengths"] = torch.as_tensor(np.asarray(self.wavelengths), dtype=torch.float32)
        if self.wavelengths is not None:  # trained on bands in ascending order of centre (every input gets sorted too)
            state["bands_ascending"] = True
        if self.band_order is not None:  # the training file's bands, in that order: an input without centres is read alike
            state["band_order"] = torch.as_tensor(np.asarray(self.band_order), dtype=torch.int64)
        return state

    def match_checkpoint(self, state: dict[str, Any], *, allow_band_mismatch: bool = False) -> None:
        """Check this scene's band set against a checkpoint's (:func:`~sciformer.data.hsi.bandmatch.plan_bands`),
        feed the model the band centres the rules pick, and name the classes as the checkpoint
        does (unless ``data.class_names`` is given)."""
        trained, order = TrainedBands.from_state(state), state.get("band_order")  # order: the training file's
        back = checkpoint_order(trained.wavelengths, self.wavelengths) if self.wavelengths is not None else \
            (None if order is None or len(order) != self.facts.bands else np.asarray(order))  # no centres: as trained
        if back is not None and self.normalizer.pca_components is None:  # an older checkpoint's band order
            self.padded.copy_(self.padded[torch.as_tensor(back)])  # in place: datasets made already share it
            self.wavelengths = None if self.wavelengths is None else self.wavelengths[back]
        plan = plan_bands(trained, self.facts.bands, self.wavelengths, self.facts.source, allow_mismatch=allow_band_mismatch,
                          given_as=EVALUATE_CENTRES)  # evaluate takes centres as an override, not --wavelengths
        if plan.keep is not None:  # bands the model saw no neighbour of: left out (datasets made already: remade)
            self.padded = self.padded[torch.as_tensor(plan.keep)].contiguous()  # (C', H + 2r, W + 2r)
            self._datasets.clear()
            self.wavelengths = None if self.wavelengths is None else self.wavelengths[plan.keep]
        self._wavelength = None if plan.wavelengths is None else torch.as_tensor(plan.wavelengths, dtype=torch.float32)
        self.class_mask = trained_class_mask(state.get("trained_classes"), self.info.num_classes)  # none recorded: every class
        names = [str(n) for n in state.get("class_names") or []]
        if self.cfg.class_names is None and len(names) == len(self.class_names):  # the model's classes, by its names
            self.class_names = self.info.class_names = names

    def save_artifacts(self, run_dir: Path) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        maps = {k: v.astype(np.int16 if v.max() < 2**15 else np.int64) for k, v in self.split.maps().items()}
        atomic_write_with(run_dir / "splits.npz", lambda tmp: np.savez_compressed(tmp, **maps))
        atomic_write_text(run_dir / "protocol.json", json.dumps(self.describe(), indent=2) + "\n")

    def export_predictions(
        self, predict: PredictFn, out_dir: Path, batch_size: int, export: Any, split: str = "test", score: ScoreFn | None = None,
        views: PredictOptions | None = None,
    ) -> dict[str, Any]:
        """Predict every pixel of the scene (tiled) and write ``map.npy/.png/.hdr+.img``.

        The map covers the whole scene whatever ``split`` is; ``split`` names the pixels on
        which the map's overall accuracy is reported (a check against the engine's metrics).
        """
        maps = self.split.maps()
        if split not in maps:
            raise ConfigError(f"split: unknown split '{split}'; expected one of train, val, test")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        valid = None if self.nodata is None or not self.nodata.any() else ~self.nodata
        ids = predict_scene(predict, self.padded, self.cfg.patch_size, batch_size, mask=valid, make_batch=self.make_batch,
                            where=self.facts.source)  # (H, W)
        label_map = ids + 1  # 1..K, gt convention; 0 (unclassified) on no-data pixels
        gt = self.gt if self.gt is not None else maps["train"] + maps["val"] + maps["test"]
        if gt.max() > len(self.class_names):
            gt = None
        files: list[str] = []
        if getattr(export, "npy", True):
            files.append(save_map_npy(out_dir / "map.npy", label_map).name)
        if getattr(export, "png", True):
            files.append(save_map_png(out_dir / "map.png", label_map, self.class_names, gt=gt).name)
        if getattr(export, "envi", True):
            hdr, img = save_map_envi(out_dir / "map.hdr", label_map, self.class_names)
            files += [hdr.name, img.name]
        ref = maps[split]  # (H, W) labels 1..K of the split's pixels
        n = int(np.count_nonzero(ref))
        oa = float(np.mean(label_map[ref > 0] == ref[ref > 0])) if n else None
        return {
            "map_files": files,
            "map_shape": [int(v) for v in label_map.shape],
            "map_split": split,
            "map_overall_accuracy": oa,
        }

    def __repr__(self) -> str:
        c = self.split.counts()
        return (
            f"HSISceneTask(source={self.facts.source!r}, classes={len(self.class_names)}, "
            f"channels={self.info.in_channels}, patch_size={self.cfg.patch_size}, "
            f"split={self.split.protocol.get('kind')!r}, train={c['train']}, val={c['val']}, test={c['test']})"
        )


@DATASETS.register("hsi_scene", config=HSISceneConfig, predictor=predict_hsi_file)
def build_hsi_scene(cfg: HSISceneConfig, ctx: BuildContext) -> HSISceneTask:
    """One hyperspectral scene: split, normalised on training pixels, lazy patches."""
    scene = load_source(cfg, ctx)
    split = make_split(cfg, scene, ctx)
    max_label = int(max(m.max() for m in split.maps().values()))
    if scene.gt is not None:
        max_label = max(max_label, int(scene.gt.max()))
    class_names = class_names_for(cfg, scene, max_label)
    classes = np.unique(np.concatenate([m[m > 0] for m in split.maps().values()]))
    if classes.size < 2:
        raise DataError(f"{scene.source}: the labelled pixels hold {classes.size} class(es) "
                        f"({', '.join(str(int(c)) for c in classes) or 'none'}); a classifier needs at least 2: is the "
                        "label map a valid-pixel mask? name the label map with data.label_key or give data.label_path")
    if split.counts()["train"] == 0:
        raise DataError(f"{scene.source}: the split has no training pixels")
    nodata = nodata_pixels(scene.cube, scene.meta.get("nodata"))  # (H, W): never labelled, never in a statistic
    refuse_labelled_nodata(nodata, sum(m > 0 for m in split.maps().values()) > 0, scene.source, scene.meta.get("nodata"))
    normalizer = Normalizer(cfg.normalise, cfg.pca_components).fit(scene.cube, split.train > 0)
    facts = _SceneFacts(scene.source, *scene.shape, labelled=scene.num_labelled or sum(split.counts().values()))
    padded = pad_transformed(  # no-data pixels filled with the shift: 0 once normalised, no patch sees a no-data value
        scene.cube, lambda rows, y: normalizer.transform(fill_nodata(rows, nodata[y : y + len(rows)], normalizer.shift),
                                                         str(scene.source), y),
        normalizer.out_channels, cfg.patch_size, cfg.padding)  # (C, H + 2r, W + 2r)
    task = HSISceneTask(cfg, split, normalizer, padded, class_names, scene.wavelengths, scene.gt, facts)
    task.band_order, task.nodata = scene.meta.get("band_order"), nodata
    return task
