"""Band centres from ENVI headers (with units), .mat keys and the YAML, always in nm.

Oracles: headers are written here as plain text (not by the reader's library), so the
expected centres are the numbers typed into them times the unit's factor; the real crops
are checked against the band centres their data README publishes and against a direct
``scipy.io.loadmat`` of the stored array.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from synthetic import make_hsi_scene

from sciformer import config
from sciformer.contracts import BuildContext
from sciformer.data.hsi.georef import georef_from_envi_header
from sciformer.data.hsi.readers import read_labels, read_scene
from sciformer.data.hsi.task import build_hsi_scene
from sciformer.data.hsi.wavelengths import describe, given_nanometres, read_wavelength_spec, to_nanometres
from sciformer.errors import ConfigError, DataError


def write_envi_text(folder: Path, cube: np.ndarray, extra: str) -> Path:
    """An ENVI float32 BSQ pair written by hand: ``extra`` holds the header's wavelength lines."""
    h, w, b = cube.shape
    header = folder / "cube.hdr"
    header.write_text(f"ENVI\nsamples = {w}\nlines = {h}\nbands = {b}\nheader offset = 0\nfile type = ENVI Standard\n"
                      f"data type = 4\ninterleave = bsq\nbyte order = 0\n{extra}")
    np.ascontiguousarray(cube.astype("<f4").transpose(2, 0, 1)).tofile(folder / "cube.img")  # (B, H, W)
    return header


def braces(values: np.ndarray, fmt: str = "{:.4f}") -> str:
    return "{" + ", ".join(fmt.format(v) for v in values) + "}"


@pytest.mark.parametrize(("units", "factor"), [("Nanometers", 1.0), ("nm", 1.0), ("Micrometers", 1e3), ("um", 1e3),
                                               ("µm", 1e3), ("micrometres", 1e3), ("Millimeters", 1e6), ("MM", 1e6)])
def test_envi_header_units_become_nanometres(tmp_path: Path, units: str, factor: float) -> None:
    cube, _, wl_nm = make_hsi_scene(h=6, w=5, bands=7, classes=2, block=2)
    written = wl_nm / factor  # what the header says, in its units
    header = write_envi_text(tmp_path, cube, f"wavelength units = {units}\nwavelength = {braces(written, '{:.9g}')}\n"
                                             f"fwhm = {braces(np.full(7, 10.0) / factor, '{:.9g}')}\n")
    scene = read_scene(header, labels="none")
    np.testing.assert_allclose(scene.wavelengths, wl_nm, rtol=1e-8)
    np.testing.assert_allclose(scene.meta["fwhm"], np.full(7, 10.0), rtol=1e-8)
    np.testing.assert_array_equal(scene.cube, cube.astype(np.float32))


def test_envi_header_without_units_is_read_by_magnitude(tmp_path: Path) -> None:
    cube, _, wl_nm = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    (tmp_path / "um").mkdir()
    (tmp_path / "nm").mkdir()
    in_um = read_scene(write_envi_text(tmp_path / "um", cube, f"wavelength = {braces(wl_nm / 1000)}\n"), labels="none")
    np.testing.assert_allclose(in_um.wavelengths, np.round(wl_nm / 1000, 4) * 1000)  # all < 30: micrometres
    in_nm = read_scene(write_envi_text(tmp_path / "nm", cube, f"wavelength = {braces(wl_nm)}\n"), labels="none")
    np.testing.assert_allclose(in_nm.wavelengths, np.round(wl_nm, 4))


