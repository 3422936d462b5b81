"""No-data pixels (NaN/Inf in a band, or the file's declared no-data value in every band):
label 0 and NaN probabilities in every output format, no effect on their neighbours' scores,
refused where labelled for training, never in the normalisation statistics. Pixels outside a
valid-pixel mask the file carries (``mask_sub``) are predicted as no-data pixels are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from spectral.io import envi
from synthetic import make_hsi_scene, write_tiny_hsi_config

from sciformer.cli import main
from sciformer.data.hsi.readers import read_labels, read_scene

NODATA = [(0, 0), (5, 7), (10, 11), (19, 23)]  # corners, and inner pixels whose neighbours are predicted


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("nodata")
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=9, classes=3, block=4)
    cube = cube.astype(np.float32)
    gt = gt.astype(np.uint8)
    for r, c in NODATA:
        gt[r, c] = 0
    holed = cube.copy()
    for r, c in NODATA:  # unlabelled no-data pixels in the training scene
        holed[r, c, 3] = np.nan
    scipy.io.savemat(root / "scene.mat", {"cube": holed, "labels": gt})
    write_tiny_hsi_config(root, "source: scene.mat", name="nd", train_per_class=30)
    assert main(["train", "-c", str(root / "tiny.yaml"), "-o", str(root / "run")]) == 0
    return {"root": root, "run": root / "run", "cube": cube, "gt": gt}


def _predict(run: dict[str, object], inp: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    assert main(["predict", "--checkpoint", str(run["run"]), "-i", str(inp), "-o", str(out), "--probabilities"]) == 0
    stem = out.with_name(out.stem + "_probabilities")
    if out.suffix == ".npy":
        return np.load(out), np.load(stem.with_suffix(".npy"))
    if out.suffix == ".tif":
        import rasterio

        with rasterio.open(out) as m, rasterio.open(stem.with_suffix(".tif")) as p:
            return m.read(1), np.moveaxis(p.read(), 0, -1)
    return read_labels(out.with_suffix(".hdr")), read_scene(stem.with_suffix(".hdr"), labels="none").cube


def _oracle(run: dict[str, object], tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The same cube with the no-data pixels holding the training band mean (nothing to detect)."""
    state = torch.load(Path(run["run"]) / "checkpoints" / "best.pt", weights_only=True)
    mean = state["data_state"]["normaliser"]["shift"].numpy()
    cube = np.array(run["cube"], dtype=np.float64)
    for r, c in NODATA:
        cube[r, c] = mean
    np.save(tmp_path / "oracle.npy", cube)
    return _predict(run, tmp_path / "oracle.npy", tmp_path / "oracle_map.npy")


def _check(label_map: np.ndarray, probs: np.ndarray, ref_map: np.ndarray, ref_probs: np.ndarray) -> None:
    nd = np.zeros(label_map.shape, bool)
    nd[tuple(np.array(NODATA).T)] = True
    assert np.all(label_map[nd] == 0) and np.all(label_map[~nd] > 0)
    assert np.isnan(probs[nd]).all()
    np.testing.assert_array_equal(label_map[~nd], ref_map[~nd])
    np.testing.assert_allclose(probs[~nd], ref_probs[~nd], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["nan.npy", "envi.hdr", "geotiff.tif"])
