"""Shared parts of the bad-input corpus (:mod:`corpus`): the probe model, writers of valid
files, tiny experiment YAMLs, trained runs to tamper with, and the case table (:data:`CASES`,
:func:`case`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from synthetic import make_hsi_scene
from torch import nn

from sciformer.contracts import DataInfo
from sciformer.registry import MODELS

# ----------------------------------------------------------------------------- probe model


class ProbeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(8, ge=1)


class ProbePoints(nn.Module):
    """Per-point MLP on [coord, feat]; classification mean-pools the points of each cloud."""

    def __init__(self, cfg: ProbeConfig, info: DataInfo) -> None:
        super().__init__()
        self.segmentation = info.task == "segmentation"
        self.net = nn.Sequential(nn.Linear(3 + info.in_channels, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, info.num_classes))

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        x = torch.cat([batch["coord"], batch["feat"]], dim=1)  # (N, 3 + C)
        logits = self.net(x)  # (N, K)
        if self.segmentation:
            return logits
        offset = batch["offset"]  # (B,)
        sizes = torch.diff(offset, prepend=offset.new_zeros(1))  # (B,)
        cloud = torch.repeat_interleave(torch.arange(len(sizes), device=x.device), sizes)  # (N,)
        pooled = logits.new_zeros(len(sizes), logits.shape[1]).index_add_(0, cloud, logits)  # (B, K)
        return pooled / sizes.clamp(min=1).unsqueeze(1).to(logits.dtype)


PROBE = "robustness_probe"
if PROBE not in MODELS._entries:
    MODELS.register(PROBE, config=ProbeConfig)(lambda cfg, info: ProbePoints(cfg, info))


# ----------------------------------------------------------------------------- valid files


def make_scene(h: int = 16, w: int = 16, bands: int = 6, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The shared :func:`synthetic.make_hsi_scene` at the corpus's small size: cube (H, W, B), gt (H, W)."""
    cube, gt, _ = make_hsi_scene(h, w, bands, classes, seed, block=4)
    return cube, gt


def write_mat_v5(path: Path, **arrays: np.ndarray) -> Path:
    import scipy.io

    scipy.io.savemat(path, arrays)
    return path


def write_mat_v73(path: Path, **arrays: np.ndarray) -> Path:
    """MATLAB v7.3 layout: HDF5 datasets with axes reversed and a MATLAB_class attribute."""
    import h5py

    classes = {"f": "double", "i": "int64", "u": "uint8", "b": "logical"}
    with h5py.File(path, "w") as fh:
        for name, arr in arrays.items():
            arr = np.asarray(arr)
            fh[name] = np.ascontiguousarray(arr.T)
            fh[name].attrs["MATLAB_class"] = np.bytes_(classes[arr.dtype.kind])
    return path


def write_envi(header: Path, cube: np.ndarray, *, lines: int | None = None, data: bool = True) -> Path:
    """An ENVI float32 BSQ pair ``x.hdr`` + ``x.img``; ``lines`` overrides the height in the header."""
    h, w, b = cube.shape
    header.write_text(
        "ENVI\n"
        f"samples = {w}\nlines = {lines if lines is not None else h}\nbands = {b}\n"
        "header offset = 0\nfile type = ENVI Standard\ndata type = 4\ninterleave = bsq\nbyte order = 0\n"
    )
    if data:
        np.ascontiguousarray(cube.transpose(2, 0, 1), dtype="<f4").tofile(header.with_suffix(".img"))
    return header


def write_modelnet_h5(root: Path, classes: tuple[str, ...] = ("chair", "table"), per_class: tuple[int, int] = (6, 2),
                      points: int = 32, mutate: Callable[[dict[str, np.ndarray]], None] | None = None) -> Path:
    """``modelnet40_ply_hdf5_2048`` layout; ``mutate`` edits the train file's arrays before writing."""
    import h5py

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "shape_names.txt").write_text("\n".join(classes) + "\n")
    for split, count in zip(("train", "test"), per_class, strict=True):
        labels = np.repeat(np.arange(len(classes)), count).astype(np.uint8)[:, None]  # (n, 1)
        data = (rng.normal(size=(len(labels), points, 3)) * 0.1 + labels[:, :, None]).astype(np.float32)  # (n, P, 3)
        arrays = {"data": data, "label": labels}
        if mutate is not None and split == "train":
            mutate(arrays)
        with h5py.File(root / f"ply_data_{split}0.h5", "w") as fh:
            for key, value in arrays.items():
                fh[key] = value
        (root / f"{split}_files.txt").write_text(f"data/modelnet40_ply_hdf5_2048/ply_data_{split}0.h5\n")
    return root


