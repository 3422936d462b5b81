"""Hardening cases (:mod:`hardening`): decompression bombs and absurd declared sizes, non-integer
and absurd labels, malformed point files."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import corpus
import numpy as np
from corpus import Trained, hsi_experiment, make_scene, train_argv, write_mat_v5
from hardening_cases_runs import case

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
