"""Property tests: random or damaged input never escapes as a raw exception.

The config parser fed random bytes, text and nested mappings either succeeds or raises
:class:`ConfigError`; every reader fed random bytes, truncations or byte edits of a valid
file either succeeds or raises a :class:`SciformerError` subclass (a one-line message
naming the file), never ``ValueError``/``KeyError``/``struct.error``/``MemoryError``...
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import corpus
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sciformer import config
from sciformer.data.hsi.readers import read_scene
from sciformer.data.pointcloud.io import read_point_file
from sciformer.data.pointcloud.modelnet_layouts import load_h5_layout
from sciformer.errors import ConfigError, SciformerError
from sciformer.utils import yamlio

# SCIFORMER_FUZZ_EXAMPLES=2000 for a deeper run; the default keeps the suite quick.
# Examples are derandomised (the same every run, so CI is repeatable); SCIFORMER_FUZZ_RANDOM=1
# draws new ones each run to hunt for new failures.
EXAMPLES = int(os.environ.get("SCIFORMER_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("SCIFORMER_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _only_sciformer_errors(read: Callable[[], object]) -> None:
    """Run ``read``; success is fine, a SciformerError must be one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # readers may warn (e.g. skipped lines); only exceptions matter here
        try:
            read()
        except SciformerError as exc:
            assert "\n" not in str(exc)


# ----------------------------------------------------------------------------- config


KEYS = ["name", "data", "model", "train", "optimizer", "schedule", "evaluation", "export", "epochs", "batch_size", "lr",
        "source", "patch_size", "split", "kind", "root", "features", "hidden", "device", "monitor", "seed", "betas", "x"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True), st.text(max_size=8),
                    st.sampled_from(["toy_blobs", "toy_mlp", "hsi_scene", "spectral_spatial", "modelnet", "blocks", "cpu"]))
NESTED = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.sampled_from(KEYS), st.integers(0, 3)), inner, max_size=4)),
    max_leaves=12,
)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_config_file_of_random_bytes(work: Path, raw: bytes) -> None:
    path = work / "random.yaml"
    path.write_bytes(raw)
    try:
        config.load(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)


YAML_ALPHABET = st.sampled_from(list("abc:{}[]-,&*!|>'\"#%@` \n\t.01e") + ["!!python/name:os.system", "<<: *a", "&a", "name: toy_blobs\n"])


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.lists(YAML_ALPHABET, max_size=60).map("".join)))
def test_config_text_of_random_yaml(work: Path, text: str) -> None:
    try:
        raw = yamlio.loads(text, source="fuzz.yaml")
        config.validate(raw, base_dir=work, source="fuzz.yaml")
    except ConfigError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(raw=NESTED, overrides=st.lists(st.text(alphabet="abcdeinoprstx.=[]{}:0123456789 ", max_size=20), max_size=3))
def test_config_mapping_of_random_nesting(work: Path, raw: object, overrides: list[str]) -> None:
    if isinstance(raw, dict) and raw:  # also a mapping that starts out valid, with random sections on top
        raw = {"data": {"name": "toy_blobs"}, "model": {"name": "toy_mlp"}, **{str(k): v for k, v in raw.items()}}
    try:
        if isinstance(raw, dict):
            raw = config.apply_overrides(raw, overrides)
        config.validate(raw, base_dir=work, source="fuzz")
    except ConfigError as exc:
        assert "\n" not in str(exc)


# ----------------------------------------------------------------------------- valid seed files


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _lzf_literal(data: bytes) -> bytes:
    """LZF stream of literal runs only (valid input for the PCD decoder)."""
    return b"".join(bytes([len(data[i : i + 32]) - 1]) + data[i : i + 32] for i in range(0, len(data), 32))


def _pcd_compressed(coords: np.ndarray) -> bytes:
    n = len(coords)
    raw = np.ascontiguousarray(coords.T, dtype="<f4").tobytes()  # column-major x..., y..., z...
    packed = _lzf_literal(raw)
    head = (f"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH {n}\nHEIGHT 1\nPOINTS {n}\n"
            "DATA binary_compressed\n").encode()
    return head + np.array([len(packed), len(raw)], "<u4").tobytes() + packed