def write_las(path: Path, n: int = 300, seed: int = 0) -> Path:
    """A LAS/LAZ tile (by suffix) with RGB, intensity and ASPRS codes 2/5/6."""
    import laspy

    rng = np.random.default_rng(seed)
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales = np.array([0.01, 0.01, 0.01])
    header.offsets = np.array([600000.0, 5000000.0, 0.0])
    las = laspy.LasData(header)
    las.x = 600000.0 + rng.uniform(0, 20, n)
    las.y = 5000000.0 + rng.uniform(0, 20, n)
    las.z = 200.0 + rng.uniform(0, 5, n)
    las.classification = rng.choice(np.array([2, 5, 6], dtype=np.uint8), n)
    las.intensity = rng.integers(0, 4000, n).astype(np.uint16)
    las.red = las.green = las.blue = rng.integers(0, 65535, n).astype(np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    las.write(path)
    return path


def s3dis_lines(n: int = 12, centre: float = 0.0, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    xyz = rng.normal(size=(n, 3)) * 0.2 + centre
    rgb = rng.integers(0, 256, size=(n, 3))
    return [f"{x:.3f} {y:.3f} {z:.3f} {r} {g} {b}" for (x, y, z), (r, g, b) in zip(xyz, rgb, strict=True)]


def write_s3dis(root: Path, annotations: dict[str, list[str]] | None = None) -> Path:
    """Area_1 and Area_5 with one room each; ``annotations`` replaces Area_5's room files."""
    for area in (1, 5):
        ann = root / f"Area_{area}" / "office_1" / "Annotations"
        ann.mkdir(parents=True, exist_ok=True)
        files = {"chair_1": s3dis_lines(12, 0.0, area), "floor_1": s3dis_lines(12, 1.0, area + 10)}
        if area == 5 and annotations is not None:
            files = annotations
        for stem, lines in files.items():
            (ann / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    return root


def write_shapenetpart(root: Path) -> Path:
    """Airplane shapes in the ShapeNetPart layout: two for training, one each for val and test."""
    import json

    rng = np.random.default_rng(3)
    syn = "02691156"
    (root / syn).mkdir(parents=True, exist_ok=True)
    (root / "synsetoffset2category.txt").write_text(f"Airplane\t{syn}\n")
    (root / "train_test_split").mkdir(exist_ok=True)
    k = 0
    for split, count in (("train", 2), ("val", 1), ("test", 1)):
        entries = []
        for _ in range(count):
            shape_id = f"{k:032x}"
            k += 1
            xyz = rng.normal(size=(20, 3))
            table = np.column_stack([xyz, xyz / np.linalg.norm(xyz, axis=1, keepdims=True), rng.integers(0, 4, 20)])
            np.savetxt(root / syn / f"{shape_id}.txt", table, fmt="%.6f")
            entries.append(f"shape_data/{syn}/{shape_id}")
        (root / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    return root


def ply_text(coords: np.ndarray) -> str:
    head = f"ply\nformat ascii 1.0\nelement vertex {len(coords)}\nproperty float x\nproperty float y\nproperty float z\nend_header\n"
    return head + "".join(f"{x} {y} {z}\n" for x, y, z in coords)


def pcd_binary(coords: np.ndarray) -> bytes:
    n = len(coords)
    head = (f"# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
            f"WIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA binary\n")
    return head.encode("ascii") + np.asarray(coords, dtype="<f4").tobytes()


def off_text(vertices: np.ndarray, faces: list[list[int]]) -> str:
    out = [f"OFF\n{len(vertices)} {len(faces)} 0"]
    out += [f"{x} {y} {z}" for x, y, z in vertices]
    out += [f"{len(f)} " + " ".join(str(i) for i in f) for f in faces]
    return "\n".join(out) + "\n"


def truncate(path: Path, fraction: float = 0.5) -> Path:
    """Keep the first ``fraction`` of the file's bytes."""
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * fraction)])
    return path


def cloud(n: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)  # (n, 3)


# ----------------------------------------------------------------------------- experiment YAMLs

TRAIN = "train: {epochs: 1, batch_size: 8, max_steps_per_epoch: 1, progress: never}\n"
HSI_MODEL = ("model: {name: spectral_spatial, dim: 8, depth: 1, num_heads: 1, spectral_hidden: 8, band_tokens: false, "
             "dropout: 0.0, drop_path: 0.0}\n")


def _yaml_value(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON is valid YAML flow style


def hsi_experiment(d: Path, source: str | Path, **data: Any) -> Path:
    """A tiny hsi_scene experiment (patch 3, stratified split) on ``source``."""
    data.setdefault("split", {"kind": "stratified", "train_per_class": 0.5})
    extra = "".join(f", {k}: {_yaml_value(str(v) if isinstance(v, Path) else v)}" for k, v in data.items())
    path = d / "exp.yaml"
    path.write_text(f"name: bad_hsi\ndata: {{name: hsi_scene, source: {_yaml_value(str(source))}, patch_size: 3{extra}}}\n"
                    + HSI_MODEL + TRAIN)
    return path


def point_experiment(d: Path, dataset: str, **data: Any) -> Path:
    extra = "".join(f", {k}: {_yaml_value(str(v) if isinstance(v, Path) else v)}" for k, v in data.items())
    path = d / "exp.yaml"
    path.write_text(f"name: bad_{dataset}\ndata: {{name: {dataset}{extra}}}\nmodel: {{name: {PROBE}}}\n" + TRAIN)
    return path


def modelnet_experiment(d: Path, root: Path, **data: Any) -> Path:
    return point_experiment(d, "modelnet", root=root, num_points=16, **data)


def las_experiment(d: Path, root: Path, train: str = "train.las", **data: Any) -> Path:
    return point_experiment(d, "las_tiles", root=root, train_files=[train], val_files=["val.las"], test_files=["test.las"],
                            crop_size=100.0, crop_min_points=1, crops_per_tile=2, **data)


def train_argv(d: Path, config: Path, *overrides: str) -> list[str]:
    return ["train", "--config", str(config), "--output-dir", str(d / "run"), *overrides]


# ----------------------------------------------------------------------------- trained runs


class Trained:
    """Runs trained for one step on tiny valid data, built lazily once per test session."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._runs: dict[str, Path] = {}

    def _train(self, name: str, make_config: Callable[[Path], Path]) -> Path:
        if name not in self._runs:
            from sciformer.cli import main

            d = self.base / name
            d.mkdir(parents=True, exist_ok=True)
            run = d / "run"
            code = main(["train", "--config", str(make_config(d)), "--output-dir", str(run)])
            assert code == 0, f"training the {name} fixture run failed"
            self._runs[name] = run
        return self._runs[name]

    def hsi(self) -> Path:
        """A spectral_spatial run on a 16 x 16 x 6 scene (.mat with 'cube' and 'gt')."""

        def config(d: Path) -> Path:
            cube, gt = make_scene()
            write_mat_v5(d / "scene.mat", cube=cube, gt=gt)
            return hsi_experiment(d, "scene.mat", image_key="cube")

        return self._train("hsi", config)

    def points(self) -> Path:
        """A robustness_probe run on a miniature ModelNet (h5 layout, 2 classes, 16 points)."""
        return self._train("points", lambda d: modelnet_experiment(d, write_modelnet_h5(d / "modelnet")))

    def checkpoint(self, which: str = "hsi") -> Path:
        return (self.hsi() if which == "hsi" else self.points()) / "checkpoints" / "last.pt"


class PickledCode:
    """Unpickling this runs ``touch <marker>``: a checkpoint carrying code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def save_tampered(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None], *, weights_only: bool = True) -> Path:
    """Copy checkpoint ``src`` to ``dst`` after ``edit`` changed its dict."""
    state = torch.load(src, map_location="cpu", weights_only=weights_only)
    edit(state)
    torch.save(state, dst)
    return dst


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Case:
    """One malformed input: ``build(dir, trained) -> argv``; the error line must hold ``expect``."""

    id: str
    build: Callable[[Path, Trained], list[str]]
    expect: tuple[str, ...]
    marker: bool = False  # the case plants a code payload that must not run (``<dir>/pwned`` stays absent)


CASES: list[Case] = []


def case(id: str, *expect: str, marker: bool = False) -> Callable[[Callable[[Path, Trained], list[str]]], Callable[[Path, Trained], list[str]]]:
    def register(build: Callable[[Path, Trained], list[str]]) -> Callable[[Path, Trained], list[str]]:
        CASES.append(Case(id, build, tuple(expect), marker))
        return build

    return register