def test_nodata_pixels_are_unclassified_and_leave_their_neighbours_alone(run: dict[str, object], tmp_path: Path,
                                                                         kind: str) -> None:
    cube = np.array(run["cube"], dtype=np.float32)
    name, suffix = kind.split(".")
    if name == "nan":
        for r, c in NODATA:
            cube[r, c, 2] = np.inf if r == 5 else np.nan
        np.save(tmp_path / "in.npy", cube)
        inp = tmp_path / "in.npy"
    else:
        for r, c in NODATA:
            cube[r, c] = -9999.0
        if name == "envi":
            envi.save_image(str(tmp_path / "in.hdr"), cube, ext=".img", force=True, metadata={"data ignore value": -9999})
            inp = tmp_path / "in.hdr"
        else:
            rasterio = pytest.importorskip("rasterio")
            with rasterio.open(tmp_path / "in.tif", "w", driver="GTiff", height=cube.shape[0], width=cube.shape[1],
                               count=cube.shape[2], dtype="float32", nodata=-9999.0) as dst:
                dst.write(np.moveaxis(cube, -1, 0))
            inp = tmp_path / "in.tif"
    label_map, probs = _predict(run, inp, tmp_path / f"out.{suffix}")
    _check(label_map, probs, *_oracle(run, tmp_path))


