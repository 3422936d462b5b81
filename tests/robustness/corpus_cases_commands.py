"""Corpus cases: point files and cubes through `sciformer predict`; checkpoints through evaluate, predict and resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from corpus_kit import PickledCode, Trained, case, cloud, make_scene, off_text, pcd_binary, ply_text, save_tampered, truncate, write_envi, write_las, write_mat_v5

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
