"""Every shipped experiment and every registered model trains one step on tiny synthetic data.

Each experiment YAML keeps its model, optimiser, schedule and data parameters, except that
point counts are capped at :data:`POINTS` (so the whole file runs in seconds); the data
files are miniature copies of the real layouts written here (see tests/synthetic.py), the
batch is 2 and one optimiser step runs through the engine's training loop. A model no experiment uses runs on the experiment of its modality with its
default parameters. The step must give a finite loss and move every trained weight group.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from synthetic import (
    make_hsi_scene,
    write_las,
    write_modelnet_h5,
    write_modelnet_txt,
    write_s3dis,
    write_shapenetpart,
)
from torch.utils.data import DataLoader

from sciformer import config
from sciformer.engine import builders
from sciformer.engine.loops import train_steps
from sciformer.registry import MODELS
from sciformer.utils import yamlio

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))
BUILTIN_MODELS = [e.name for e in MODELS.entries() if e.builder.__module__.startswith("sciformer.")]
EXPERIMENT_MODELS = {yamlio.load_file(p)["model"]["name"] for p in EXPERIMENTS}


def _hsi(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    cube, gt, _ = make_hsi_scene(h=20, w=20, bands=12, classes=3, block=4)
    np.save(root / "cube.npy", cube)
    np.save(root / "gt.npy", gt)
    data = {k: v for k, v in data.items() if k not in ("class_names",)}
    return {**data, "source": str(root / "cube.npy"), "label_path": str(root / "gt.npy"),
            "split": {"kind": "stratified", "train_per_class": 6, "val_fraction": 0.2}}


def _modelnet(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    points = int(data.get("num_points", 1024))
    if "normal" in data.get("features", []):  # normals: the normal_resampled text layout
        folder = write_modelnet_txt(root / "modelnet", ["bed", "chair"], per_class=(5, 1), points=points)
    else:
        folder = write_modelnet_h5(root / "modelnet", ["bed", "chair"], per_class=(5, 1), points=points)
    return {**data, "root": str(folder)}


def _s3dis(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    folder = write_s3dis(root / "s3dis", {1: ["office_1", "office_2"], 5: ["office_3"]})
    return {**data, "root": str(folder)}


def _shapenetpart(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    folder = write_shapenetpart(root / "shapenetpart", points=int(data.get("num_points", 2048)))
    return {**data, "root": str(folder)}


def _las_tiles(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    for i, name in enumerate(data["train_files"] + data["val_files"] + data.get("test_files", [])):
        write_las(root / "tiles" / name, n=600, seed=i, size=60.0)
    return {**data, "root": str(root / "tiles")}


def _point_scenes(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    names = ["seq01_000000", "seq01_000001", "seq01_000002", "demo_000700"]
    (root / "scans").mkdir()
    for name in names:
        np.save(root / "scans" / f"{name}_points.npy", rng.uniform(0, 20, size=(600, 3)).astype(np.float32))
        np.save(root / "scans" / f"{name}_labels.npy", rng.integers(0, 20, size=600).astype(np.int32))
    return {**data, "root": str(root / "scans")}


POINTS = 128  # cap of every point count (samples per shape, crops, transform sample sizes)
_COUNT_KEYS = ("num_points", "eval_num_points", "crop_points", "crop_max_points", "n")


def _shrink(node: Any) -> Any:
    """The experiment's data section with every point count capped at :data:`POINTS`."""
    if isinstance(node, dict):
        return {k: (min(v, POINTS) if k in _COUNT_KEYS and isinstance(v, int) else _shrink(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_shrink(v) for v in node]
    return node


TINY_DATA = {"hsi_scene": _hsi, "modelnet": _modelnet, "s3dis": _s3dis, "shapenetpart": _shapenetpart,
             "las_tiles": _las_tiles, "point_scenes": _point_scenes}
# The experiment a model without one of its own runs on (with the model's defaults).
BY_MODALITY = {"spectral": "indian_pines_demo", "cls": "modelnet10", "seg": "lidar_tiles"}


pytestmark = pytest.mark.usefixtures("one_thread")  # as train.threads=1 gives a run: tiny steps gain nothing from more


def one_step(raw: dict[str, Any], tmp_path: Path) -> None:
    raw = copy.deepcopy(raw)
    raw["data"] = TINY_DATA[raw["data"]["name"]](tmp_path, _shrink(raw["data"]))
    raw["train"] = {**raw.get("train", {}), "batch_size": 2, "threads": 1, "progress": "never", "num_workers": 0}
    exp = config.validate(raw, base_dir=tmp_path, source="test")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fakes' deliberately malformed lines
        task = builders.build_task(exp)
    model = builders.build_model(exp, task.info)
    optimizer = builders.build_optimizer(exp.cfg.optimizer, model)
    scheduler = builders.build_scheduler(exp.cfg.schedule, optimizer, 1, 1)
    dataset = task.dataset("train")
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(0)
    batch = next(iter(DataLoader(dataset, batch_size=2, collate_fn=task.collate)))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=task.ignore_index)
    loss_sum, count = train_steps(model, iter([batch]), loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler, scaler=None,
                                  device=torch.device("cpu"), amp="none", grad_clip=exp.cfg.train.grad_clip)
    assert count > 0 and np.isfinite(loss_sum)
    moved = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}
    assert moved, "the optimiser step changed no weight"
    frozen = {name.split(".")[0] for name in before} - {name.split(".")[0] for name in moved}
    assert not frozen, f"top-level modules that no step reaches: {sorted(frozen)}"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_trains_one_step(path: Path, tmp_path: Path) -> None:
    one_step(yamlio.load_file(path), tmp_path)


@pytest.mark.parametrize("name", [m for m in BUILTIN_MODELS if m not in EXPERIMENT_MODELS])
def test_registered_model_trains_one_step(name: str, tmp_path: Path) -> None:
    """A model no experiment uses, with its defaults, on the experiment of its modality."""
    modality = "spectral" if MODELS.get(name).builder.__module__.startswith("sciformer.spectral") else name.rsplit("_", 1)[-1]
    raw = yamlio.load_file(EXPERIMENTS[[p.stem for p in EXPERIMENTS].index(BY_MODALITY[modality])])
    one_step({**raw, "model": {"name": name}}, tmp_path)


def test_every_dataset_of_an_experiment_has_tiny_data() -> None:
    assert {yamlio.load_file(p)["data"]["name"] for p in EXPERIMENTS} <= set(TINY_DATA)
    assert {"spectralformer", "spectral_spatial", "point_transformer_cls", "point_transformer_seg"} <= set(BUILTIN_MODELS)