def test_pixels_outside_the_files_valid_pixel_mask_are_predicted_as_no_data(run: dict[str, object], tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A .mat with a ``mask_sub`` (0 outside the valid area, whose pixels hold a constant fill spectrum) and a
    ``cloud_mask`` (1 = drop, not a valid-pixel mask): the oracle is the cube with those pixels as declared no-data."""
    cube = np.array(run["cube"], dtype=np.float32)
    keep = np.ones(cube.shape[:2], np.uint8)
    for r, c in NODATA:
        keep[r, c] = 0
        cube[r, c] = 5000.0  # the fill of the area outside the mask: a spectrum like no class's
    scipy.io.savemat(tmp_path / "in.mat", {"hsi_img_sub": cube, "mask_sub": keep, "cloud_mask": 1 - keep})
    label_map, probs = _predict(run, tmp_path / "in.mat", tmp_path / "out.npy")
    assert f"the valid-pixel mask 'mask_sub' marks {len(NODATA)} of {keep.size} pixels" in capsys.readouterr().err
    _check(label_map, probs, *_oracle(run, tmp_path))


def test_training_skips_nodata_in_its_statistics_and_refuses_labelled_nodata(run: dict[str, object], tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(run["root"])
    state = torch.load(Path(run["run"]) / "checkpoints" / "best.pt", weights_only=True)
    train = np.load(Path(run["run"]) / "splits.npz")["train"] > 0
    cube = np.asarray(run["cube"], dtype=np.float64)
    np.testing.assert_allclose(state["data_state"]["normaliser"]["shift"].numpy(), cube[train].mean(0), rtol=1e-6)
    holed = np.array(run["cube"])
    gt = np.array(run["gt"])
    r, c = np.argwhere(gt > 0)[0]
    holed[r, c, 0] = np.nan
    scipy.io.savemat(tmp_path / "scene.mat", {"cube": holed, "labels": gt})
    cfg = (root / "tiny.yaml").read_text().replace("source: scene.mat", f"source: {tmp_path / 'scene.mat'}")
    (tmp_path / "t.yaml").write_text(cfg)
    assert main(["train", "-c", str(tmp_path / "t.yaml"), "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1 labelled pixel(s) are no-data" in err and f"row {r}, column {c}" in err
    assert not (tmp_path / "r").exists()


def test_labels_scores_count_the_no_data_pixels_they_skip() -> None:
    """`predict --labels`: a labelled no-data pixel has no prediction (0): it is counted as
    skipped, never scored; with none left, the line says so instead of OA 0.00."""
    import numpy as np

    from sciformer.data.hsi.predict import map_scores, scores_line

    gt = np.array([[1, 2], [2, 0]])
    pred = np.array([[1, 0], [1, 2]])  # (0, 1) is no-data
    s = map_scores(pred, gt, 2)
    assert (s["pixels"], s["skipped"], s["oa"]) == (2, 1, 0.5)
    assert scores_line("a.npy", s, "gt.npy") == "a.npy: OA 50.00  AA 50.00 on 2 labelled pixels of gt.npy; 1 labelled no-data pixel(s) not scored"
    none = map_scores(np.zeros_like(gt), gt, 2)
    assert scores_line("a.npy", none, "gt.npy") == "a.npy: no labelled pixel to score in gt.npy; 3 labelled no-data pixel(s) not scored"


def test_bad_bands_and_the_no_data_warning() -> None:
    from sciformer.data.hsi.nodata import bad_bands, nodata_pixels, nodata_warning

    cube = np.ones((4, 5, 6), dtype=np.float32)
    cube[:, :, 2] = np.nan  # a bad band: NaN everywhere
    cube[0, 0, 4] = np.inf  # one bad pixel in another band
    bad, what = bad_bands(cube, np.array([0, 0, 0, 0, 0, 1], bool))
    np.testing.assert_array_equal(bad, [False, False, True, False, False, True])
    assert what == "ENVI bbl = 0: band(s) 6 of the file (1-based); NaN/Inf on every pixel: band(s) 3 of the file (1-based)"
    clean, none = bad_bands(cube[:, :, :2], None)
    assert not clean.any() and none == ""
    line = nodata_warning(cube, nodata_pixels(cube), "x.hdr")
    assert line == "WARNING: x.hdr: 20 of 20 pixels are no-data and left unclassified: NaN/Inf in band(s) 3 (1-based); " \
        "a bad band? mark it 0 in the header's bbl or drop it"
    assert nodata_warning(cube[:, :, [0, 4]], nodata_pixels(cube[:, :, [0, 4]]), "x") is None  # 1 of 20 pixels
    ints = np.zeros((2, 2, 3), dtype=np.int16)
    ints[0, 0] = 7
    assert nodata_warning(ints, nodata_pixels(ints, 0.0), "x").endswith("(the file's no-data value in every band)")


def test_the_no_data_warning_tells_fill_outside_the_image_from_a_bad_band() -> None:
    """A swath whose outside is NaN in every band is no bad band (the advice to mark each band bad in
    bbl would have marked all of them); a band NaN where the others are finite still is, by file number."""
    from sciformer.data.hsi.nodata import nodata_pixels, nodata_warning

    cube = np.ones((10, 10, 6), dtype=np.float32)
    cube[:, :7] = np.nan  # 70 % of the pixels: fill outside the flight line, every band
    line = nodata_warning(cube, nodata_pixels(cube), "swath.npz")
    assert line == "WARNING: swath.npz: 70 of 100 pixels are no-data and left unclassified (70 of them NaN/Inf in every " \
        "band: fill outside the image, not a bad band)"
    cube[:, :, 1] = np.nan  # and a bad band among the image's pixels too
    line = nodata_warning(cube, nodata_pixels(cube), "swath.npz", file_band=np.arange(6)[::-1])
    assert line.endswith(": NaN/Inf in band(s) 5 (1-based); a bad band? mark it 0 in the header's bbl or drop it")


def test_a_band_zero_on_every_pixel_is_bad_only_when_asked() -> None:
    """A dead or zero-filled detector band (AVIRIS crops hold 43) is a bad band on another sensor's band
    set, where the model never saw it zero; a NaN band stays a NaN band, not a zero one."""
    from sciformer.data.hsi.nodata import bad_bands

    cube = np.ones((40, 3, 5), dtype=np.uint16)
    cube[:, :, 1] = 0
    cube[39, 2, 3] = 0  # zero on one pixel only: no dead band
    bad, what = bad_bands(cube, None, np.arange(5)[::-1], zeros=True)
    np.testing.assert_array_equal(bad, [False, True, False, False, False])
    assert what == "0 on every pixel: band(s) 4 of the file (1-based)"
    assert not bad_bands(cube, None)[0].any()  # the trained band set: not asked
    floats = cube.astype(np.float32)
    floats[:, :, 4] = np.nan
    bad, what = bad_bands(floats, None, zeros=True)
    assert what == "NaN/Inf on every pixel: band(s) 5 of the file (1-based); 0 on every pixel: band(s) 2 of the file (1-based)"
