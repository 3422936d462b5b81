"""Synthetic data shared by the tests (importable as ``synthetic``: tests/ is on sys.path).

One builder per kind of input, so every test that needs "a small labelled scene" draws it
the same way and a change to the generator is made once. The point-cloud writers produce
miniature copies of the real releases' folder layouts and file formats (a handful of tiny
shapes, rooms or tiles), so the dataset code runs end to end in well under a second.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def make_hsi_scene(h: int = 30, w: int = 26, bands: int = 8, classes: int = 4, seed: int = 0,
                   block: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A blocky labelled hyperspectral scene: cube (H, W, B) float32, gt (H, W) int64, wavelengths (B,).

    gt is a mosaic of ``block`` x ``block`` rectangles of random classes, 0 (unlabelled)
    included, with every class 1..classes present; each class has its own mean spectrum
    (N(100, 30) per band) plus N(0, 5) noise, so classes are separable.
    """
    rng = np.random.default_rng(seed)
    gt = np.zeros((h, w), dtype=np.int64)
    for i in range(0, h, block):
        for j in range(0, w, block):
            gt[i : i + block, j : j + block] = rng.integers(0, classes + 1)
    for k in range(1, classes + 1):  # every class present
        if not np.any(gt == k):
            gt[(k * 3) % h, (k * 7) % w] = k
    means = rng.normal(100.0, 30.0, size=(classes + 1, bands))  # (K+1, B)
    cube = (means[gt] + rng.normal(0.0, 5.0, size=(h, w, bands))).astype(np.float32)  # (H, W, B)
    wavelengths = np.linspace(400.0, 1000.0, bands)
    return cube, gt, wavelengths


def write_hsi_experiment(folder: Path, *, bands: int = 8, train: str = "epochs: 1, batch_size: 16, progress: never, threads: 1",
                         extra: str = "") -> Path:
    """A 16 x 18 scene of :func:`make_hsi_scene` as ``folder/scene.mat`` and a tiny ``spectral_spatial``
    experiment on it (``folder/tiny.yaml``: 3 x 3 patches, 20 training pixels per class); returns the YAML."""
    import scipy.io

    cube, gt, _ = make_hsi_scene(h=16, w=18, bands=bands, classes=3, block=4)
    scipy.io.savemat(folder / "scene.mat", {"cube": cube, "labels": gt.astype(np.uint8)})
    return write_tiny_hsi_config(folder, "source: scene.mat", train=train, extra=extra)


def write_tiny_hsi_config(folder: Path, data: str, *, name: str = "tiny_hsi", train_per_class: int = 20,
                          band_group_size: int = 3, train: str = "epochs: 1, batch_size: 16, progress: never, threads: 1",
                          extra: str = "") -> Path:
    """``folder/tiny.yaml``: a tiny ``spectral_spatial`` experiment (3 x 3 patches, a stratified
    split) on the scene ``data`` names (flow-style keys, e.g. ``"source: cube.npy, label_path: gt.npy"``)."""
    cfg = folder / "tiny.yaml"
    cfg.write_text(
        f"name: {name}\n"
        f"data: {{name: hsi_scene, {data}, patch_size: 3, split: {{kind: stratified, train_per_class: {train_per_class}, "
        "val_fraction: 0.2}}\n"
        f"model: {{name: spectral_spatial, dim: 16, depth: 1, num_heads: 2, band_group_size: {band_group_size}}}\n"
        f"train: {{{train}}}\n" + extra
    )
    return cfg


# --------------------------------------------------------------------------- point clouds


def blob(rng: np.random.Generator, n: int, centre: float) -> np.ndarray:
    return (rng.normal(size=(n, 3)) * 0.1 + centre).astype(np.float32)  # (n, 3)


# --------------------------------------------------------------------------- ModelNet


def write_modelnet_h5(root: Path, classes: list[str], per_class: tuple[int, int] = (6, 2), points: int = 64) -> Path:
    """``modelnet40_ply_hdf5_2048`` layout: shape_names.txt, *_files.txt, ply_data_*.h5."""
    import h5py

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "shape_names.txt").write_text("\n".join(classes) + "\n")
    for split, count in zip(("train", "test"), per_class, strict=True):
        labels = np.repeat(np.arange(len(classes)), count).astype(np.uint8)[:, None]  # (n, 1)
        data = np.stack([blob(rng, points, float(c)) for c in labels[:, 0]])  # (n, P, 3)
        with h5py.File(root / f"ply_data_{split}0.h5", "w") as fh:
            fh["data"] = data
            fh["label"] = labels
        # the original release lists files with a leading folder
        (root / f"{split}_files.txt").write_text(f"data/modelnet40_ply_hdf5_2048/ply_data_{split}0.h5\n")
    return root


