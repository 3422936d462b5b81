"""Readers: round trips through every supported format, key detection, errors."""

from __future__ import annotations

import struct

import h5py
import numpy as np
import pytest
import scipy.io
from synthetic import eio_link

from sciformer.data.hsi.readers import list_arrays, read_labels, read_scene
from sciformer.errors import DataError, SciformerError


def write_mat73(path, arrays: dict[str, np.ndarray]) -> None:
    """Write a MATLAB v7.3 file the way MATLAB does: HDF5 with a 512-byte MATLAB header
    in the user block, every array stored with its axes reversed, ``MATLAB_class`` set."""
    classes = {
        np.dtype("float64"): "double", np.dtype("float32"): "single", np.dtype("uint8"): "uint8",
        np.dtype("uint16"): "uint16", np.dtype("int16"): "int16", np.dtype("int32"): "int32",
        np.dtype("int64"): "int64",
    }
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, arr in arrays.items():
            ds = f.create_dataset(name, data=np.ascontiguousarray(arr.T))  # column-major on disk
            ds.attrs["MATLAB_class"] = np.bytes_(classes[arr.dtype])
        f.create_dataset("note", data=np.frombuffer(b"hello", dtype=np.uint8).astype(np.uint16))
        f["note"].attrs["MATLAB_class"] = np.bytes_("char")
    text = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    header = text.ljust(116, b" ") + b"\x00" * 8 + struct.pack("<H", 0x0200) + b"IM"
    with open(path, "r+b") as fh:
        fh.write(header.ljust(512, b"\x00"))


def write_lan(path, cube: np.ndarray) -> None:
    """Write an ERDAS 7.4 .lan file (HEAD74, 16-bit, band-interleaved by line)."""
    h, w, b = cube.shape
    header = bytearray(128)
    header[0:6] = b"HEAD74"
    header[6:10] = struct.pack("<hh", 2, b)  # packing 2 = 16-bit, number of bands
    header[16:32] = struct.pack("<iiii", w, h, 0, 0)  # columns, rows, x, y
    data = np.ascontiguousarray(cube.astype("<i2").transpose(0, 2, 1))  # (H, B, W) = BIL
    with open(path, "wb") as fh:
        fh.write(bytes(header))
        fh.write(data.tobytes())


@pytest.fixture
def uint_scene(scene_factory):
    cube, gt, wl = scene_factory(h=21, w=17, bands=6)
    return np.clip(cube, 0, None).astype(np.uint16), gt, wl


def test_mat_v5_round_trip_auto_keys(tmp_path, uint_scene):
    cube, gt, wl = uint_scene
    p = tmp_path / "scene.mat"
    scipy.io.savemat(p, {"paviaU": cube, "paviaU_gt": gt.astype(np.uint8), "wavelength": wl})
    s = read_scene(p)
    assert s.cube.shape == (21, 17, 6) and s.cube.dtype == np.uint16
    np.testing.assert_array_equal(s.cube, cube)
    np.testing.assert_array_equal(s.gt, gt)
    assert s.gt.dtype == np.int64
    np.testing.assert_allclose(s.wavelengths, wl)
    assert s.meta["image_key"] == "paviaU"


def test_mat_v73_matlab_transposition(tmp_path, uint_scene):
    cube, gt, _ = uint_scene  # H != W != B so any axis mix-up shows
    p = tmp_path / "scene73.mat"
    write_mat73(p, {"img": cube, "labels": gt.astype(np.float64)})  # MATLAB often stores labels as double
    with h5py.File(p, "r") as f:
        assert f["img"].shape == (6, 17, 21)  # on disk: reversed axes
    s = read_scene(p)
    assert s.cube.shape == (21, 17, 6)
    np.testing.assert_array_equal(s.cube, cube)
    np.testing.assert_array_equal(s.gt, gt)
    assert list_arrays(p) == {"img": (21, 17, 6), "labels": (21, 17)}  # 'note' (char) skipped


