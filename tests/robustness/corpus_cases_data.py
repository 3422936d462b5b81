"""Corpus cases: experiment files and hyperspectral scenes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from corpus_kit import Trained, case, hsi_experiment, make_scene, train_argv, truncate, write_envi, write_mat_v5, write_mat_v73

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
    cube[3, 4, 2] = np.nan  # a labelled no-data pixel: refused for training
    gt[3, 4] = max(int(gt[3, 4]), 1)
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", gt)
    return _scene_case(d, "cube.npy", label_path="gt.npy")


@case("hsi-cube-inf-mat", "scene.mat", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    cube[0, 1, 0] = np.inf
    gt[0, 1] = max(int(gt[0, 1]), 1)
    write_mat_v5(d / "scene.mat", cube=cube.astype(np.float64), gt=gt)
    return _scene_case(d, "scene.mat")


@case("hsi-cube-inf-mat-v73", "scene.mat", "NaN/Inf")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    cube[5, 5, 5] = -np.inf
    gt[5, 5] = max(int(gt[5, 5]), 1)
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


@case("hsi-npy-pickled-object", "cube.npy", "holds Python objects")
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
