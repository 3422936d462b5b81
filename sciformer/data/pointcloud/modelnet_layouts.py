"""ModelNet on disk: the three layouts (HDF5 release, ``modelnet40_normal_resampled`` text,
raw ``.off`` meshes) read into ``{split: {"points", "labels", ...}}`` with class names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sciformer.data.pointcloud.cache import (
    cache_key,
    file_identity,
    files_identity,
    load_arrays,
    save_arrays_atomic,
)
from sciformer.data.pointcloud.dataset import read_list_file
from sciformer.data.pointcloud.fields import check_labels
from sciformer.data.pointcloud.io import (
    read_off,
    sample_mesh_surface,
)
from sciformer.data.pointcloud.split_files import check_disjoint_splits
from sciformer.errors import DataError
from sciformer.utils.limits import check_hdf5_dataset
from sciformer.utils.progress import progress


def detect_layout(root: Path) -> str:
    """Which ModelNet layout ``root`` holds (h5, normal_resampled or off)."""
    if (root / "train_files.txt").is_file():
        return "h5"
    if any(root.glob("modelnet*_shape_names.txt")):
        return "normal_resampled"
    if any(d.is_dir() and ((d / "train").is_dir() or (d / "test").is_dir()) for d in root.iterdir()):
        return "off"
    raise DataError(
        f"{root}: not a ModelNet folder (expected train_files.txt, modelnet40_shape_names.txt "
        "or <class>/train/*.off)"
    )


# Each returns {"points": (S, P, 3) float32, "normals": (S, P, 3) float32 or None,
#               "labels": (S,) int64} per split, plus the class names.


def _resolve_listed(root: Path, line: str) -> Path:
    direct = root / line
    return direct if direct.is_file() else root / Path(line).name


def load_h5_layout(root: Path, want_normals: bool) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Read the ``modelnet40_ply_hdf5_2048`` layout into memory."""
    import h5py

    names = read_list_file(root / "shape_names.txt", "class file (shape_names.txt)")
    splits: dict[str, dict[str, Any]] = {}
    for split in ("train", "test"):
        listing = root / f"{split}_files.txt"
        points, labels, normals = [], [], []
        for line in read_list_file(listing, f"{split} file list"):
            path = _resolve_listed(root, line)
            if path.exists() and not path.is_file():
                raise DataError(f"{listing}: listed file '{line}' is not a file ({path}); expected an HDF5 file")
            if not path.is_file():
                raise DataError(f"{listing}: listed file '{line}' not found under {root}")
            try:
                with h5py.File(path, "r") as fh:
                    for key in ("data", "label", *(("normal",) if want_normals else ())):
                        if key not in fh:
                            raise DataError(f"{path}: missing key '{key}' (keys: {', '.join(fh.keys())})" if key != "normal"
                                            else f"{path}: feature 'normal' asked but the file has no 'normal' key")
                        check_hdf5_dataset(fh[key], f"{path} [{key}]")  # before reading: budget, bombs, external data
                    data = np.asarray(fh["data"], dtype=np.float32)  # (n, P, 3)
                    label = check_labels(path, np.asarray(fh["label"]).reshape(-1), "'label'")  # (n,)
                    if want_normals:
                        normals.append(np.asarray(fh["normal"], dtype=np.float32))
            except DataError:
                raise
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:  # h5py reports damage with all of these
                raise DataError(f"{path}: not a readable HDF5 file ({type(exc).__name__}: {exc})") from exc
            if data.ndim != 3 or data.shape[2] != 3 or data.shape[0] != label.shape[0]:
                raise DataError(f"{path}: 'data' has shape {data.shape} and 'label' {label.shape}; expected (n, P, 3) and (n, 1)")
            if data.shape[0] == 0:
                raise DataError(f"{path}: no shapes ('data' has shape {data.shape}); expected (n, P, 3) with n > 0")
            if label.size and (label.min() < 0 or label.max() >= len(names)):
                raise DataError(f"{path}: labels {label.min()}..{label.max()} outside 0..{len(names) - 1} of shape_names.txt")
            _check_finite(path, "data", data)
            points.append(data)
            labels.append(label)
        splits[split] = {
            "points": np.concatenate(points),
            "labels": np.concatenate(labels),
            "normals": np.concatenate(normals) if want_normals else None,
        }
    return names, splits


def _check_finite(path: Path, key: str, values: np.ndarray) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        raise DataError(f"{path}: '{key}' has {int(bad.sum())} NaN/Inf values; expected finite coordinates")