def test_envi_round_trip_with_wavelengths_and_label_file(tmp_path, uint_scene):
    import spectral.io.envi as envi

    cube, gt, wl = uint_scene
    meta = {"wavelength": [f"{w:.3f}" for w in wl]}
    envi.save_image(str(tmp_path / "cube.hdr"), cube, interleave="bil", metadata=meta)
    names = ["Unclassified", "a", "b", "c", "d"]
    envi.save_classification(str(tmp_path / "gt.hdr"), gt.astype(np.uint8), class_names=names)
    for image_path in (tmp_path / "cube.hdr", tmp_path / "cube.img"):  # header or data file
        s = read_scene(image_path, label_path=tmp_path / "gt.hdr")
        np.testing.assert_array_equal(s.cube, cube)
        assert s.cube.dtype == np.uint16
        np.testing.assert_array_equal(s.gt, gt)
        np.testing.assert_allclose(s.wavelengths, np.round(wl, 3))
        assert s.class_names == ["a", "b", "c", "d"]


def test_envi_bad_band_list(tmp_path, uint_scene):
    import spectral.io.envi as envi

    cube, _, wl = uint_scene
    flags = ["1"] * cube.shape[2]
    flags[1] = "0.0"  # written as a float by some tools
    envi.save_image(str(tmp_path / "cube.hdr"), cube, metadata={"wavelength": [f"{w:.3f}" for w in wl], "bbl": flags})
    np.testing.assert_array_equal(read_scene(tmp_path / "cube.hdr", labels="none").meta["bad_bands"],
                                  [f == "0.0" for f in flags])
    envi.save_image(str(tmp_path / "short.hdr"), cube, metadata={"bbl": flags[:-1]})
    with pytest.raises(DataError, match=rf"short.hdr: header field 'bbl' lists {cube.shape[2] - 1} values for {cube.shape[2]} bands"):
        read_scene(tmp_path / "short.hdr", labels="none")
    envi.save_image(str(tmp_path / "plain.hdr"), cube)
    assert "bad_bands" not in read_scene(tmp_path / "plain.hdr", labels="none").meta