def test_envi_header_wavenumbers_index_and_bad_units(tmp_path: Path) -> None:
    np.testing.assert_allclose(to_nanometres([10000.0, 1000.0], "Wavenumber", "x"), [1000.0, 10000.0])  # 1e7 / cm^-1
    assert to_nanometres([1, 2, 3], "Index", "x") is None  # band numbers, not centres
    cube, _, wl = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    header = write_envi_text(tmp_path, cube, f"wavelength units = furlongs\nwavelength = {braces(wl)}\n")
    with pytest.raises(DataError, match=r"wavelength units 'furlongs' not understood; expected one of Nanometers") as err:
        read_scene(header, labels="none")
    assert "\n" not in str(err.value)
    header.write_text(header.read_text().replace("furlongs", "Index"))
    assert read_scene(header, labels="none").wavelengths is None


def test_envi_header_with_a_wrong_count_or_bad_values_is_refused(tmp_path: Path) -> None:
    cube, _, wl = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    header = write_envi_text(tmp_path, cube, f"wavelength units = nm\nwavelength = {braces(wl[:4])}\n")
    with pytest.raises(DataError, match="4 wavelengths for a cube of 5 bands"):
        read_scene(header, labels="none")
    bad = wl.copy()
    bad[2] = -1.0
    header = write_envi_text(tmp_path, cube, f"wavelength units = nm\nwavelength = {braces(bad)}\n")
    with pytest.raises(DataError, match="wavelengths must be positive"):
        read_scene(header, labels="none")


def test_mat_wavelength_key(tmp_path: Path) -> None:
    cube, gt, wl = make_hsi_scene(h=6, w=5, bands=7, classes=2, block=2)
    path = tmp_path / "scene.mat"
    scipy.io.savemat(path, {"cube": cube, "gt": gt.astype(np.uint8), "centres_um": (wl / 1000)[:, None],
                            "short": wl[:3]})
    assert read_scene(path).wavelengths is None  # 'centres_um' is not named like a wavelength array
    np.testing.assert_allclose(read_scene(path, wavelength_key="centres_um").wavelengths, wl)  # micrometres -> nm
    with pytest.raises(DataError, match=r"wavelength_key\): 3 values for a cube of 7 bands"):
        read_scene(path, wavelength_key="short")
    with pytest.raises(DataError, match="wavelength_key 'nope' not found; available keys: cube"):
        read_scene(path, wavelength_key="nope")


def write_yaml_scene(tmp_path: Path, bands: int = 6, **mat: np.ndarray) -> np.ndarray:
    cube, gt, wl = make_hsi_scene(h=12, w=12, bands=bands, classes=2, block=3)
    scipy.io.savemat(tmp_path / "scene.mat", {"cube": cube, "gt": gt.astype(np.uint8), **mat})
    return wl


def build_yaml(tmp_path: Path, *overrides: str):
    raw = {"data": {"name": "hsi_scene", "source": "scene.mat", "patch_size": 3,
                    "split": {"kind": "stratified", "train_per_class": 5}},
           "model": {"name": "spectral_spatial", "dim": 16, "depth": 1, "num_heads": 2}}
    exp = config.from_dict(raw, tmp_path, list(overrides))
    return build_hsi_scene(exp.data_params, BuildContext(base_dir=tmp_path))


def test_yaml_wavelengths_reach_the_task_and_checkpoint_state(tmp_path: Path) -> None:
    wl = write_yaml_scene(tmp_path)
    task = build_yaml(tmp_path, f"data.wavelengths=[{','.join(f'{w:.6f}' for w in wl)}]")
    np.testing.assert_allclose(task.info.wavelengths, wl, atol=1e-6)
    np.testing.assert_allclose(task.state()["wavelengths"].numpy(), wl, atol=1e-3)  # float32 in the checkpoint
    assert build_yaml(tmp_path).info.wavelengths is None  # the .mat carries none


@pytest.mark.parametrize(("value", "message"), [
    ("[400, .nan, 500]", "data.wavelengths.*finite"),
    ("[400, -5, 500]", "data.wavelengths.*must be positive"),
    ("[0.4, 0.5, 0.6]", "data.wavelengths.*look like micrometres"),
    ("[]", "data.wavelengths.*no wavelengths given"),
])
def test_yaml_wavelengths_are_validated_when_the_config_loads(tmp_path: Path, value: str, message: str) -> None:
    write_yaml_scene(tmp_path)
    with pytest.raises(ConfigError, match=message) as err:
        build_yaml(tmp_path, f"data.wavelengths={value}")
    assert "\n" not in str(err.value)


