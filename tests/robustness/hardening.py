"""More malformed inputs, by kind: config ranges, output folders, resumes and tampered
checkpoints, special files, decompression bombs, malformed point and label files.

Same contract as :mod:`corpus` (each builder writes one bad input and returns the argv
that must exit 2 with one line); run in one fresh process by ``test_hardening_corpus.py``,
which also bounds each case's time and the process's peak memory.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import corpus
import numpy as np
import torch
from corpus import Case, Trained, hsi_experiment, make_scene, train_argv, write_mat_v5

CASES: list[Case] = []
_HELD: list[object] = []  # open lock handles (kept alive for the case)


def case(id: str, *expect: str) -> Callable[[Callable[[Path, Trained], list[str]]], Callable[[Path, Trained], list[str]]]:
    def register(build: Callable[[Path, Trained], list[str]]) -> Callable[[Path, Trained], list[str]]:
        CASES.append(Case(id, build, tuple(expect)))
        return build

    return register


def _hsi(d: Path, extra: str = "", **data: object) -> Path:
    """A valid tiny hsi_scene experiment (scene.mat) plus ``extra`` YAML lines."""
    cube, gt = make_scene()
    write_mat_v5(d / "scene.mat", cube=cube, gt=gt)
    path = hsi_experiment(d, "scene.mat", image_key="cube", **data)
    if extra:
        path.write_text(path.read_text() + extra)
    return path


def _override(*overrides: str) -> Callable[[Path, Trained], list[str]]:
    return lambda d, t: train_argv(d, _hsi(d), *overrides)


# --- config value ranges ---------------------------------------------------------------------

for _id, _ovr, _expect in [
    ("cfg-adam-beta-one", "optimizer.betas=[0.9, 1.0]", ("optimizer.betas", "[0, 1)")),
    ("cfg-adam-beta-negative", "optimizer.betas=[-0.1, 0.999]", ("optimizer.betas", "[0, 1)")),
    ("cfg-nesterov-no-momentum", "optimizer={name: sgd, nesterov: true, momentum: 0}", ("nesterov", "momentum > 0")),
    ("cfg-momentum-above-one", "optimizer.momentum=1.5", ("optimizer.momentum",)),
    ("cfg-lr-inf", "optimizer.lr=.inf", ("optimizer.lr", "finite")),
    ("cfg-lr-nan", "optimizer.lr=.nan", ("optimizer.lr", "finite")),
    ("cfg-seed-negative", "train.seed=-1", ("train.seed",)),
    ("cfg-epochs-true", "train.epochs=true", ("train.epochs", "expected a number, got true")),  # was 1 epoch
    ("cfg-ema-false", "train.ema=false", ("train.ema", "expected a number or null, got false")),
    ("cfg-model-width-true", "model.dim=true", ("model.dim", "expected a number, got true")),  # model and data parameters too
    ("cfg-split-seed-true", "data.split.seed=true", ("data.split.seed", "expected a number or null, got true")),
    ("cfg-seed-huge", "train.seed=1e30", ("train.seed",)),
    ("cfg-batch-huge", "train.batch_size=1e30", ("train.batch_size",)),
    ("cfg-eval-batch-huge", "evaluation.batch_size=10000000000", ("evaluation.batch_size",)),
    ("cfg-epochs-huge", "train.epochs=1000000000000", ("train.epochs",)),
    ("cfg-device-meta", "train.device=meta", ("train.device", "meta")),
    ("cfg-device-garbage", "train.device=cuda:x", ("train.device",)),
    ("cfg-model-width-huge", "model.dim=1000000", ("model.dim", "largest model size")),
    ("cfg-model-depth-huge", "model.depth=100000", ("model.depth", "largest model size")),
    ("cfg-patch-size-huge", "data.patch_size=10001", ("data.patch_size", "up to")),
    ("cfg-workers-huge", "train.num_workers=100000", ("train.num_workers",)),
    ("cfg-weight-decay-inf", "optimizer.weight_decay=.inf", ("optimizer.weight_decay", "finite")),
    ("cfg-grad-clip-nan", "train.grad_clip=.nan", ("train.grad_clip", "finite")),
    ("cfg-name-slash", "name=../../escape", ("name", "file-name component")),
    ("cfg-name-dotdot", "name=..", ("name", "file-name component")),
    ("cfg-name-long", "name=" + "n" * 300, ("name", "file-name component")),
]:
    case(_id, *_expect)(_override(_ovr))


@case("cfg-seed-flag-negative", "train.seed")
def _(d: Path, t: Trained) -> list[str]:
    return [*train_argv(d, _hsi(d)), "--seed", "-1"]


@case("cfg-seed-flag-huge", "--seed", "invalid int value")
def _(d: Path, t: Trained) -> list[str]:
    return [*train_argv(d, _hsi(d)), "--seed", "1e30"]


@case("cfg-name-long-value-not-echoed", "name", "chars)")
def _(d: Path, t: Trained) -> list[str]:
    cfg = _hsi(d)
    cfg.write_text(cfg.read_text().replace("name: bad_hsi", "name: " + "x" * 500_000))
    return ["train", "--config", str(cfg)]  # default run folder from the name: refused before


@case("cfg-ten-megabytes", "exp.yaml", "a config is at most")
def _(d: Path, t: Trained) -> list[str]:
    cfg = _hsi(d)
    cfg.write_text(cfg.read_text().replace("name: bad_hsi", "name: " + "x" * 10_000_000))
    return ["train", "--config", str(cfg)]


@case("cfg-duplicate-section", "exp.yaml", "duplicate key 'train'")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, _hsi(d, extra="train: {epochs: 2}\n"))


@case("cfg-duplicate-nested-key", "exp.yaml", "duplicate key 'lr'")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, _hsi(d, extra="optimizer: {lr: 0.1, lr: 0.2}\n"))


@case("cfg-fifo", "exp.yaml", "not a regular file")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "exp.yaml")
    return train_argv(d, d / "exp.yaml")


@case("cfg-dev-zero", "/dev/zero", "not a regular file")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, Path("/dev/zero"))


# --- output folders -----------------------------------------------------------------------------


@case("out-dir-is-file", "run", "expected a folder")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run").write_text("a file\n")
    return train_argv(d, _hsi(d))


@case("out-dir-below-file", "a path component is a file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "blocker").write_text("a file\n")
    return ["train", "--config", str(_hsi(d)), "--output-dir", str(d / "blocker" / "run")]


@case("out-dir-locked", "being written by another sciformer process")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run").mkdir()
    handle = open(d / "run" / ".lock", "a+")
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write("4242\n")
    handle.flush()
    _HELD.append(handle)
    return train_argv(d, _hsi(d))


# --- resumes and tampered checkpoints -------------------------------------------------------------


def _copy_run(d: Path, t: Trained) -> Path:
    run = d / "resumed"
    shutil.copytree(t.hsi(), run)
    return run


for _id, _ovr, _expect in [
    ("resume-changed-width", "model.dim=16", ("--resume cannot change model.dim",)),
    ("resume-changed-optimizer", "optimizer.name=sgd", ("--resume cannot change optimizer.name",)),
    ("resume-changed-data", "data.patch_size=5", ("--resume cannot change data.patch_size",)),
    ("resume-changed-seed", "train.seed=5", ("--resume cannot change train.seed",)),  # redrew the split (data.split.seed null)
]:
    def _build(d: Path, t: Trained, ovr: str = _ovr) -> list[str]:
        return ["train", "--resume", str(_copy_run(d, t)), ovr]

    case(_id, *_expect)(_build)


def _tampered_resume(d: Path, t: Trained, edit: Callable[[dict], None]) -> list[str]:
    run = _copy_run(d, t)
    corpus.save_tampered(run / "checkpoints" / "last.pt", run / "checkpoints" / "last.pt", edit)
    return ["train", "--resume", str(run)]


for _id, _edit, _expect in [
    ("ckpt-epoch-float", lambda s: s.update(epoch=1.5), ("'epoch' is '1.5'", "non-negative integer")),
    ("ckpt-epoch-negative", lambda s: s.update(epoch=-3), ("'epoch'",)),
    ("ckpt-step-huge", lambda s: s.update(step_in_epoch=10**12), ("step_in_epoch",)),
    ("ckpt-partial-garbage", lambda s: s.update(partial=["x", None]), ("'partial'",)),
    ("ckpt-best-garbage", lambda s: s.update(best=[1, 2]), ("'best' is malformed",)),
    ("ckpt-optimizer-garbage", lambda s: s.update(optimizer={"state": 3, "param_groups": "x"}), ("optimizer state does not match",)),
    ("ckpt-model-other-shapes", lambda s: s["model"].update({k: torch.zeros(3) for k in list(s["model"])[:1]}), ("its weights do not fit the model",)),
    ("ckpt-classes-huge", lambda s: s["data_info"].update(num_classes=10**12), ("data_info.num_classes",)),
    ("ckpt-channels-negative", lambda s: s["data_info"].update(in_channels=-5), ("data_info.in_channels",)),
    ("ckpt-class-names-short", lambda s: s["data_info"].update(class_names=["a"]), ("class_names",)),
    # another run's last.pt copied into this folder (its split and seed would replace the folder's)
    ("ckpt-of-another-run", lambda s: s.update(run_id="0" * 32), ("was written by another run", "--init-from")),
]:
    def _build(d: Path, t: Trained, edit: Callable[[dict], None] = _edit) -> list[str]:
        return _tampered_resume(d, t, edit)

    case(_id, *_expect)(_build)


for _id, _edit, _expect in [("evaluate-ckpt-epoch-text", lambda s: s.update(epoch="x"), "'epoch' is 'x'"),
                            ("evaluate-ckpt-step-negative", lambda s: s.update(global_step=-5), "'global_step' is '-5'")]:
    def _build(d: Path, t: Trained, edit: Callable[[dict], None] = _edit) -> list[str]:  # were written into metrics.json
        ckpt = corpus.save_tampered(t.checkpoint(), d / "x.pt", edit)
        return ["evaluate", "--checkpoint", str(ckpt), "--output-dir", str(d / "eval")]

    case(_id, _expect, "non-negative integer")(_build)


@case("ckpt-classes-huge-evaluate", "data_info.num_classes")
def _(d: Path, t: Trained) -> list[str]:
    ckpt = corpus.save_tampered(t.checkpoint(), d / "x.pt", lambda s: s["data_info"].update(num_classes=2**40))
    return ["evaluate", "--checkpoint", str(ckpt), "--output-dir", str(d / "eval")]


@case("ckpt-deflated-members", "compressed members")
def _(d: Path, t: Trained) -> list[str]:
    src, dst = t.checkpoint(), d / "bomb.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        zout.writestr(info.filename.rsplit("/", 1)[0] + "/data/999", b"\x00" * (64 * 2**20))  # 64 MiB of zeros in a few KB
    return ["evaluate", "--checkpoint", str(dst), "--output-dir", str(d / "eval")]


@case("ckpt-fifo", "is a FIFO")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "x.pt")
    return ["evaluate", "--checkpoint", str(d / "x.pt"), "--output-dir", str(d / "eval")]


@case("ckpt-dev-zero", "/dev/zero", "a device")
def _(d: Path, t: Trained) -> list[str]:
    return ["evaluate", "--checkpoint", "/dev/zero", "--output-dir", str(d / "eval")]


# --- non-finite training ---------------------------------------------------------------------------


@case("train-diverges", "became nan", "lower optimizer.lr")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, _hsi(d), "optimizer={name: sgd, lr: 100, momentum: 0.9}", "train.max_steps_per_epoch=null", "train.epochs=3")


# --- special files as data ----------------------------------------------------------------------


@case("data-fifo", "scene.mat", "FIFO")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "scene.mat")
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube"))


@case("data-dev-zero", "/dev/zero", "a device")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, hsi_experiment(d, "/dev/zero"))


@case("predict-input-fifo", "shape.ply", "not a regular file or folder")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "shape.ply")
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "shape.ply"), "--output", str(d / "pred.json")]


# --- decompression bombs and absurd declared sizes ---------------------------------------------------

BOMB_SHAPE = (3000, 3000, 100)  # float32: 3.4 GiB declared, a few KB on disk


@case("bomb-mat-v73-gzip", "scene.mat [cube]", "decompression bomb")
def _(d: Path, t: Trained) -> list[str]:
    import h5py

    _cube, gt = make_scene()
    with h5py.File(d / "scene.mat", "w", userblock_size=512) as fh:
        fh.create_dataset("cube", shape=BOMB_SHAPE[::-1], dtype="f4", chunks=(10, 100, 100), compression="gzip")  # all fill value
        fh["gt"] = gt.T.astype(np.float64)
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube"))


@case("bomb-mat-v73-beyond-budget", "scene.mat [cube]", "SCIFORMER_MAX_ARRAY_BYTES")
def _(d: Path, t: Trained) -> list[str]:
    import h5py

    with h5py.File(d / "scene.mat", "w", userblock_size=512) as fh:
        fh.create_dataset("cube", shape=(30000, 30000, 200), dtype="f8", chunks=(10, 100, 100), compression="gzip")
        fh["gt"] = np.ones((1, 1), dtype=np.uint8)
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube", label_path="scene.mat", label_key="gt"))


@case("hdf5-external-storage", "scene.mat [cube]", "external storage")
def _(d: Path, t: Trained) -> list[str]:
    import h5py

    _, gt = make_scene()
    with h5py.File(d / "scene.mat", "w", userblock_size=512) as fh:
        fh.create_dataset("cube", shape=(6, 16, 16), dtype="u1", external=[("/etc/passwd", 0, 6 * 16 * 16)])
        fh["gt"] = gt.T.astype(np.float64)
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube"))


@case("hdf5-virtual-missing-source", "scene.mat [cube]", "virtual HDF5 dataset")
def _(d: Path, t: Trained) -> list[str]:
    import h5py

    _, gt = make_scene()
    layout = h5py.VirtualLayout(shape=(6, 16, 16), dtype="f4")
    layout[:] = h5py.VirtualSource(str(d / "missing.h5"), "data", shape=(6, 16, 16))
    with h5py.File(d / "scene.mat", "w", userblock_size=512) as fh:
        fh.create_virtual_dataset("cube", layout, fillvalue=0)
        fh["gt"] = gt.T.astype(np.float64)
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube"))


def _mat_v5_with_dims(path: Path, dims: tuple[int, int, int]) -> None:
    """A compressed .mat v5 whose one element declares ``dims`` (its stream holds a tiny array)."""
    import io
    import zlib

    import scipy.io

    buf = io.BytesIO()
    scipy.io.savemat(buf, {"cube": np.zeros((2, 2, 2))}, do_compression=True)
    raw = buf.getvalue()
    inner = bytearray(zlib.decompress(raw[136:]))
    inner[32:44] = struct.pack("<iii", *dims)  # miMATRIX tag (8) + flags (16) + dims tag (8) -> the three dims
    body = zlib.compress(bytes(inner))
    path.write_bytes(raw[:128] + struct.pack("<II", 15, len(body)) + body)


@case("bomb-mat-v5-compressed-element", "scene.mat [cube]", "decompression bomb")
def _(d: Path, t: Trained) -> list[str]:
    _mat_v5_with_dims(d / "scene.mat", (2000, 2000, 100))  # 3 GiB of doubles from a few hundred bytes
    _, gt = make_scene()
    np.save(d / "gt.npy", gt)
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube", label_path="gt.npy"))


def _npz_with_header(path: Path, shape: tuple[int, ...]) -> None:
    """An .npz whose deflated 'cube' member declares ``shape`` (its data stream holds a few zeros)."""
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    member = io_bytes()
    np.lib.format.write_array_header_1_0(member, header)
    member.write(b"\x00" * 4096)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("cube.npy", member.getvalue())


def io_bytes():
    import io

    return io.BytesIO()


@case("bomb-npz-member", "scene.npz [cube]", "decompression bomb")
def _(d: Path, t: Trained) -> list[str]:
    _npz_with_header(d / "scene.npz", BOMB_SHAPE)
    _, gt = make_scene()
    np.save(d / "gt.npy", gt)
    return train_argv(d, hsi_experiment(d, "scene.npz", image_key="cube", label_path="gt.npy"))


@case("bomb-npz-point-cloud", "shape.npz [coord]", "decompression bomb")
def _(d: Path, t: Trained) -> list[str]:
    header = {"descr": "<f8", "fortran_order": False, "shape": (100_000_000, 3)}  # 2.2 GiB
    member = io_bytes()
    np.lib.format.write_array_header_1_0(member, header)
    member.write(b"\x00" * 4096)
    with zipfile.ZipFile(d / "shape.npz", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("coord.npy", member.getvalue())
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "shape.npz"), "--output", str(d / "pred.json")]


@case("bomb-pcd-compressed", "shape.pcd", "beyond LZF's ratio")
def _(d: Path, t: Trained) -> list[str]:
    n = 200_000_000
    head = f"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH {n}\nHEIGHT 1\nPOINTS {n}\nDATA binary_compressed\n"
    body = struct.pack("<II", 64, n * 12 % 2**32) + b"\x1f" + b"\x00" * 63
    (d / "shape.pcd").write_bytes(head.encode() + body)
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "shape.pcd"), "--output", str(d / "pred.json")]


@case("bomb-modelnet-h5", "ply_data_train0.h5 [data]", "decompression bomb")
def _(d: Path, t: Trained) -> list[str]:
    import h5py

    root = corpus.write_modelnet_h5(d / "modelnet")
    with h5py.File(root / "ply_data_train0.h5", "w") as fh:
        fh.create_dataset("data", shape=(100_000, 2048, 3), dtype="f4", chunks=(100, 2048, 3), compression="gzip")  # 2.3 GiB
        fh["label"] = np.zeros((300_000, 1), dtype=np.uint8)[:8]
    return train_argv(d, corpus.modelnet_experiment(d, root))


# --- labels: non-integer, absurd ids -----------------------------------------------------------------


@case("hsi-label-id-huge", "label map has class id 30000000")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    gt = gt.astype(np.float64)
    gt[0, 0] = 3e7
    write_mat_v5(d / "scene.mat", cube=cube, gt=gt)
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube", label_key="gt"))


@case("modelnet-h5-float-labels", "ply_data_train0.h5", "non-integer labels")
def _(d: Path, t: Trained) -> list[str]:
    return corpus._modelnet(d, lambda a: a.__setitem__("label", a["label"].astype(np.float32) + 0.5))[1]


@case("modelnet-h5-label-2-pow-40", "ply_data_train0.h5", "not plausible class ids")
def _(d: Path, t: Trained) -> list[str]:
    return corpus._modelnet(d, lambda a: a.__setitem__("label", (a["label"].astype(np.int64) + 2**40)))[1]


@case("shapenetpart-float-labels", ".txt", "non-integer labels")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = corpus._shapenet(d)
    for path in (root / "02691156").glob("*.txt"):
        table = np.loadtxt(path)
        table[:, 6] = 1.5
        np.savetxt(path, table, fmt="%.6f")
    return argv


@case("shapenetpart-label-3e7", ".txt", "not plausible class ids")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = corpus._shapenet(d)
    for path in (root / "02691156").glob("*.txt"):
        table = np.loadtxt(path)
        table[:, 6] = 3e7
        np.savetxt(path, table, fmt="%.1f")
    return argv


@case("predict-ply-float-labels", "shape.ply", "non-integer labels")
def _(d: Path, t: Trained) -> list[str]:
    pts = corpus.cloud()
    head = (f"ply\nformat ascii 1.0\nelement vertex {len(pts)}\nproperty float x\nproperty float y\nproperty float z\n"
            "property float label\nend_header\n")
    text = head + "".join(f"{x} {y} {z} 0.5\n" for x, y, z in pts)
    return corpus._predict_points(d, t, "shape.ply", text)


# --- malformed point files ------------------------------------------------------------------------


def _ply_binary(header_props: str, n: int, payload: bytes, extra: str = "") -> bytes:
    return (f"ply\nformat binary_little_endian 1.0\nelement vertex {n}\n{header_props}{extra}end_header\n").encode() + payload


@case("ply-list-property-in-vertex", "shape.ply", "list property")
def _(d: Path, t: Trained) -> list[str]:
    props = "property float x\nproperty float y\nproperty float z\nproperty list uchar int idx\n"
    payload = b"".join(struct.pack("<fffBi", 0.1 * i, 0.2, 0.3, 1, i) for i in range(40))
    return corpus._predict_points(d, t, "shape.ply", _ply_binary(props, 40, payload))


@case("ply-face-index-beyond-int64", "shape.ply", "int64")
def _(d: Path, t: Trained) -> list[str]:
    pts = corpus.cloud()
    head = (f"ply\nformat ascii 1.0\nelement vertex {len(pts)}\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 1\nproperty list uchar int vertex_indices\nend_header\n")
    text = head + "".join(f"{x} {y} {z}\n" for x, y, z in pts) + f"3 0 1 {2**70}\n"
    return corpus._predict_points(d, t, "shape.ply", text)


@case("ply-face-index-out-of-range", "shape.ply", "face index out of range")
def _(d: Path, t: Trained) -> list[str]:
    pts = corpus.cloud()
    head = (f"ply\nformat ascii 1.0\nelement vertex {len(pts)}\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 1\nproperty list uchar int vertex_indices\nend_header\n")
    text = head + "".join(f"{x} {y} {z}\n" for x, y, z in pts) + "3 0 1 4000000\n"
    return corpus._predict_points(d, t, "shape.ply", text)


@case("ply-repeated-property", "shape.ply", "repeats a property name")
def _(d: Path, t: Trained) -> list[str]:
    props = "property float x\nproperty float x\nproperty float y\nproperty float z\n"
    return corpus._predict_points(d, t, "shape.ply", _ply_binary(props, 40, b"\x00" * 16 * 40))


@case("pcd-duplicate-fields", "shape.pcd", "repeats a field name")
def _(d: Path, t: Trained) -> list[str]:
    head = "VERSION 0.7\nFIELDS x y z x\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\nWIDTH 40\nHEIGHT 1\nPOINTS 40\nDATA binary\n"
    return corpus._predict_points(d, t, "shape.pcd", head.encode() + b"\x00" * 16 * 40)


@case("pcd-unusual-size", "shape.pcd", "unsupported PCD TYPE/SIZE")
def _(d: Path, t: Trained) -> list[str]:
    head = "VERSION 0.7\nFIELDS x y z\nSIZE 16 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 40\nHEIGHT 1\nPOINTS 40\nDATA binary\n"
    return corpus._predict_points(d, t, "shape.pcd", head.encode() + b"\x00" * 24 * 40)


@case("pcd-size-three", "shape.pcd", "unsupported PCD TYPE/SIZE")
def _(d: Path, t: Trained) -> list[str]:
    head = "VERSION 0.7\nFIELDS x y z\nSIZE 3 4 4\nTYPE I F F\nCOUNT 1 1 1\nWIDTH 40\nHEIGHT 1\nPOINTS 40\nDATA binary\n"
    return corpus._predict_points(d, t, "shape.pcd", head.encode() + b"\x00" * 11 * 40)


@case("envi-unknown-interleave", "scene.hdr", "interleave 'xyz'")
def _(d: Path, t: Trained) -> list[str]:
    cube, gt = make_scene()
    header = corpus.write_envi(d / "scene.hdr", cube)
    header.write_text(header.read_text().replace("interleave = bsq", "interleave = xyz"))
    np.save(d / "gt.npy", gt)
    return train_argv(d, hsi_experiment(d, "scene.hdr", label_path="gt.npy"))


@case("las-scale-zero", "train.las", "scales must be finite and non-zero")
def _(d: Path, t: Trained) -> list[str]:
    root, argv = corpus._tiles(d)
    path = corpus.write_las(root / "train.las")
    raw = bytearray(path.read_bytes())
    raw[131:139] = struct.pack("<d", 0.0)  # x scale factor (LAS 1.2 header offset 131)
    path.write_bytes(bytes(raw))
    return argv


def _patched_las(d: Path, name: str, *patches: tuple[int, str, float]) -> list[str]:
    """A training tile ``name`` with header fields overwritten: (byte offset, struct format, value)."""
    root, argv = corpus._tiles(d, train=name)
    path = corpus.write_las(root / name)
    raw = bytearray(path.read_bytes())
    for offset, fmt, value in patches:
        raw[offset : offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
    path.write_bytes(bytes(raw))
    return argv


# LAS header offsets: number of VLRs 100 (uint32), x scale 131 (double); LAS 1.4: first EVLR 235 (uint64), EVLRs 243 (uint32)
case("las-vlr-count-4e9", "train.las", "4000000000 variable-length records")(
    lambda d, t: _patched_las(d, "train.las", (100, "<I", 4_000_000_000)))  # laspy read records until memory ran out
case("laz-vlr-count-4e9", "train.laz", "4000000000 variable-length records")(
    lambda d, t: _patched_las(d, "train.laz", (100, "<I", 4_000_000_000)))
case("las-scale-overflows-float64", "train.las", "overflow float64")(
    lambda d, t: _patched_las(d, "train.las", (131, "<d", 1e308)))  # was: every point unclassified, exit 0


@case("las14-evlr-count-4e9", "train.las", "4000000000 extended variable-length records")
def _(d: Path, t: Trained) -> list[str]:
    import laspy

    root, argv = corpus._tiles(d)
    path = root / "train.las"
    laspy.convert(laspy.read(corpus.write_las(path)), file_version="1.4", point_format_id=7).write(path)
    raw = bytearray(path.read_bytes())
    raw[235:247] = struct.pack("<QI", len(raw) - 60, 4_000_000_000)
    path.write_bytes(bytes(raw))
    return argv


@case("pcd-count-1e9", "shape.pcd", "points of 4000000008 bytes")
def _(d: Path, t: Trained) -> list[str]:  # was: numpy's record type failed with a traceback
    head = "VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1000000000\nWIDTH 10\nHEIGHT 1\nPOINTS 10\nDATA binary\n"
    return corpus._predict_points(d, t, "shape.pcd", head.encode() + b"\x00" * 120)


@case("predict-npy-shape-overflows", "shape.npy", "cannot read numpy file", "overflow")
def _(d: Path, t: Trained) -> list[str]:  # was: numpy's overflow warning, then the line
    member = io_bytes()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": (2**62, 4)})
    return corpus._predict_points(d, t, "shape.npy", member.getvalue() + b"\x00" * 64)


for _id, _labels, _expect in [("label-file-fractions", np.full(40, 1.5), "non-integer labels (e.g. 1.5)"),
                              ("label-file-nan", np.full(40, np.nan), "non-finite labels"),
                              ("label-file-huge-ids", np.full(40, 2**40, np.int64), "not plausible class ids"),
                              ("label-file-negative-ids", np.full(40, -7, np.int64), "not plausible class ids")]:
    def _build(d: Path, t: Trained, labels: np.ndarray = _labels) -> list[str]:  # were cast to int64 and trained on
        argv = corpus._scenes(d, label_files=["_points.npy", "_labels.npy"])
        for seed, name in enumerate("abc"):
            np.save(d / "scans" / f"{name}_points.npy", corpus.cloud(seed=seed))
            np.save(d / "scans" / f"{name}_labels.npy", labels if name == "a" else np.zeros(40, np.int64))
        return argv

    case(_id, "a_labels.npy", _expect)(_build)


for _id, _value in [("s3dis-coordinate-1e300", "1e300"), ("s3dis-coordinate-1e309", "1e309")]:
    def _build(d: Path, t: Trained, value: str = _value) -> list[str]:
        lines = corpus.s3dis_lines()
        lines[3] = f"{value} 0.5 0.5 10 20 30"
        return corpus._s3dis(d, {"chair_1": lines, "floor_1": corpus.s3dis_lines(seed=4)}, policy="error")

    case(_id, "chair_1.txt")(_build)


# --- runner: every case in this one process (python hardening.py OUT_JSON WORK_DIR) ---------------


class CaseTimeout(BaseException):
    """A case ran past its time limit (BaseException: the command line must not catch it)."""


FINISHED = ("metrics.json", "last.pt", "best.pt")


def finished_outputs(d: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in d.rglob("*"):
        if path.is_file() and (path.name in FINISHED or path.name.startswith("pred.")):
            st = path.stat()
            out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


def run_all(work: Path, ids: list[str] | None = None, limit_s: float = 30.0, with_corpus: bool = False) -> dict[str, dict]:
    """Run the cases (and, ``with_corpus``, those of :mod:`corpus` as ``corpus:<id>``) in this process."""
    import contextlib
    import io
    import signal
    import time

    from sciformer.cli import main

    def on_alarm(signum: int, frame: object) -> None:
        raise CaseTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    trained = Trained(work / "trained")
    results: dict[str, dict] = {}
    cases = [(c.id, c) for c in CASES] + ([(f"corpus:{c.id}", c) for c in corpus.CASES] if with_corpus else [])
    for key, c in cases:
        if ids and key not in ids:
            continue
        d = work / key.replace(":", "_")
        d.mkdir(parents=True)
        argv = c.build(d, trained)
        before = finished_outputs(d)
        err, out = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = main(argv)
        except CaseTimeout:
            code = "timeout"
        except SystemExit as exc:  # argparse errors
            code = exc.code
        except BaseException as exc:
            import traceback

            code = f"raised {type(exc).__name__}"
            err.write(traceback.format_exc())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        after = finished_outputs(d)
        results[key] = {"code": code, "stderr": err.getvalue(), "seconds": time.perf_counter() - start,
                         "maxrss_kib": peak_rss_kib(),
                         "finished": sorted(k for k in after if after[k] != before.get(k))}
        while _HELD:
            _HELD.pop().close()
    return results


def peak_rss_kib() -> int:
    """This process image's peak RSS (VmHWM): unlike ru_maxrss it does not inherit the RSS of
    the parent that forked it (Linux records the pre-exec memory in ru_maxrss)."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    import json
    import sys

    out_json, work = Path(sys.argv[1]), Path(sys.argv[2])
    out_json.write_text(json.dumps(run_all(work, sys.argv[3:] or None, with_corpus=True)))