@pytest.mark.parametrize("encoding", ["utf-8-sig", "cp1252", "latin-1"])
def test_envi_headers_with_bom_or_code_page(tmp_path, uint_scene, encoding):
    """ENVI on Windows writes the system code page, editors add a BOM: both read like UTF-8."""
    import spectral.io.envi as envi

    from sciformer.data.hsi.wavelengths import read_wavelength_spec

    cube, gt, wl = uint_scene
    meta = {"wavelength": [f"{w:.3f}" for w in wl], "description": "Sensor \u00b5m \u00e9t\u00e9"}
    envi.save_image(str(tmp_path / "cube.hdr"), cube, interleave="bsq", metadata=meta)
    names = ["Unclassified", "B\u00e4ume", "a", "b", "c"]
    envi.save_classification(str(tmp_path / "gt.hdr"), gt.astype(np.uint8), class_names=names)
    for hdr in ("cube.hdr", "gt.hdr"):  # spectral wrote UTF-8; re-encode the headers
        path = tmp_path / hdr
        raw = path.read_text(encoding="utf-8").encode(encoding)
        assert raw != path.read_bytes()  # the case under test: not plain UTF-8 any more
        path.write_bytes(raw)
    for image_path in (tmp_path / "cube.hdr", tmp_path / "cube.img"):
        s = read_scene(image_path, label_path=tmp_path / "gt.hdr")
        np.testing.assert_array_equal(s.cube, cube)
        np.testing.assert_array_equal(s.gt, gt)
        np.testing.assert_allclose(s.wavelengths, np.round(wl, 3))
        assert s.class_names == ["B\u00e4ume", "a", "b", "c"]
    np.testing.assert_allclose(read_wavelength_spec(str(tmp_path / "cube.hdr")), np.round(wl, 3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cube.hdr", "cube.img", "gt.hdr", "gt.img"]  # nothing left beside them


def test_lan_round_trip(tmp_path, uint_scene):
    cube, _, _ = uint_scene
    cube = cube.astype(np.int16)
    p = tmp_path / "scene.lan"
    write_lan(p, cube)
    s = read_scene(p)
    np.testing.assert_array_equal(s.cube, cube)
    assert s.gt is None


def test_npy_and_npz(tmp_path, uint_scene):
    cube, gt, _ = uint_scene
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", gt.astype(np.uint8))
    s = read_scene(tmp_path / "cube.npy", label_path=tmp_path / "gt.npy")
    np.testing.assert_array_equal(s.cube, cube)
    np.testing.assert_array_equal(s.gt, gt)
    np.savez(tmp_path / "both.npz", data=cube, truth=gt.astype(np.int32))
    s = read_scene(tmp_path / "both.npz")
    np.testing.assert_array_equal(s.gt, gt)
    np.testing.assert_array_equal(read_labels(tmp_path / "gt.npy", shape=(21, 17)), gt)


def test_largest_cube_wins_and_named_keys(tmp_path, uint_scene):
    cube, gt, _ = uint_scene
    small = cube[:5, :5, :2]
    p = tmp_path / "two.mat"
    scipy.io.savemat(p, {"thumb": small, "big": cube, "gt": gt.astype(np.uint8), "labels": (gt > 1).astype(np.uint8)})
    with pytest.raises(DataError, match="several candidate label maps.*gt.*labels"):
        read_scene(p)
    s = read_scene(p, label_key="labels")
    np.testing.assert_array_equal(s.cube, cube)
    np.testing.assert_array_equal(s.gt, (gt > 1).astype(np.int64))
    s = read_scene(p, image_key="thumb", labels="none")
    assert s.cube.shape == (5, 5, 2) and s.gt is None


def test_ambiguous_cubes_error_lists_keys(tmp_path, uint_scene):
    cube, _, _ = uint_scene
    p = tmp_path / "amb.mat"
    scipy.io.savemat(p, {"a": cube, "b": cube + 1})
    with pytest.raises(DataError, match=r"a, b.*image_key"):
        read_scene(p)


def test_missing_key_lists_available(tmp_path, uint_scene):
    cube, gt, _ = uint_scene
    p = tmp_path / "k.mat"
    scipy.io.savemat(p, {"cube": cube, "gt": gt.astype(np.uint8)})
    with pytest.raises(DataError) as e:
        read_scene(p, image_key="indian_pines")
    msg = str(e.value)
    assert "indian_pines" in msg and "cube (21, 17, 6)" in msg and "gt (21, 17)" in msg and str(p) in msg
    with pytest.raises(DataError, match="label_key 'nope' not found"):
        read_scene(p, label_key="nope")


def test_size_mismatch_names_both_files(tmp_path, uint_scene):
    cube, gt, _ = uint_scene
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", gt[:-1].astype(np.uint8))
    with pytest.raises(DataError, match=r"gt.npy.*20 x 17.*cube.npy is 21 x 17"):
        read_scene(tmp_path / "cube.npy", label_path=tmp_path / "gt.npy")


def test_nan_in_cube(tmp_path, uint_scene):
    cube = uint_scene[0].astype(np.float32)
    cube[3, 4, 1] = np.nan
    cube[0, 0, 0] = np.inf
    np.save(tmp_path / "nan.npy", cube)
    from sciformer.data.hsi.nodata import nodata_pixels

    scene = read_scene(tmp_path / "nan.npy")  # NaN / Inf pixels are no-data, read as they are
    assert np.argwhere(nodata_pixels(scene.cube)).tolist() == [[0, 0], [3, 4]]


def test_non_integer_labels_rejected(tmp_path, uint_scene):
    cube, gt, _ = uint_scene
    p = tmp_path / "f.mat"
    scipy.io.savemat(p, {"cube": cube, "gt": gt + 0.5})
    assert read_scene(p).gt is None  # a non-integral float map is not a label candidate
    with pytest.raises(DataError, match="non-integer"):
        read_scene(p, label_key="gt")
    with pytest.raises(DataError, match="no 2-D integer label map of size 21 x 17"):
        read_scene(p, labels="required")


def test_negative_labels_rejected(tmp_path, uint_scene):
    cube, gt, _ = uint_scene
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", gt - 1)
    with pytest.raises(DataError, match="negative"):
        read_scene(tmp_path / "c.npy", label_path=tmp_path / "g.npy")


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("broken.mat", b"this is not a mat file at all" * 4, "not a readable MATLAB"),
        ("broken.npy", b"\x93NUMPY garbage", "not a readable .npy"),
        ("broken.hdr", b"not an envi header", "not a readable ENVI"),
        ("broken.lan", b"XXXXXX" + b"\x00" * 200, "not a readable ERDAS"),
        ("scene.tif", b"II*\x00", "not a readable GeoTIFF"),
        ("scene.jpg", b"\xff\xd8\xff", "unsupported file type '.jpg'"),
    ],
)
def test_unreadable_files(tmp_path, name, content, pattern):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(DataError, match=pattern) as e:
        read_scene(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert isinstance(e.value, SciformerError)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_scene(tmp_path / "nothing.mat")


def test_a_read_that_fails_in_the_os_is_a_data_error_naming_the_file(tmp_path):
    """h5py's probe of a .mat file failing with EIO escaped as its own OSError paragraph."""
    path = eio_link(tmp_path, "scene.mat")
    with pytest.raises(DataError, match=r"scene\.mat: cannot read \(Input/output error\)") as e:
        read_scene(path)
    assert "\n" not in str(e.value)


def test_2d_image_rejected(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((4, 5), dtype=np.float32))
    with pytest.raises(DataError, match=r"no 3-D \(H, W, B\) array"):
        read_scene(tmp_path / "flat.npy")


def test_npy_without_the_numpy_magic_is_not_called_pickled(tmp_path):
    """A cube .npy that is random bytes is 'not a .npy file' (numpy's message called it pickled
    data and advised allow_pickle); an object array is refused as Python objects."""
    (tmp_path / "cube.npy").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(DataError, match=r"cube.npy: not a .npy file \(no NumPy header\)$"):
        read_scene(tmp_path / "cube.npy")
    np.save(tmp_path / "obj.npy", np.array([[None]], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match=r"obj.npy: the array holds Python objects") as e:
        read_scene(tmp_path / "obj.npy")
    assert "allow_pickle" not in str(e.value)


def test_envi_byte_order_other_than_0_or_1_is_refused(tmp_path):
    """'byte order = 7' was read as big-endian: garbage values, then an error naming neither file nor cause."""
    np.arange(2 * 3 * 4, dtype="<f4").tofile(tmp_path / "c.img")
    (tmp_path / "c.hdr").write_text("ENVI\nsamples = 3\nlines = 2\nbands = 4\nheader offset = 0\ndata type = 4\n"
                                    "interleave = bsq\nbyte order = 7\n")
    with pytest.raises(DataError, match=r"c.hdr: ENVI 'byte order = 7' is not 0 \(little-endian\) or 1 \(big-endian\)$"):
        read_scene(tmp_path / "c.hdr")


def test_npz_cube_beside_an_object_member_loads_and_the_member_is_refused_when_named(tmp_path):
    """np.savez(cube, gt, meta=<dict>) was refused whole ('[meta]: the array holds Python objects');
    the cube loads, and only naming 'meta' as a key is refused, in one line."""
    cube = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    gt = (np.arange(20).reshape(4, 5) % 3 + 1).astype(np.uint8)
    np.savez_compressed(tmp_path / "s.npz", cube=cube, gt=gt, meta=np.array({"sensor": "AVIRIS"}, dtype=object))
    scene = read_scene(tmp_path / "s.npz", "cube", "gt", labels="required")
    np.testing.assert_array_equal(scene.cube, cube)
    with pytest.raises(DataError, match=r"s.npz \[meta\]: the array holds Python objects") as e:
        read_scene(tmp_path / "s.npz", "meta")
    assert "\n" not in str(e.value)


def test_mat73_never_written_placeholder_beside_the_cube_is_listed_and_refused_only_when_read(tmp_path):
    """A never-written contiguous 'pred' (20000, 20000) u1 beside the cube refused the whole file at
    listing ('[pred] ... stored in 0 B'); the cube reads, and loading 'pred' or a never-written cube
    is still refused before allocating."""
    cube = np.arange(5 * 4 * 3, dtype=np.float32).reshape(5, 4, 3)  # on disk (B, W, H)
    path = tmp_path / "s.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("cube", data=cube)
        f.create_dataset("gt", data=np.ones((4, 3), np.uint8))
        f.create_dataset("pred", shape=(20000, 20000), dtype="u1")  # placeholder, never written
    scene = read_scene(path, "cube", "gt", labels="required")
    np.testing.assert_array_equal(scene.cube, cube.T)
    with pytest.raises(DataError, match=r"s.mat \[pred\]: array of .* is stored in 0 B"):
        read_labels(path, "pred")
    with h5py.File(tmp_path / "bomb.mat", "w", userblock_size=512) as f:
        f.create_dataset("cube", shape=(200, 1000, 1000), dtype="f4")
    with pytest.raises(DataError, match=r"bomb.mat \[cube\]: array of 762.9 MiB is stored in 0 B"):
        read_scene(tmp_path / "bomb.mat", labels="none")