def test_yaml_wavelengths_count_and_disagreement_with_the_file(tmp_path: Path) -> None:
    wl = write_yaml_scene(tmp_path, wavelength=wl_of(6))
    listing = ",".join(f"{w:.4f}" for w in wl)
    with pytest.raises(ConfigError, match="data.wavelengths: 5 wavelengths for .*scene.mat, a cube of 6 bands"):
        build_yaml(tmp_path, f"data.wavelengths=[{','.join(f'{w:.4f}' for w in wl[:5])}]")
    shifted = ",".join(f"{w + 7:.4f}" for w in wl)
    with pytest.raises(ConfigError, match=r"data.wavelengths differ from the band centres .*scene.mat carries .*remove"):
        build_yaml(tmp_path, f"data.wavelengths=[{shifted}]")
    task = build_yaml(tmp_path, f"data.wavelengths=[{listing}]")  # the same centres: accepted
    np.testing.assert_allclose(task.info.wavelengths, wl, atol=1e-3)


def wl_of(bands: int) -> np.ndarray:
    return make_hsi_scene(h=12, w=12, bands=bands, classes=2, block=3)[2]


def test_wavelength_spec_forms(tmp_path: Path) -> None:
    wl = np.array([450.5, 550.25, 650.0])
    np.testing.assert_allclose(read_wavelength_spec("450.5, 550.25,650"), wl)
    (tmp_path / "wl.txt").write_text("450.5\n550.25\n650\n")
    np.testing.assert_allclose(read_wavelength_spec(str(tmp_path / "wl.txt")), wl)
    np.save(tmp_path / "wl.npy", wl)
    np.testing.assert_allclose(read_wavelength_spec(str(tmp_path / "wl.npy")), wl)
    (tmp_path / "other.hdr").write_text("ENVI\nwavelength units = Micrometers\nwavelength = {0.4505, 0.55025, 0.65}\n")
    np.testing.assert_allclose(read_wavelength_spec(str(tmp_path / "other.hdr")), wl)
    many = np.arange(300) * 7.5 + 400.0  # a long inline list is not mistaken for a file name
    np.testing.assert_allclose(read_wavelength_spec(",".join(f"{w:g}" for w in many)), many)
    with pytest.raises(DataError, match="neither a file nor a comma-separated list"):
        read_wavelength_spec("missing.txt")
    with pytest.raises(DataError, match="look like micrometres"):
        given_nanometres([0.45, 0.55], None, "--wavelengths")


# ----------------------------------------------------------------------------- real crops

# Published in the data folder's README (band centres in nm): count, first, last.
PUBLISHED = {"aviris_crop_224bands.mat": (224, 365.9, 2496.2, "hsi_img"),
             "muufl_crop_72bands.mat": (72, 367.7, 1043.4, "hsi_img_sub")}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_real_crops_give_their_published_band_centres(data_root: Path, name: str) -> None:
    count, first, last, key = PUBLISHED[name]
    path = data_root / "hsi_wavelengths" / name
    scene = read_scene(path, labels="none")
    assert scene.meta["image_key"] == key and scene.num_bands == count
    assert scene.wavelengths is not None and scene.wavelengths.shape == (count,)
    assert round(float(scene.wavelengths[0]), 1) == first and round(float(scene.wavelengths[-1]), 1) == last
    np.testing.assert_array_equal(scene.wavelengths, scipy.io.loadmat(path)["wavelengths"].ravel())