def write_modelnet_txt(root: Path, classes: list[str], per_class: tuple[int, int] = (4, 2), points: int = 40) -> Path:
    """``modelnet40_normal_resampled`` layout with 'x,y,z,nx,ny,nz' text shapes."""
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    (root / "modelnet40_shape_names.txt").write_text("\n".join(classes) + "\n")
    k = 1
    for split, count in zip(("train", "test"), per_class, strict=True):
        ids = []
        for c, name in enumerate(classes):
            (root / name).mkdir(exist_ok=True)
            for _ in range(count):
                shape_id = f"{name}_{k:04d}"
                k += 1
                xyz = blob(rng, points, float(c))
                nrm = rng.normal(size=(points, 3))
                nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
                np.savetxt(root / name / f"{shape_id}.txt", np.hstack([xyz, nrm]), fmt="%.6f", delimiter=",")
                ids.append(shape_id)
        (root / f"modelnet40_{split}.txt").write_text("\n".join(ids) + "\n")
    return root


CUBE_V = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1]], float)
CUBE_QUADS = [[0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [2, 3, 7, 6], [1, 2, 6, 5], [0, 4, 7, 3]]


def off_text(vertices: np.ndarray, faces: list[list[int]], quirk: bool = False) -> str:
    counts = f"{len(vertices)} {len(faces)} 0"
    head = f"OFF{counts}\n" if quirk else f"OFF\n{counts}\n"
    body = "".join(f"{v[0]} {v[1]} {v[2]}\n" for v in vertices)
    return head + body + "".join(f"{len(f)} {' '.join(map(str, f))}\n" for f in faces)


def write_modelnet_off(root: Path, classes: list[str], per_class: tuple[int, int] = (3, 1)) -> Path:
    """Raw meshes: <class>/{train,test}/<class>_NNNN.off (some with the 'OFF<counts>' quirk)."""
    k = 1
    for c, name in enumerate(classes):
        for split, count in zip(("train", "test"), per_class, strict=True):
            folder = root / name / split
            folder.mkdir(parents=True, exist_ok=True)
            for _ in range(count):
                scale = np.array([1.0, 1.0 + c, 1.0])  # classes differ by shape
                (folder / f"{name}_{k:04d}.off").write_text(off_text(CUBE_V * scale, CUBE_QUADS, quirk=k % 2 == 0))
                k += 1
    return root


# --------------------------------------------------------------------------- S3DIS


def write_s3dis(root: Path, rooms: dict[int, list[str]], malformed: bool = True) -> Path:
    """``Stanford3dDataset_v1.2_Aligned_Version`` layout: Area_N/room/Annotations/<class>_<i>.txt.

    Every room has a floor, a wall, a chair and stairs (-> clutter). With
    ``malformed`` the Area_5 hallway_6 ceiling gets a line with a stray character,
    as in the real release.
    """
    rng = np.random.default_rng(2)
    for area, names in rooms.items():
        for room in names:
            ann = root / f"Area_{area}" / room / "Annotations"
            ann.mkdir(parents=True, exist_ok=True)
            parts = {"floor_1": (0.0, 60), "wall_1": (1.0, 50), "chair_1": (2.0, 30),
                     "stairs_1": (3.0, 10), "ceiling_1": (4.0, 20)}
            whole = []
            for stem, (c, n) in parts.items():
                xyz = blob(rng, n, c) + np.array([0, 0, 1.5], np.float32)
                rgb = rng.integers(0, 256, size=(n, 3))
                lines = [f"{x:.3f} {y:.3f} {z:.3f} {r} {g} {b}" for (x, y, z), (r, g, b) in zip(xyz, rgb, strict=True)]
                if malformed and area == 5 and room == "hallway_6" and stem == "ceiling_1":
                    lines.insert(7, "4.100 4.000 5.5\x1000 12 34 56")
                (ann / f"{stem}.txt").write_text("\n".join(lines) + "\n")
                whole += lines
            (root / f"Area_{area}" / room / f"{room}.txt").write_text("\n".join(whole) + "\n")
    return root


# --------------------------------------------------------------------------- ShapeNetPart

SYNSETS = {
    "Airplane": "02691156", "Bag": "02773838", "Cap": "02954340", "Car": "02958343", "Chair": "03001627",
    "Earphone": "03261776", "Guitar": "03467517", "Knife": "03624134", "Lamp": "03636649", "Laptop": "03642806",
    "Motorbike": "03790512", "Mug": "03797390", "Pistol": "03948459", "Rocket": "04099429",
    "Skateboard": "04225987", "Table": "04379243",
}


def write_shapenetpart(root: Path, shapes: dict[str, tuple[int, int, int]] | None = None, points: int = 50) -> Path:
    """``shapenetcore_partanno_segmentation_benchmark_v0_normal`` layout (Airplane and Bag shapes)."""
    from sciformer.data.pointcloud.shapenetpart import CATEGORY_PARTS

    shapes = shapes or {"Airplane": (3, 1, 2), "Bag": (2, 1, 1)}
    rng = np.random.default_rng(3)
    root.mkdir(parents=True, exist_ok=True)
    (root / "synsetoffset2category.txt").write_text("".join(f"{c}\t{s}\n" for c, s in SYNSETS.items()))
    lists: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    k = 0
    for cat, counts in shapes.items():
        syn = SYNSETS[cat]
        (root / syn).mkdir(exist_ok=True)
        for split, count in zip(("train", "val", "test"), counts, strict=True):
            for _ in range(count):
                shape_id = f"{k:032x}"
                k += 1
                xyz = rng.normal(size=(points, 3))
                nrm = xyz / np.linalg.norm(xyz, axis=1, keepdims=True)
                part = rng.choice(CATEGORY_PARTS[cat], size=points)
                np.savetxt(root / syn / f"{shape_id}.txt", np.column_stack([xyz, nrm, part]), fmt="%.6f")
                lists[split].append(f"shape_data/{syn}/{shape_id}")
    (root / "train_test_split").mkdir(exist_ok=True)
    for split, entries in lists.items():
        (root / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    return root


# --------------------------------------------------------------------------- LAS


def write_las(path: Path, n: int = 2000, *, rgb: bool = True, codes: tuple[int, ...] = (1, 2, 5, 6, 7), size: float = 100.0,
              seed: int = 0, eight_bit: bool = False) -> dict[str, np.ndarray]:
    """A LAS/LAZ tile (by suffix) at large georeferenced coordinates; returns what was written."""
    import laspy

    rng = np.random.default_rng(seed)
    header = laspy.LasHeader(point_format=3 if rgb else 1, version="1.2")
    header.scales = np.array([0.01, 0.01, 0.01])
    header.offsets = np.array([600000.0, 5000000.0, 0.0])
    las = laspy.LasData(header)
    xyz = np.column_stack([
        600000.0 + rng.uniform(0, size, n), 5000000.0 + rng.uniform(0, size, n), 200.0 + rng.uniform(0, 20, n)
    ])  # (n, 3)
    xyz = np.round(xyz, 2)
    las.x, las.y, las.z = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    cls = rng.choice(np.asarray(codes), n).astype(np.uint8)
    las.classification = cls
    intensity = rng.integers(0, 4000, n).astype(np.uint16)
    las.intensity = intensity
    out = {"coord": xyz, "classification": cls, "intensity": intensity}
    if rgb:
        top = 255 if eight_bit else 65535
        colour = rng.integers(0, top + 1, size=(n, 3)).astype(np.uint16)
        las.red, las.green, las.blue = colour[:, 0], colour[:, 1], colour[:, 2]
        out["colour"] = colour
    path.parent.mkdir(parents=True, exist_ok=True)
    las.write(path)
    return out


def eio_link(folder: Path, name: str) -> Path:
    """``folder/name``: a link to a regular file whose every read fails with EIO (offset 0 of
    ``/proc/self/mem``, never mapped), a stand-in for a failing disk; the test is skipped
    where reading it does not fail so."""
    import errno

    import pytest

    link = folder / name
    link.symlink_to("/proc/self/mem")
    try:
        with open(link, "rb") as fh:
            fh.read(8)
    except OSError as exc:
        if exc.errno == errno.EIO:
            return link
    pytest.skip("no file here whose reads fail with EIO (/proc/self/mem)")


@contextlib.contextmanager
def traced_peak() -> Iterator[list[int]]:
    """The most bytes Python held at once inside the block (tracemalloc), in the list it yields,
    once the block ends: ``with traced_peak() as peak, pytest.raises(DataError): ...; peak[0]``."""
    tracemalloc.start()
    peak: list[int] = []
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
