"""Malformed inputs for the robustness tests, one builder per case.

A :class:`Case` writes one bad input (plus the tiny experiment YAML that points at it)
into a fresh folder and returns the ``sciformer`` command line that must refuse it with
exit code 2 and one line on stderr holding every ``expect`` fragment. Valid files are
written by the ``write_*`` helpers; the bad ones are derived from them (truncated,
keys removed, NaN inserted, ...).

Every command writes only below the case folder: training runs go to ``<dir>/run``,
evaluations to ``<dir>/eval``, predictions to ``<dir>/pred.*``.

Point-cloud experiments use ``robustness_probe``, a tiny model registered here (a
per-point MLP, mean-pooled for classification), so the point datasets run end to end
whatever point models the package provides.
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


# --- config --------------------------------------------------------------------------------


def _config(d: Path, text: str | bytes) -> list[str]:
    path = d / "exp.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return train_argv(d, path)


GOOD = "data: {name: toy_blobs}\nmodel: {name: toy_mlp}\ntrain: {epochs: 1, progress: never}\n"


@case("config-non-utf8", "exp.yaml", "not UTF-8")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "name: caf\xe9\n".encode("latin-1") + GOOD.encode())


@case("config-binary", "exp.yaml", "binary", "expected a YAML text file")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")


@case("config-anchor-bomb", "exp.yaml", "aliases expand to more than")
def _(d: Path, t: Trained) -> list[str]:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    return _config(d, bomb + GOOD)


@case("config-python-tag", "exp.yaml", "line 1", "python/object/apply:os.system", "only plain YAML data", marker=True)
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, f"name: !!python/object/apply:os.system ['touch {d / 'pwned'}']\n" + GOOD)


@case("config-python-name-tag", "exp.yaml", "python/name:os.system")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "name: !!python/name:os.system ''\n" + GOOD)


@case("config-deep-nesting", "exp.yaml", "invalid YAML")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "name: " + "[" * 5000 + "]" * 5000 + "\n" + GOOD)


@case("config-is-directory", "is a directory", "expected a YAML file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "exp.yaml").mkdir()
    return train_argv(d, d / "exp.yaml")


@case("config-missing", "nope.yaml", "does not exist")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, d / "nope.yaml")


@case("config-top-level-list", "exp.yaml", "expected a mapping")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "- data\n- model\n")


@case("config-empty", "exp.yaml", "missing required key 'data'")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "")


@case("config-bad-type", "exp.yaml", "train.batch_size", "integer")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "data: {name: toy_blobs}\nmodel: {name: toy_mlp}\ntrain: {batch_size: lots}\n")


@case("config-unknown-section-key", "exp.yaml", "unknown key 'optimizer.learning_rate'")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, GOOD + "optimizer: {learning_rate: 0.1}\n")


@case("config-bad-override-yaml", "override 'train.epochs=[1'", "invalid YAML")
def _(d: Path, t: Trained) -> list[str]:
    path = d / "exp.yaml"
    path.write_text(GOOD)
    return train_argv(d, path, "train.epochs=[1")


@case("config-override-into-scalar", "train.epochs", "is not a section")
def _(d: Path, t: Trained) -> list[str]:
    path = d / "exp.yaml"
    path.write_text(GOOD)
    return train_argv(d, path, "train.epochs.x=1")


@case("config-bad-device", "train.device", "cuda:N")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, GOOD.replace("progress: never", "progress: never, device: tpu"))


@case("config-unknown-dataset-key", "exp.yaml", "unknown key 'data.patch_sise'", "did you mean 'data.patch_size'")
def _(d: Path, t: Trained) -> list[str]:
    return _config(d, "data: {name: hsi_scene, patch_sise: 5}\nmodel: {name: spectral_spatial}\n")


# --- hyperspectral scenes -------------------------------------------------------------------


def _scene_case(d: Path, source: str, **data: Any) -> list[str]:
    return train_argv(d, hsi_experiment(d, source, **data))


@case("hsi-mat-v5-truncated", "scene.mat", "array 'cube'", "truncated or damaged")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    truncate(write_mat_v5(d / "scene.mat", cube=cube, gt=gt), 0.6)
    return _scene_case(d, "scene.mat")


@case("hsi-mat-v5-header-only", "scene.mat", "truncated or damaged")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    truncate(write_mat_v5(d / "scene.mat", cube=cube, gt=gt), 0.05)
    return _scene_case(d, "scene.mat")


@case("hsi-mat-v73-truncated", "scene.mat", "MATLAB v7.3 (HDF5)")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    truncate(write_mat_v73(d / "scene.mat", cube=cube, gt=gt), 0.5)
    return _scene_case(d, "scene.mat")


@case("hsi-mat-v5-missing-cube-key", "scene.mat", "image_key 'cube' not found", "available keys")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    write_mat_v5(d / "scene.mat", data=cube, gt=gt)
    return _scene_case(d, "scene.mat", image_key="cube")


@case("hsi-mat-v73-missing-cube-key", "scene.mat", "image_key 'cube' not found", "available keys")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    write_mat_v73(d / "scene.mat", data=cube, gt=gt)
    return _scene_case(d, "scene.mat", image_key="cube")


@case("hsi-mat-no-3d-array", "scene.mat", "no 3-D (H, W, B) array")
def _(d: Path, t: Trained) -> list[str]:
    _, gt = make_scene()
    write_mat_v5(d / "scene.mat", gt=gt)
    return _scene_case(d, "scene.mat")


@case("hsi-mat-missing-label-key", "scene.mat", "label_key 'labels' not found")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    write_mat_v5(d / "scene.mat", cube=cube, gt=gt)
    return _scene_case(d, "scene.mat", label_key="labels")


@case("hsi-mat-no-labels", "scene.mat", "no 2-D integer label map")
def _(d: Path, t: Trained) -> list[str]:
    cube, _ = make_scene()
    write_mat_v5(d / "scene.mat", cube=cube)
    return _scene_case(d, "scene.mat")


@case("hsi-envi-header-without-data", "scene.hdr", "ENVI")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    write_envi(d / "scene.hdr", cube, data=False)
    return _scene_case(d, "scene.hdr", label_path="gt.npy")


@case("hsi-envi-wrong-size", "scene.img", "ENVI data file has 6144 bytes", "24576 bytes")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    write_envi(d / "scene.hdr", cube, lines=cube.shape[0] * 4)
    np.save(d / "gt.npy", gt)
    return _scene_case(d, "scene.hdr", label_path="gt.npy")


@case("hsi-envi-garbage-header", "scene.hdr", "ENVI")
def _(d: Path, t: Trained) -> list[str]:
    (d / "scene.hdr").write_text("this is not an ENVI header\nsamples = many\n")
    (d / "scene.img").write_bytes(b"\x00" * 64)
    return _scene_case(d, "scene.hdr")


@case("hsi-cube-nan-npy", "cube.npy", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    cube[3, 4, 2] = np.nan
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", gt)
    return _scene_case(d, "cube.npy", label_path="gt.npy")


@case("hsi-cube-inf-mat", "scene.mat", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    cube[0, 1, 0] = np.inf
    write_mat_v5(d / "scene.mat", cube=cube.astype(np.float64), gt=gt)
    return _scene_case(d, "scene.mat")


@case("hsi-cube-inf-mat-v73", "scene.mat", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    cube[5, 5, 5] = -np.inf
    write_mat_v73(d / "scene.mat", cube=cube, gt=gt)
    return _scene_case(d, "scene.mat")


@case("hsi-labels-negative", "gt.npy", "negative values")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    gt[2, 2] = -3
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", gt)
    return _scene_case(d, "cube.npy", label_path="gt.npy")


@case("hsi-labels-non-integer", "gt", "non-integer")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    write_mat_v5(d / "scene.mat", cube=cube, gt=gt + 0.5)
    return _scene_case(d, "scene.mat", label_key="gt")


@case("hsi-labels-wrong-shape", "gt.npy", "expected 2-D (H, W)")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", np.stack([gt, gt], axis=2))
    return _scene_case(d, "cube.npy", label_path="gt.npy", label_key="gt")


@case("hsi-label-size-mismatch", "gt.npy", "label map is 10 x 16", "16 x 16")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", gt[:10])
    return _scene_case(d, "cube.npy", label_path="gt.npy")


@case("hsi-labels-all-unlabelled", "gt.npy", "no labelled pixels", "expected classes 1..K")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", np.zeros_like(gt))
    return _scene_case(d, "cube.npy", label_path="gt.npy")


@case("hsi-class-names-too-few", "data.class_names", "3 names", "up to 4")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene(classes=4)
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", gt)
    return _scene_case(d, "cube.npy", label_path="gt.npy", class_names=["a", "b", "c"])


@case("hsi-source-is-directory", "scene.mat", "not a file", "expected an image")
def _(d: Path, t: Trained) -> list[str]:
    (d / "scene.mat").mkdir()
    return _scene_case(d, "scene.mat")


@case("hsi-source-missing", "missing.mat", "file not found")
def _(d: Path, t: Trained) -> list[str]:
    return _scene_case(d, "missing.mat")


@case("hsi-label-path-missing", "gt.npy", "file not found")
def _(d: Path, t: Trained) -> list[str]:
    cube, _ = make_scene()
    np.save(d / "cube.npy", cube)
    return _scene_case(d, "cube.npy", label_path="gt.npy")


@case("hsi-npy-pickled-object", "cube.npy", "not a readable .npy")
def _(d: Path, t: Trained) -> list[str]:
    np.save(d / "cube.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return _scene_case(d, "cube.npy")


@case("hsi-npy-truncated", "cube.npy", "npy")
def _(d: Path, t: Trained) -> list[str]:
    cube, _ = make_scene()
    np.save(d / "cube.npy", cube)
    truncate(d / "cube.npy", 0.5)
    return _scene_case(d, "cube.npy")


@case("hsi-cube-empty-band-axis", "cube.npy", "empty axis")
def _(d: Path, t: Trained) -> list[str]:
    np.save(d / "cube.npy", np.zeros((16, 16, 0), dtype=np.float32))
    return _scene_case(d, "cube.npy", image_key="cube")


@case("hsi-unsupported-suffix", "scene.jpg", "unsupported file type")
def _(d: Path, t: Trained) -> list[str]:
    (d / "scene.jpg").write_bytes(b"\xff\xd8\xff")
    return _scene_case(d, "scene.jpg")


@case("hsi-geotiff-damaged", "scene.tif", "not a readable GeoTIFF")
def _(d: Path, t: Trained) -> list[str]:
    (d / "scene.tif").write_bytes(b"II*\x00")
    return _scene_case(d, "scene.tif")


@case("hsi-fixed-split-size-mismatch", "split.mat", "split map is 8 x 8")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    np.save(d / "cube.npy", cube)
    write_mat_v5(d / "split.mat", TR=gt[:8, :8], TE=gt[:8, :8])
    return _scene_case(d, "cube.npy", split={"kind": "fixed", "train_path": "split.mat"})


# --- ModelNet (h5 layout) -----------------------------------------------------------------


def _modelnet(d: Path, mutate: Callable[[dict[str, np.ndarray]], None] | None = None, **kw: Any) -> tuple[Path, list[str]]:
    root = write_modelnet_h5(d / "modelnet", mutate=mutate, **kw)
    return root, train_argv(d, modelnet_experiment(d, root))


@case("modelnet-h5-truncated", "ply_data_train0.h5", "HDF5")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _modelnet(d)
    truncate(root / "ply_data_train0.h5", 0.5)
    return argv


@case("modelnet-h5-not-hdf5", "ply_data_train0.h5", "HDF5")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _modelnet(d)
    (root / "ply_data_train0.h5").write_text("solid ascii\n")
    return argv


@case("modelnet-h5-missing-data", "ply_data_train0.h5", "missing key 'data'")
def _(d: Path, t: Trained) -> list[str]:
    return _modelnet(d, lambda a: a.pop("data"))[1]


@case("modelnet-h5-missing-label", "ply_data_train0.h5", "missing key 'label'")
def _(d: Path, t: Trained) -> list[str]:
    return _modelnet(d, lambda a: a.pop("label"))[1]


@case("modelnet-h5-labels-out-of-range", "ply_data_train0.h5", "outside 0..1")
def _(d: Path, t: Trained) -> list[str]:
    return _modelnet(d, lambda a: a.__setitem__("label", a["label"] + 5))[1]


@case("modelnet-h5-label-count-mismatch", "ply_data_train0.h5", "expected (n, P, 3) and (n, 1)")
def _(d: Path, t: Trained) -> list[str]:
    return _modelnet(d, lambda a: a.__setitem__("label", a["label"][:-3]))[1]


@case("modelnet-h5-data-2d", "ply_data_train0.h5", "expected (n, P, 3)")
def _(d: Path, t: Trained) -> list[str]:
    return _modelnet(d, lambda a: a.__setitem__("data", a["data"][:, :, 0]))[1]


@case("modelnet-h5-nan-points", "ply_data_train0.h5", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    def poison(a: dict[str, np.ndarray]) -> None:
        a["data"][1, 3, 0] = np.nan

    return _modelnet(d, poison)[1]


@case("modelnet-h5-inf-points", "ply_data_train0.h5", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    def poison(a: dict[str, np.ndarray]) -> None:
        a["data"][0, 0, 2] = np.inf

    return _modelnet(d, poison)[1]


@case("modelnet-h5-empty-clouds", "0 points", "num_points=16")
def _(d: Path, t: Trained) -> list[str]:
    return _modelnet(d, lambda a: a.__setitem__("data", a["data"][:, :0]))[1]


@case("modelnet-h5-no-shapes", "ply_data_train0.h5", "no shapes", "n > 0")
def _(d: Path, t: Trained) -> list[str]:
    def empty(a: dict[str, np.ndarray]) -> None:
        a["data"], a["label"] = a["data"][:0], a["label"][:0]

    return _modelnet(d, empty)[1]


@case("modelnet-missing-class-names", "shape_names.txt", "missing class file")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _modelnet(d)
    (root / "shape_names.txt").unlink()
    return argv


@case("modelnet-empty-class-names", "shape_names.txt", "empty class file")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _modelnet(d)
    (root / "shape_names.txt").write_text("\n\n")
    return argv


@case("modelnet-listed-file-is-directory", "ply_data_train0.h5", "not a file")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _modelnet(d)
    (root / "ply_data_train0.h5").unlink()
    (root / "ply_data_train0.h5").mkdir()
    return argv


@case("modelnet-listed-file-missing", "train_files.txt", "ply_data_train0.h5", "not found")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _modelnet(d)
    (root / "ply_data_train0.h5").unlink()
    return argv


@case("modelnet-root-missing", "nowhere", "ModelNet folder not found")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, modelnet_experiment(d, d / "nowhere"))


@case("modelnet-txt-nan-points", "chair_0001.txt", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    root = d / "modelnet"
    (root / "chair").mkdir(parents=True)
    (root / "modelnet40_shape_names.txt").write_text("chair\n")
    rows = np.hstack([cloud(20), np.ones((20, 3), np.float32)])
    text = "\n".join(",".join(f"{v:.4f}" for v in r) for r in rows)
    lines = text.splitlines()
    lines[4] = "nan,0.1,0.2,0,0,1"
    (root / "chair" / "chair_0001.txt").write_text("\n".join(lines) + "\n")
    (root / "chair" / "chair_0002.txt").write_text(text + "\n")
    (root / "modelnet40_train.txt").write_text("chair_0001\nchair_0002\n")
    (root / "modelnet40_test.txt").write_text("chair_0002\n")
    return train_argv(d, modelnet_experiment(d, root, val_fraction=0.0))


# --- LiDAR tiles (LAS / LAZ) ---------------------------------------------------------------


def _tiles(d: Path, train: str = "train.las") -> tuple[Path, list[str]]:
    root = d / "lidar"
    for name in ("val.las", "test.las"):
        write_las(root / name, seed=len(name))
    return root, train_argv(d, las_experiment(d, root, train=train))


@case("las-truncated", "train.las", "LAS")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _tiles(d)
    truncate(write_las(root / "train.las"), 0.6)
    return argv


@case("laz-truncated", "train.laz", "truncated")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _tiles(d, "train.laz")
    truncate(write_las(root / "train.laz", n=2000), 0.6)
    return argv


@case("las-header-only", "train.las", "LAS")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _tiles(d)
    truncate(write_las(root / "train.las"), 0.02)
    return argv


@case("las-not-a-las-file", "train.las", "LAS")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _tiles(d)
    (root / "train.las").write_text("x y z\n1 2 3\n")
    return argv


@case("las-empty-cloud", "train.las", "empty point cloud")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _tiles(d)
    write_las(root / "train.las", n=0)
    return argv


@case("las-tile-is-directory", "train.las", "not a file")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _tiles(d)
    (root / "train.las").mkdir(parents=True)
    return argv


@case("las-tile-missing", "data.train_files", "train.las", "not found")
def _(d: Path, t: Trained) -> list[str]:
    return _tiles(d)[1]


@case("las-bad-class-code", "exp.yaml", "data: classes.ground: code 300", "0..255")
def _(d: Path, t: Trained) -> list[str]:
    root, _ = _tiles(d)
    write_las(root / "train.las")
    return train_argv(d, las_experiment(d, root, classes={"ground": [2, 300], "other": []}))


# --- S3DIS ------------------------------------------------------------------------------------


def _s3dis(d: Path, annotations: dict[str, list[str]] | None, policy: str = "error") -> list[str]:
    root = write_s3dis(d / "s3dis", annotations)
    return train_argv(d, point_experiment(d, "s3dis", root=root, malformed_lines=policy, crop_points=8, grid_size=None,
                                          val_fraction=0.0, features=["coord", "colour"]))


@case("s3dis-malformed-line-error-policy", "chair_1.txt:4", "expected 6 numbers", "12 34")
def _(d: Path, t: Trained) -> list[str]:
    lines = s3dis_lines()
    lines.insert(3, "4.100 4.000 5.5\x1000 12 34 56")
    return _s3dis(d, {"chair_1": lines, "floor_1": s3dis_lines(seed=4)})


@case("s3dis-nan-line-error-policy", "floor_1.txt:2", "expected 6 numbers", "nan")
def _(d: Path, t: Trained) -> list[str]:
    lines = s3dis_lines()
    lines[1] = "nan 0.5 0.5 10 10 10"
    return _s3dis(d, {"chair_1": s3dis_lines(seed=3), "floor_1": lines})


@case("s3dis-unknown-class-file", "spaceship_1.txt", "unknown class 'spaceship'")
def _(d: Path, t: Trained) -> list[str]:
    return _s3dis(d, {"spaceship_1": s3dis_lines()})


@case("s3dis-empty-annotation", "chair_1.txt", "empty point cloud")
def _(d: Path, t: Trained) -> list[str]:
    return _s3dis(d, {"chair_1": [], "floor_1": s3dis_lines()})


@case("s3dis-no-rooms", "s3dis", "no rooms found")
def _(d: Path, t: Trained) -> list[str]:
    (d / "s3dis" / "Area_1").mkdir(parents=True)
    return train_argv(d, point_experiment(d, "s3dis", root=d / "s3dis"))


@case("s3dis-no-test-area", "data.test_area: Area_3 has no rooms", "areas found: 1, 5")
def _(d: Path, t: Trained) -> list[str]:
    return _s3dis(d, None) + ["data.test_area=3"]


# --- point_scenes (your own labelled clouds) ---------------------------------------------------


def _scenes(d: Path, suffix: str = "_points.npy", **data: Any) -> list[str]:
    """A point_scenes experiment over files a, b, c (train, val, test) named ``<x><suffix>`` in ``d/scans``."""
    root = d / "scans"
    root.mkdir(exist_ok=True)
    base = {"root": root, "train_files": [f"a{suffix}"], "val_files": [f"b{suffix}"], "test_files": [f"c{suffix}"],
            "classes": ["ground", "car"], "loop": 2}
    return train_argv(d, point_experiment(d, "point_scenes", **{**base, **data}))


@case("point-scenes-glob-matches-nothing", "data.train_files", "'scan_*.ply' matches no file")
def _(d: Path, t: Trained) -> list[str]:
    return _scenes(d, train_files=["scan_*.ply"])


@case("point-scenes-label-file-missing", "_labels.npy: label file of", "_points.npy not found")
def _(d: Path, t: Trained) -> list[str]:
    argv = _scenes(d, label_files=["_points.npy", "_labels.npy"])
    for seed, name in enumerate("abc"):  # different clouds: splits may not share a file's bytes
        np.save(d / "scans" / f"{name}_points.npy", cloud(seed=seed))
    return argv


@case("point-scenes-copy-in-two-splits", "data.test_files: c_points.npy has the same bytes as", "splits must not share files")
def _(d: Path, t: Trained) -> list[str]:
    argv = _scenes(d, label_files=["_points.npy", "_labels.npy"])
    for seed, name in enumerate("abc"):
        np.save(d / "scans" / f"{name}_points.npy", cloud(seed=seed % 2))  # c is a copy of a (train)
    return argv


@case("point-scenes-no-label-field", ".ply: no label field", "data.label_files")
def _(d: Path, t: Trained) -> list[str]:
    argv = _scenes(d, ".ply")
    for seed, name in enumerate("abc"):
        (d / "scans" / f"{name}.ply").write_text(ply_text(cloud(seed=seed)))
    return argv


def _bin_scans(d: Path, values: int, **data: Any) -> list[str]:
    argv = _scenes(d, ".bin", label_files=[".bin", ".label"], **data)
    for i, name in enumerate("abc"):
        (d / "scans" / f"{name}.bin").write_bytes(np.full(values, i, "<f4").tobytes())
        np.zeros(10, "<u4").tofile(d / "scans" / f"{name}.label")
    return argv


@case("point-scenes-bin-without-columns", ".bin: a raw .bin scan has no header", "--columns x,y,z,intensity")
def _(d: Path, t: Trained) -> list[str]:
    return _bin_scans(d, 40)


@case("point-scenes-bin-ragged", ".bin: 164 bytes", "not a whole number of 4-column float32 records")
def _(d: Path, t: Trained) -> list[str]:
    return _bin_scans(d, 41, columns=["x", "y", "z", "intensity"])


# --- ShapeNetPart ---------------------------------------------------------------------------


def _shapenet(d: Path) -> tuple[Path, list[str]]:
    root = write_shapenetpart(d / "shapenet")
    return root, train_argv(d, point_experiment(d, "shapenetpart", root=root, num_points=8, features=["coord"]))


@case("shapenetpart-missing-category-file", "synsetoffset2category.txt", "missing category file")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _shapenet(d)
    (root / "synsetoffset2category.txt").unlink()
    return argv


@case("shapenetpart-split-not-json", "shuffled_train_file_list.json", "not valid JSON")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _shapenet(d)
    (root / "train_test_split" / "shuffled_train_file_list.json").write_text("[\"shape_data/02691156/x\"")
    return argv


@case("shapenetpart-labels-out-of-range", ".txt", "part labels", "outside Airplane parts 0..3")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = _shapenet(d)
    for path in (root / "02691156").glob("*.txt"):
        table = np.loadtxt(path)
        table[:, 6] = 42
        np.savetxt(path, table, fmt="%.6f")
    return argv


# --- point files through `sciformer predict` ------------------------------------------------


def _predict_points(d: Path, t: Trained, name: str, content: str | bytes, output: str = "pred.json") -> list[str]:
    path = d / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return ["predict", "--checkpoint", str(t.points()), "--input", str(path), "--output", str(d / output)]


def _binary_ply(coords: np.ndarray) -> bytes:
    head = (f"ply\nformat binary_little_endian 1.0\nelement vertex {len(coords)}\n"
            "property float x\nproperty float y\nproperty float z\nend_header\n")
    return head.encode() + np.asarray(coords, "<f4").tobytes()


@case("predict-ply-truncated", "shape.ply", "truncated PLY")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", _binary_ply(cloud())[:-50])


@case("predict-ply-nan-coords", "shape.ply", "non-finite coordinates")
def _(d: Path, t: Trained) -> list[str]:
    pts = cloud()
    pts[3, 1] = np.nan
    return _predict_points(d, t, "shape.ply", _binary_ply(pts))


@case("predict-ply-not-ply", "shape.ply", "not a PLY file")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", b"\x00\x01\x02garbage")


@case("predict-ply-bad-header", "shape.ply", "bad PLY header line")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", ply_text(cloud()).replace("property float y", "property quaternion y"))


@case("predict-ply-empty-cloud", "shape.ply", "empty point cloud")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", ply_text(cloud(0)))


@case("predict-ply-ascii-short", "shape.ply", "truncated PLY")
def _(d: Path, t: Trained) -> list[str]:
    text = ply_text(cloud()).replace("element vertex 40", "element vertex 400")
    return _predict_points(d, t, "shape.ply", text)


@case("predict-ply-face-out-of-range", "shape.ply", "face index out of range 0..2")
def _(d: Path, t: Trained) -> list[str]:
    text = ply_text(np.eye(3)).replace("end_header", "element face 1\nproperty list uchar int vertex_indices\nend_header")
    return _predict_points(d, t, "shape.ply", text + "3 0 1 5\n")


@case("predict-ply-negative-count", "shape.ply:3", "bad PLY header line 'element vertex -40'")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", _binary_ply(cloud()).replace(b"vertex 40", b"vertex -40"))


@case("predict-pcd-negative-points", "shape.pcd", "bad PCD header", "POINTS -40")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.pcd", pcd_binary(cloud()).replace(b"POINTS 40", b"POINTS -40"))


@case("predict-pcd-truncated", "shape.pcd", "truncated PCD")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.pcd", pcd_binary(cloud())[:-30])


@case("predict-pcd-bad-header", "shape.pcd", "bad PCD header")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.pcd", pcd_binary(cloud()).replace(b"SIZE 4 4 4\n", b""))


@case("predict-pcd-all-nan", "shape.pcd", "empty point cloud")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.pcd", pcd_binary(np.full((5, 3), np.nan, np.float32)))


@case("predict-xyz-nan", "shape.xyz", "expected 3 numbers", "nan")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.xyz", "0 0 0\n1 1 1\nnan 2 2\n")


@case("predict-xyz-empty", "shape.xyz", "empty point cloud")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.xyz", "# only a comment\n\n")


@case("predict-xyz-binary", "shape.xyz", "expected")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.xyz", bytes(range(256)) * 4)


@case("predict-off-truncated", "shape.off", "truncated OFF")
def _(d: Path, t: Trained) -> list[str]:
    text = off_text(np.eye(3), [[0, 1, 2]]).replace("3 1 0", "30 10 0")
    return _predict_points(d, t, "shape.off", text)


@case("predict-off-face-out-of-range", "shape.off", "face index out of range")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.off", off_text(np.eye(3), [[0, 1, 7]]))


@case("predict-off-inf-vertex", "shape.off", "non-finite")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.off", off_text(np.array([[0, 0, 0], [1, 0, 0], [0, np.inf, 0]]), [[0, 1, 2]]))


@case("predict-npy-wrong-shape", "shape.npy", "expected (n, >=3)")
def _(d: Path, t: Trained) -> list[str]:
    np.save(d / "shape.npy", cloud()[:, :2])
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "shape.npy"), "--output", str(d / "pred.json")]


@case("predict-las-truncated", "tile.las", "LAS")
def _(d: Path, t: Trained) -> list[str]:
    truncate(write_las(d / "tile.las"), 0.5)
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "tile.las"), "--output", str(d / "pred.json")]


@case("predict-input-is-directory", "--input", "shape.ply", "the folder holds no input file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "shape.ply").mkdir()
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "shape.ply"), "--output", str(d / "pred.json")]


@case("predict-input-missing", "--input", "nope.ply", "does not exist")
def _(d: Path, t: Trained) -> list[str]:
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "nope.ply"), "--output", str(d / "pred.json")]


@case("predict-unknown-suffix", "shape.obj", "unknown point-cloud suffix")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.obj", "v 0 0 0\n")


@case("predict-output-is-directory", "--output", "pred.json", "is a directory")
def _(d: Path, t: Trained) -> list[str]:
    (d / "pred.json").mkdir()
    return _predict_points(d, t, "shape.ply", ply_text(cloud()))


@case("predict-bad-output-suffix", "pred.txt", "unsupported output suffix")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", ply_text(cloud()), output="pred.txt")


@case("predict-batch-size-zero", "--batch-size", "in 1..1048576")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_points(d, t, "shape.ply", ply_text(cloud())) + ["--batch-size", "0"]


@case("predict-batch-size-beyond-the-config-limit", "--batch-size", "in 1..1048576", "99999999999999999999")
def _(d: Path, t: Trained) -> list[str]:  # was accepted (evaluation.batch_size stops at 2^20)
    return _predict_points(d, t, "shape.ply", ply_text(cloud())) + ["--batch-size", "99999999999999999999"]


# --- hyperspectral cubes through `sciformer predict` -----------------------------------------


def _predict_cube(d: Path, t: Trained, name: str) -> list[str]:
    return ["predict", "--checkpoint", str(t.hsi()), "--input", str(d / name), "--output", str(d / "pred.npy")]


@case("predict-cube-nan", "cube.npy", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    cube, _ = make_scene()
    cube[1, 1, 1] = np.nan
    np.save(d / "cube.npy", cube)
    return _predict_cube(d, t, "cube.npy")


@case("predict-cube-band-mismatch", "cube.npy", "4 bands", "trained on 6 bands")
def _(d: Path, t: Trained) -> list[str]:
    np.save(d / "cube.npy", make_scene(bands=4)[0])
    return _predict_cube(d, t, "cube.npy")


@case("predict-cube-mat-truncated", "scene.mat", "truncated or damaged")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    truncate(write_mat_v5(d / "scene.mat", cube=cube, gt=gt), 0.5)
    return _predict_cube(d, t, "scene.mat")


@case("predict-cube-envi-without-data", "scene.hdr", "ENVI")
def _(d: Path, t: Trained) -> list[str]:
    write_envi(d / "scene.hdr", make_scene()[0], data=False)
    return _predict_cube(d, t, "scene.hdr")


# --- checkpoints: evaluate, predict, resume ---------------------------------------------------


def _evaluate(d: Path, ckpt: Path) -> list[str]:
    return ["evaluate", "--checkpoint", str(ckpt), "--output-dir", str(d / "eval")]


def _predict_with(d: Path, t: Trained, ckpt: Path) -> list[str]:
    cube, _ = make_scene()
    np.save(d / "cube.npy", cube)
    return ["predict", "--checkpoint", str(ckpt), "--input", str(d / "cube.npy"), "--output", str(d / "pred.npy")]


def _pickled(d: Path, t: Trained) -> Path:
    return save_tampered(t.checkpoint(), d / "evil.pt", lambda s: s.__setitem__("extra", PickledCode(d / "pwned")))


@case("ckpt-pickled-code-predict", "evil.pt", "refused", "tensors and plain data", marker=True)
def _(d: Path, t: Trained) -> list[str]:
    return _predict_with(d, t, _pickled(d, t))


@case("ckpt-pickled-code-evaluate", "evil.pt", "refused", "tensors and plain data", marker=True)
def _(d: Path, t: Trained) -> list[str]:
    return _evaluate(d, _pickled(d, t))


@case("ckpt-pickled-code-resume", "evil.pt", "refused", "tensors and plain data", marker=True)
def _(d: Path, t: Trained) -> list[str]:
    return ["train", "--resume", str(_pickled(d, t))]


@case("ckpt-pickled-code-in-run-folder", "best.pt", "refused", marker=True)
def _(d: Path, t: Trained) -> list[str]:
    (d / "run" / "checkpoints").mkdir(parents=True)
    save_tampered(t.checkpoint(), d / "run" / "checkpoints" / "best.pt",
                  lambda s: s.__setitem__("model", PickledCode(d / "pwned")))
    return ["evaluate", "--checkpoint", str(d / "run")]


@case("ckpt-truncated-evaluate", "cut.pt", "truncated or not a torch file")
def _(d: Path, t: Trained) -> list[str]:
    raw = t.checkpoint().read_bytes()
    (d / "cut.pt").write_bytes(raw[: len(raw) // 2])
    return _evaluate(d, d / "cut.pt")


@case("ckpt-truncated-predict", "cut.pt", "truncated or not a torch file")
def _(d: Path, t: Trained) -> list[str]:
    raw = t.checkpoint().read_bytes()
    (d / "cut.pt").write_bytes(raw[:100])
    return _predict_with(d, t, d / "cut.pt")


@case("ckpt-truncated-resume", "last.pt", "truncated or not a torch file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run" / "checkpoints").mkdir(parents=True)
    raw = t.checkpoint().read_bytes()
    (d / "run" / "checkpoints" / "last.pt").write_bytes(raw[: len(raw) * 3 // 4])
    return ["train", "--resume", str(d / "run")]


@case("ckpt-foreign-state-dict", "foreign.pt", "not a sciformer checkpoint")
def _(d: Path, t: Trained) -> list[str]:
    torch.save({"state_dict": {"w": torch.zeros(2)}, "epoch": 3}, d / "foreign.pt")
    return _evaluate(d, d / "foreign.pt")


@case("ckpt-foreign-tensor", "foreign.pt", "not a sciformer checkpoint")
def _(d: Path, t: Trained) -> list[str]:
    torch.save(torch.zeros(3), d / "foreign.pt")
    return _predict_with(d, t, d / "foreign.pt")


@case("ckpt-text-file", "notes.pt", "truncated or not a torch file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "notes.pt").write_text("epoch 3, loss 0.2\n")
    return _evaluate(d, d / "notes.pt")


@case("ckpt-empty-file", "empty.pt", "truncated or not a torch file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "empty.pt").write_bytes(b"")
    return _evaluate(d, d / "empty.pt")


@case("ckpt-directory-without-best", "run", "without checkpoints/best.pt")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run").mkdir()
    return _evaluate(d, d / "run")


@case("ckpt-newer-version", "future.pt", "format version 2")
def _(d: Path, t: Trained) -> list[str]:
    return _evaluate(d, save_tampered(t.checkpoint(), d / "future.pt", lambda s: s.__setitem__("version", 2)))


@case("ckpt-without-model", "nomodel.pt", "lacks 'model'")
def _(d: Path, t: Trained) -> list[str]:
    return _evaluate(d, save_tampered(t.checkpoint(), d / "nomodel.pt", lambda s: s.pop("model")))


@case("ckpt-weights-mismatch", "odd.pt", "its weights do not fit the model", "the model wants")
def _(d: Path, t: Trained) -> list[str]:
    def edit(s: dict[str, Any]) -> None:
        key = next(k for k, v in s["model"].items() if v.ndim == 2)
        s["model"][key] = torch.zeros(3, 3)

    return _predict_with(d, t, save_tampered(t.checkpoint(), d / "odd.pt", edit))


@case("ckpt-weights-not-tensors", "odd.pt", "its weights do not fit the model")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_with(d, t, save_tampered(t.checkpoint(), d / "odd.pt", lambda s: s.__setitem__("model", {"w": "text"})))


@case("ckpt-bad-data-info", "odd.pt", "data_info is incomplete", "num_classes")
def _(d: Path, t: Trained) -> list[str]:
    return _evaluate(d, save_tampered(t.checkpoint(), d / "odd.pt", lambda s: s.__setitem__("data_info", {"classes": 3})))


@case("ckpt-config-not-a-mapping", "odd.pt", "'config' is a list; expected a mapping")
def _(d: Path, t: Trained) -> list[str]:
    return _evaluate(d, save_tampered(t.checkpoint(), d / "odd.pt", lambda s: s.__setitem__("config", ["not", "a", "dict"])))


@case("ckpt-config-unknown-key", "odd.pt' config", "unknown key 'train.epoch'", "did you mean 'train.epochs'")
def _(d: Path, t: Trained) -> list[str]:
    return _evaluate(d, save_tampered(t.checkpoint(), d / "odd.pt", lambda s: s["config"]["train"].__setitem__("epoch", 3)))


@case("ckpt-resume-without-optimizer", "odd.pt", "cannot be resumed: it lacks optimizer")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run" / "checkpoints").mkdir(parents=True)
    path = save_tampered(t.checkpoint(), d / "run" / "checkpoints" / "odd.pt", lambda s: s.pop("optimizer"))
    return ["train", "--resume", str(path)]


@case("ckpt-missing-file-predict", "gone.pt", "does not exist")
def _(d: Path, t: Trained) -> list[str]:
    return _predict_with(d, t, d / "gone.pt")


def by_id(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)