def test_real_crop_as_envi_in_micrometres(data_root: Path, tmp_path: Path) -> None:
    """The AVIRIS crop's centres written into an ENVI header in micrometres come back in nm."""
    raw = scipy.io.loadmat(data_root / "hsi_wavelengths" / "aviris_crop_224bands.mat")
    cube, wl = raw["hsi_img"][:10, :12].astype(np.float32), raw["wavelengths"].ravel()
    header = write_envi_text(tmp_path, cube, f"wavelength units = Micrometers\nwavelength = {braces(wl / 1000, '{:.7f}')}\n")
    typed = np.array([float(v) for v in re.findall(r"[0-9.]+", header.read_text().split("wavelength =")[1])])  # (224,)
    scene = read_scene(header, labels="none")
    np.testing.assert_allclose(scene.wavelengths, typed * 1000, rtol=1e-12)
    np.testing.assert_allclose(scene.wavelengths, wl, atol=1e-4)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_envi_header_with_a_trailing_comma_and_braced_units(tmp_path: Path, newline: str) -> None:
    cube, _, wl_nm = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    extra = f"wavelength units = {{Micrometers}}\nwavelength = {{\n {', '.join(f'{v / 1000:.6f}' for v in wl_nm)},\n}}\n"
    header = write_envi_text(tmp_path, cube, extra)
    header.write_bytes(header.read_text().replace("\n", newline).encode())
    np.testing.assert_allclose(read_scene(header, labels="none").wavelengths, np.round(wl_nm / 1000, 6) * 1000)
    np.testing.assert_allclose(read_wavelength_spec(str(header)), np.round(wl_nm / 1000, 6) * 1000)


@pytest.mark.parametrize("field", ["{400nm, 500, 600, 700, 800}", "{}", "{400, , 600, 700, 800}"])
def test_envi_header_wavelengths_that_are_not_numbers_are_refused_not_dropped(tmp_path: Path, field: str) -> None:
    cube, _, _ = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    header = write_envi_text(tmp_path, cube, f"wavelength units = nm\nwavelength = {field}\n")
    with pytest.raises(DataError, match=r"header field 'wavelength'.*not a number") as err:
        read_scene(header, labels="none")
    assert "\n" not in str(err.value)


def test_oversized_header_or_centre_list_is_refused_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sciformer.data.hsi.wavelengths as wavelengths

    monkeypatch.setattr(wavelengths, "MAX_TEXT_BYTES", 4096)
    cube, _, _ = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    header = write_envi_text(tmp_path, cube, "wavelength units = nm\nwavelength = {" + ", ".join(["400.5"] * 1000) + "}\n")
    for read in (lambda: read_scene(header, labels="none"), lambda: read_wavelength_spec(str(header))):
        with pytest.raises(DataError, match=r"bytes; .* at most 4096"):
            read()
    listing = tmp_path / "centres.txt"  # was read whole, then cut at 1e6 characters (possibly inside a number)
    listing.write_text("\n".join(f"{400 + i * 0.25:.2f}" for i in range(1000)))
    with pytest.raises(DataError, match=r"bytes; .* at most 4096"):
        read_wavelength_spec(str(listing))


def test_one_inline_band_centre_for_a_one_band_cube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    np.testing.assert_allclose(read_wavelength_spec("550.5"), [550.5])  # no separator, and no file of that name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "600").write_text("610, 620\n")  # an existing file of that name stays a file
    np.testing.assert_allclose(read_wavelength_spec("600"), [610.0, 620.0])