def _ply_mesh(binary: bool) -> bytes:
    """A unit square as one triangle and one quad (the quad takes the general list path)."""
    fmt = "binary_little_endian" if binary else "ascii"
    head = (f"ply\nformat {fmt} 1.0\nelement vertex 4\nproperty float x\nproperty float y\nproperty float z\n"
            "element face 2\nproperty list uchar int vertex_indices\nend_header\n").encode()
    verts = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], np.float32)
    if not binary:
        return head + b"".join(f"{x} {y} {z}\n".encode() for x, y, z in verts) + b"3 0 1 2\n4 0 1 2 3\n"
    faces = bytes([3]) + np.array([0, 1, 2], "<i4").tobytes() + bytes([4]) + np.array([0, 1, 2, 3], "<i4").tobytes()
    return head + verts.astype("<f4").tobytes() + faces


@pytest.fixture(scope="module")
def seeds(work: Path) -> dict[str, bytes]:
    """Valid files (name -> bytes) that the damage strategies start from."""
    d = work / "seeds"
    d.mkdir()
    cube, gt = corpus.make_scene(h=8, w=8, bands=4)
    pts = corpus.cloud(12)
    corpus.write_mat_v5(d / "v5.mat", cube=cube, gt=gt)
    corpus.write_mat_v73(d / "v73.mat", cube=cube, gt=gt)
    corpus.write_envi(d / "scene.hdr", cube)
    corpus.write_las(d / "tile.las", n=20)
    corpus.write_las(d / "tile.laz", n=20)
    from sciformer.data.pointcloud.io import write_ply

    write_ply(d / "binary.ply", pts, colour=np.full((12, 3), 0.5), label=np.arange(12))
    out = {name: (d / name).read_bytes() for name in ("v5.mat", "v73.mat", "scene.hdr", "scene.img", "tile.las", "tile.laz", "binary.ply")}
    out["cube.npy"] = _npy_bytes(cube)
    out["points.npy"] = _npy_bytes(pts)
    out["ascii.ply"] = corpus.ply_text(pts).encode()
    out["ascii_mesh.ply"] = _ply_mesh(binary=False)
    out["binary_mesh.ply"] = _ply_mesh(binary=True)
    out["binary.pcd"] = corpus.pcd_binary(pts)
    out["compressed.pcd"] = _pcd_compressed(pts)
    out["points.xyz"] = "".join(f"{x:.4f} {y:.4f} {z:.4f} 1\n" for x, y, z in pts).encode()
    out["mesh.off"] = corpus.off_text(np.eye(3), [[0, 1, 2], [2, 1, 0]]).encode()
    return out


def _damaged(seed_name: str) -> st.SearchStrategy[bytes]:
    """Draws a truncation of the seed, a few byte edits of it, or both."""

    @st.composite
    def damaged(draw: st.DrawFn) -> bytes:
        raw = bytearray(SEED_CACHE[seed_name])
        if draw(st.booleans()):  # overwrite a few bytes
            for _ in range(draw(st.integers(1, 4))):
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        if draw(st.booleans()):  # cut the tail
            raw = raw[: draw(st.integers(0, len(raw)))]
        return bytes(raw)

    return damaged()


SEED_CACHE: dict[str, bytes] = {}


@pytest.fixture(autouse=True, scope="module")
def _fill_seed_cache(seeds: dict[str, bytes]) -> None:
    SEED_CACHE.update(seeds)


# ----------------------------------------------------------------------------- scene readers

@FUZZ
@given(suffix=st.sampled_from([".mat", ".npy", ".npz", ".hdr", ".lan", ".img"]), raw=st.binary(max_size=400))
def test_read_scene_random_bytes(work: Path, suffix: str, raw: bytes) -> None:
    path = work / f"random{suffix}"
    path.write_bytes(raw)
    if suffix == ".hdr":
        (work / "random.img").write_bytes(raw[::-1])
    _only_sciformer_errors(lambda: read_scene(path, labels="optional"))


