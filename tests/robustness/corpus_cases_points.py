"""Corpus cases: point-cloud datasets (ModelNet, LAS/LAZ tiles, S3DIS, point_scenes, ShapeNetPart)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from corpus_kit import (
    Trained,
    case,
    cloud,
    las_experiment,
    modelnet_experiment,
    ply_text,
    point_experiment,
    s3dis_lines,
    train_argv,
    truncate,
    write_las,
    write_modelnet_h5,
    write_s3dis,
    write_shapenetpart,
)

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
    (root / "chair" / "chair_0003.txt").write_text(text + "\n")  # the test shape (splits may not share one)
    (root / "modelnet40_train.txt").write_text("chair_0001\nchair_0002\n")
    (root / "modelnet40_test.txt").write_text("chair_0003\n")
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