def test_a_header_the_envi_library_cannot_parse_prints_nothing_of_its_own(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cube, _, wl_nm = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    header = write_envi_text(tmp_path, cube, f"wavelength units = nm\nwavelength = {{{', '.join(f'{v:.2f}' for v in wl_nm)},}}\n")
    capfd.readouterr()
    np.testing.assert_allclose(read_scene(header, labels="none").wavelengths, np.round(wl_nm, 2))
    assert capfd.readouterr().err == ""  # its 'Unable to parse' warning would be a second stderr line beside an error


def test_mixed_case_header_keys_are_read_without_a_warning(tmp_path: Path) -> None:
    import warnings

    cube, _, wl_nm = make_hsi_scene(h=4, w=4, bands=5, classes=2, block=2)
    header = write_envi_text(tmp_path, cube, f"Wavelength Units = Nanometers\nWavelength = {braces(wl_nm)}\n"
                                             "Map Info = {UTM, 1, 1, 500000, 4000000, 30, 30, 10, North, WGS-84}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the library's two-line UserWarning would print beside a one-line error
        np.testing.assert_allclose(read_scene(header, labels="none").wavelengths, np.round(wl_nm, 4))
        np.testing.assert_allclose(read_wavelength_spec(str(header)), np.round(wl_nm, 4))  # --wavelengths HDR
        assert georef_from_envi_header(header) is not None  # predict reads the header's georeference too


def test_a_shift_of_exactly_one_nanometre_is_the_same_band_set() -> None:
    """'more than 1 nm' differ: 401.0 - 400.0 in floating point must not count as more."""
    from sciformer.data.hsi.wavelengths import same_wavelengths

    wl = np.array([434.71, 966.55, 1737.62, 2398.9])
    stored = wl.astype(np.float32).astype(np.float64)  # a checkpoint keeps the training centres as float32
    assert same_wavelengths(stored, wl + 1.0) and same_wavelengths(wl + 1.0, stored)
    assert not same_wavelengths(stored, wl + 1.01)


@pytest.mark.parametrize(("content", "match"), [
    ("1 400\n2 500\n3 600\n", "table of 3 rows of 2 numbers"),
    ("400,nan,600", "NaN or infinite"),
    ("500,500,600", "500 nm is given more than once"),
    ("5,6,7000", "5 nm lies outside"),
    ("400,500,2e6", "2000000 nm lies outside"),
    ("1e6,1000001", "1000001 nm lies outside"),  # not rounded to 1e+06 in the message
])
def test_implausible_band_centre_lists_are_refused(tmp_path: Path, content: str, match: str) -> None:
    spec = content
    if "\n" in content:
        (tmp_path / "wl.txt").write_text(content)
        spec = str(tmp_path / "wl.txt")
    with pytest.raises(DataError, match=match):
        read_wavelength_spec(spec)


def test_a_two_column_array_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "wl.npy", np.array([[400.0, 10.0], [500.0, 10.0], [600.0, 10.0]]))
    with pytest.raises(DataError, match=r"table of shape \(3, 2\)"):
        read_wavelength_spec(str(tmp_path / "wl.npy"))


def test_a_wavenumber_of_zero_is_named() -> None:
    with pytest.raises(DataError, match="wavenumber 0 cm\\^-1 has no wavelength"):
        to_nanometres([0.0, 20000.0], "Wavenumber", "x.hdr")


@pytest.mark.parametrize("rows", [7, 4])  # one row per band, or a (B/2, 2) table whose values count B
def test_a_mat_wavelength_table_is_refused_not_skipped_or_flattened(tmp_path: Path, rows: int) -> None:
    cube, gt, wl = make_hsi_scene(h=6, w=5, bands=8 if rows == 4 else 7, classes=2, block=2)
    table = np.stack([wl[:rows], np.full(rows, 10.0)], 1)  # (rows, 2): centre, FWHM
    path = tmp_path / "scene.mat"
    scipy.io.savemat(path, {"cube": cube, "gt": gt.astype(np.uint8), "wavelengths": table, "table": table})
    with pytest.raises(DataError, match=rf"scene.mat \[wavelengths\]: a table of shape \({rows}, 2\)"):
        read_scene(path)
    scipy.io.savemat(path, {"cube": cube, "table": table, "column": wl[:, None]})
    with pytest.raises(DataError, match=rf"\[table\] \(wavelength_key\): a table of shape \({rows}, 2\)"):
        read_scene(path, wavelength_key="table", labels="none")
    np.testing.assert_allclose(read_scene(path, wavelength_key="column", labels="none").wavelengths, wl)  # (B, 1): one column


def test_a_one_band_envi_cube_with_a_centre_is_a_cube_a_classification_a_label_map(tmp_path: Path) -> None:
    cube = np.arange(20, dtype=np.float32).reshape(4, 5, 1)  # (H, W, 1)
    header = write_envi_text(tmp_path, cube, "wavelength units = Nanometers\nwavelength = {646.72}\n")
    scene = read_scene(header, labels="none")
    np.testing.assert_array_equal(scene.cube, cube)
    np.testing.assert_allclose(scene.wavelengths, [646.72])
    centre = "wavelength = {646.72}\n"
    for extra in ("classes = 20\n" + centre, "class names = {a, b}\n" + centre, ""):  # the header says label map, or gives no centre
        header = write_envi_text(tmp_path, cube, extra)
        np.testing.assert_array_equal(read_labels(header), cube[:, :, 0].astype(np.int64))


def test_a_band_set_is_described_in_words_that_agree_with_its_count() -> None:
    assert describe(np.array([646.72])) == "1 band, 646.7 nm"
    assert describe(np.array([400.0, 2499.0])) == "2 bands, 400.0-2499.0 nm"


def test_a_named_array_that_is_no_band_table_is_skipped(tmp_path: Path) -> None:
    """k-means 'centers' (K, B) or a 'lambda' path (5, 3) beside the cube refused the scene ('a table
    of shape (4, 7)'), even beside a proper 'wavelength'; neither could stand for B centres: skipped."""
    cube, gt, wl = make_hsi_scene(h=6, w=5, bands=7, classes=2, block=2)
    path = tmp_path / "scene.mat"
    scipy.io.savemat(path, {"cube": cube, "gt": gt.astype(np.uint8), "centers": np.ones((4, 7)), "lambda": np.ones((5, 3))})
    assert read_scene(path).wavelengths is None
    scipy.io.savemat(path, {"cube": cube, "gt": gt.astype(np.uint8), "centers": np.ones((4, 7)), "wavelength": wl})
    np.testing.assert_allclose(read_scene(path).wavelengths, wl)
    scipy.io.savemat(path, {"cube": cube, "wavelength": wl, "wavelengths": np.stack([wl, wl], 1)})  # (B, 2) beside (B,)
    np.testing.assert_allclose(read_scene(path, labels="none").wavelengths, wl)


@pytest.mark.parametrize("centres", ["{646.7}", "{400.0, 450.0, 500.0}"])
def test_a_one_band_envi_label_file_with_a_wavelength_is_a_label_map(tmp_path: Path, centres: str) -> None:
    """Given as the label file, a one-band ENVI map whose header kept a 'wavelength' was read as a
    cube ('no 2-D integer label map found'; a copied list: '3 wavelengths for a cube of 1 bands')."""
    cube, _, _ = make_hsi_scene(h=6, w=5, bands=3, classes=2, block=2)
    np.save(tmp_path / "scene.npy", cube)
    gt = (np.arange(30).reshape(6, 5, 1) % 3 + 1).astype(np.float32)  # (H, W, 1)
    (tmp_path / "gt").mkdir()
    header = write_envi_text(tmp_path / "gt", gt, f"wavelength = {centres}\n")
    scene = read_scene(tmp_path / "scene.npy", labels="required", label_path=header)
    np.testing.assert_array_equal(scene.gt, gt[:, :, 0])
    np.testing.assert_array_equal(read_labels(header), gt[:, :, 0])
    if centres == "{646.7}":  # read as a cube it stays a one-band cube at that centre
        np.testing.assert_allclose(read_scene(header, labels="none").wavelengths, [646.7])
    else:
        with pytest.raises(DataError, match=r"3 wavelengths for a cube of 1 band; expected"):
            read_scene(header, labels="none")