def _load_txt_shape(path: Path, num_points: int) -> np.ndarray:
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float32, max_rows=num_points, ndmin=2)  # (P, 6)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: expected lines 'x,y,z,nx,ny,nz' ({exc})") from exc
    if table.shape[0] < num_points or table.shape[1] < 6:
        raise DataError(f"{path}: has {table.shape[0]} points of {table.shape[1]} values, need {num_points} of 6")
    _check_finite(path, "x,y,z,nx,ny,nz", table[:, :6])
    return table[:, :6]


def _cached(cache: Path, build: Any) -> dict[str, np.ndarray]:
    if not (cache / "meta.json").is_file():
        arrays = build()
        save_arrays_atomic(cache, arrays)
    return load_arrays(cache, ["points", "normals", "labels"], mmap=False)


def load_normal_resampled_layout(
    root: Path, variant: str, num_points: int, cache_dir: Path
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Read the ``modelnet40_normal_resampled`` layout (converted once into the cache)."""
    names = read_list_file(root / f"{variant}_shape_names.txt", f"class file ({variant}_shape_names.txt)")
    index = {n: i for i, n in enumerate(names)}
    listed = {split: read_list_file(root / f"{variant}_{split}.txt", f"{split} shape list") for split in ("train", "test")}
    paths = {split: [root / i.rsplit("_", 1)[0] / f"{i}.txt" for i in ids] for split, ids in listed.items()}
    check_disjoint_splits({s: [p for p in ps if p.is_file()] for s, ps in paths.items()}, "shapes",  # missing: named when read
                          listed=f"{variant}_{{}}.txt", copies=False)  # an id in both lists, a link to a training shape
    splits: dict[str, dict[str, Any]] = {}
    for split in ("train", "test"):
        listing = root / f"{variant}_{split}.txt"
        ids = listed[split]
        shapes = files_identity(paths[split])  # an edited shape is read again
        key = cache_key("modelnet-txt-v1", file_identity(listing), str(root.resolve()), num_points, shapes, names)  # labels follow the names

        def build(ids: list[str] = ids, listing: Path = listing) -> dict[str, np.ndarray]:
            pts = np.empty((len(ids), num_points, 6), dtype=np.float32)  # (S, P, 6)
            labels = np.empty(len(ids), dtype=np.int64)
            for j, shape_id in enumerate(progress(ids, f"ModelNet {listing.name}")):
                cls = shape_id.rsplit("_", 1)[0]
                if cls not in index:
                    raise DataError(f"{listing}: shape '{shape_id}' has class '{cls}' not in {variant}_shape_names.txt")
                pts[j] = _load_txt_shape(root / cls / f"{shape_id}.txt", num_points)
                labels[j] = index[cls]
            return {"points": pts[:, :, :3].copy(), "normals": pts[:, :, 3:].copy(), "labels": labels}

        arrays = _cached(cache_dir / "modelnet" / key, build)
        splits[split] = arrays
    return names, splits


def load_off_layout(root: Path, num_points: int, seed: int, cache_dir: Path) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Sample raw ``.off`` meshes once (area-weighted, unit sphere) into the cache."""
    names = sorted(d.name for d in root.iterdir() if d.is_dir() and ((d / "train").is_dir() or (d / "test").is_dir()))
    if not names:
        raise DataError(f"{root}: no class folders with train/ or test/ inside")
    listed = {split: [(c, p) for c, name in enumerate(names) for p in sorted((root / name / split).glob("*.off"))]
              for split in ("train", "test")}
    check_disjoint_splits({split: [p for _, p in files] for split, files in listed.items()}, "meshes",
                          listed="<class>/{}/", copies=False)  # a test mesh that is a link to a training one
    splits: dict[str, dict[str, Any]] = {}
    for split in ("train", "test"):
        files = listed[split]
        if not files:
            raise DataError(f"{root}: no {split} meshes (<class>/{split}/*.off)")
        key = cache_key("modelnet-off-v1", [[c, *file_identity(p)] for c, p in files], names, num_points, seed)  # labels cached too

        def build(files: list[tuple[int, Path]] = files, split: str = split) -> dict[str, np.ndarray]:
            pts = np.empty((len(files), num_points, 3), dtype=np.float32)  # (S, P, 3)
            nrm = np.empty((len(files), num_points, 3), dtype=np.float32)  # (S, P, 3)
            for j, (_, path) in enumerate(progress(files, f"ModelNet {split} meshes")):
                vertices, faces = read_off(path)
                p, n = sample_mesh_surface(vertices, faces, num_points, np.random.default_rng([seed, j]),
                                           return_normals=True, source=path)
                p = p - p.mean(axis=0)
                pts[j] = p / max(float(np.linalg.norm(p, axis=1).max()), 1e-12)
                nrm[j] = n
            return {"points": pts, "normals": nrm, "labels": np.array([c for c, _ in files], dtype=np.int64)}

        splits[split] = _cached(cache_dir / "modelnet" / key, build)
    return names, splits