@FUZZ
@given(data=st.data(), seed_name=st.sampled_from(["v5.mat", "v73.mat", "cube.npy"]))
def test_read_scene_damaged_file(work: Path, data: st.DataObject, seed_name: str) -> None:
    path = work / f"damaged{Path(seed_name).suffix}"
    path.write_bytes(data.draw(_damaged(seed_name)))
    _only_sciformer_errors(lambda: read_scene(path, labels="optional"))


@FUZZ
@given(data=st.data(), part=st.sampled_from(["scene.hdr", "scene.img"]))
def test_read_scene_damaged_envi_pair(work: Path, data: st.DataObject, part: str) -> None:
    d = work / "envi"
    d.mkdir(exist_ok=True)
    for name in ("scene.hdr", "scene.img"):
        (d / name).write_bytes(data.draw(_damaged(name)) if name == part else SEED_CACHE[name])
    _only_sciformer_errors(lambda: read_scene(d / "scene.hdr", labels="optional"))


# ----------------------------------------------------------------------------- point readers

POINT_SUFFIXES = [".ply", ".pcd", ".xyz", ".txt", ".off", ".las", ".laz", ".npy", ".npz", ".csv"]
POINT_SEEDS = ["binary.ply", "ascii.ply", "binary_mesh.ply", "ascii_mesh.ply", "binary.pcd", "compressed.pcd", "points.xyz", "mesh.off", "tile.las", "tile.laz", "points.npy"]


@FUZZ
@given(suffix=st.sampled_from(POINT_SUFFIXES), raw=st.binary(max_size=400))
def test_read_point_file_random_bytes(work: Path, suffix: str, raw: bytes) -> None:
    path = work / f"random_points{suffix}"
    path.write_bytes(raw)
    _only_sciformer_errors(lambda: read_point_file(path))


@settings(FUZZ, max_examples=2 * EXAMPLES)
@given(data=st.data(), seed_name=st.sampled_from(POINT_SEEDS))
def test_read_point_file_damaged_file(work: Path, data: st.DataObject, seed_name: str) -> None:
    path = work / f"damaged_points{Path(seed_name).suffix}"
    path.write_bytes(data.draw(_damaged(seed_name)))
    _only_sciformer_errors(lambda: read_point_file(path))


@FUZZ
@given(header=st.sampled_from(["ply\nformat ascii 1.0\n", "ply\nformat binary_little_endian 1.0\n", "OFF\n", "VERSION 0.7\n"]),
       body=st.text(alphabet="elmnt vrxyzpoty fladucshi0123456789-.\nFIELDSZETPCOUNWHGAbary_", max_size=200),
       suffix=st.sampled_from([".ply", ".off", ".pcd"]))
def test_read_point_file_random_headers(work: Path, header: str, body: str, suffix: str) -> None:
    path = work / f"headers{suffix}"
    path.write_text(header + body)
    _only_sciformer_errors(lambda: read_point_file(path))


# ----------------------------------------------------------------------------- ModelNet h5


@pytest.fixture(scope="module")
def modelnet_root(work: Path) -> Path:
    root = corpus.write_modelnet_h5(work / "modelnet", per_class=(2, 1), points=8)
    SEED_CACHE["modelnet.h5"] = (root / "ply_data_train0.h5").read_bytes()
    return root


@FUZZ
@given(data=st.data(), random=st.booleans())
def test_modelnet_h5_random_or_damaged(modelnet_root: Path, data: st.DataObject, random: bool) -> None:
    root = modelnet_root
    raw = data.draw(st.binary(max_size=600)) if random else data.draw(_damaged("modelnet.h5"))
    (root / "ply_data_train0.h5").write_bytes(raw)
    _only_sciformer_errors(lambda: load_h5_layout(root, want_normals=False))
