"""Wavelength-aware models end to end: Indian Pines models (one placing bands by wavelength,
one by index; tiny, one epoch) applied by ``sciformer predict``, ``sciformer evaluate`` and
the Python API to real cubes of other band sets (every second Indian Pines band; real
AVIRIS and CASI crops with their published band centres), and refused where the rules of
:mod:`sciformer.data.hsi.bandmatch` say so, each time as one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

import sciformer
from sciformer.cli import main
from sciformer.data.hsi.builtin import load_indian_pines

YAML = ("name: ip_{source}\ndata:\n  name: hsi_scene\n  source: indian_pines\n  patch_size: 3\n"
        "  split: {{kind: stratified, train_per_class: 6, val_fraction: 0.2}}\n"
        "model: {{name: spectral_spatial, dim: 16, depth: 1, num_heads: 2, band_group_size: 10, spectral_hidden: 16, "
        "position_source: {source}}}\n"
        "train: {{epochs: 1, batch_size: 32, progress: never, threads: 1}}\n"
        "evaluation: {{split: val}}\nexport: {{npy: false, png: false, envi: false}}\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("tensorly")
    root = tmp_path_factory.mktemp("ip_wavelengths")
    out = {"root": root}
    for source in ("wavelength", "index"):
        (root / f"{source}.yaml").write_text(YAML.format(source=source))
        assert main(["train", "-c", str(root / f"{source}.yaml"), "-o", str(root / source)]) == 0
        out[source] = root / source
    scene = load_indian_pines()
    assert scene.wavelengths is not None and scene.gt is not None
    np.save(root / "half.npy", scene.cube[:, :, ::2])  # (145, 145, 100) no centres in the file
    np.savetxt(root / "half_nm.txt", scene.wavelengths[::2])
    np.save(root / "full.npy", scene.cube)  # (145, 145, 200) no centres in the file
    np.save(root / "gt.npy", scene.gt)
    np.save(root / "wl.npy", scene.wavelengths)
    return out


def predict(run: Path, inp: Path, out: Path, *extra: str) -> int:
    return main(["predict", "--checkpoint", str(run), "-i", str(inp), "-o", str(out), *extra])


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_checkpoint_records_the_training_wavelengths(runs: dict[str, Path]) -> None:
    from tensorly.datasets import load_indian_pines as tensorly_indian_pines  # the oracle: the published centres

    published = np.asarray(tensorly_indian_pines()["ticks"][1], dtype=np.float64)  # (200,) nm
    state = torch.load(runs["wavelength"] / "checkpoints" / "best.pt", weights_only=True)
    # AVIRIS's spectrometers overlap: the bands are trained in ascending order of centre, the file's order kept
    order = np.argsort(published, kind="stable")
    assert np.any(np.diff(published) < 0)
    np.testing.assert_allclose(state["data_state"]["wavelengths"].numpy(), published[order], atol=1e-3)
    np.testing.assert_allclose(state["data_info"]["wavelengths"], published[order], atol=1e-9)
    np.testing.assert_array_equal(state["data_state"]["band_order"].numpy(), order)
    assert state["data_state"]["in_bands"] == 200 and state["config"]["model"]["position_source"] == "wavelength"


def unseen_by_hand(trained: np.ndarray, wl: np.ndarray) -> np.ndarray:
    """The oracle of the bands left out: no trained band within 5 nm (half Indian Pines' 10 nm step), and not
    between two trained bands under 25 nm apart (a step, not one of its three water-absorption gaps)."""
    t = np.sort(trained)
    near = np.abs(wl[:, None] - t[None, :]).min(axis=1) <= 5.0  # (B,)
    lower = np.searchsorted(t, wl) - 1  # (B,) the trained band below each centre
    inside = (lower >= 0) & (lower < t.size - 1)
    in_step = inside & (t[np.clip(lower + 1, 0, t.size - 1)] - t[np.clip(lower, 0, t.size - 1)] < 25.0)
    return ~near & ~in_step


@pytest.mark.parametrize(("name", "shape", "left_out"), [("aviris_crop_224bands.mat", (90, 90), 27),
                                                          ("muufl_crop_72bands.mat", (51, 88), 3)])
def test_wavelength_model_predicts_real_crops_of_other_sensors(runs: dict[str, Path], data_root: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str], name: str,
                                                               shape: tuple[int, int], left_out: int) -> None:
    """The bands the model saw no band near are left out: the map equals the prediction of the crop with
    them cut out by hand (AVIRIS: 4 below 400 nm and 23 in Indian Pines' water-absorption gaps; MUUFL: 3 below)."""
    crop = data_root / "hsi_wavelengths" / name
    raw = scipy.io.loadmat(crop)
    cube = raw["hsi_img" if "aviris" in name else "hsi_img_sub"]
    wl = raw["wavelengths"].ravel().astype(np.float64)
    assert predict(runs["wavelength"], crop, tmp_path / "map.npy") == 0
    label_map = np.load(tmp_path / "map.npy")
    raw = scipy.io.loadmat(crop)
    valid = raw["mask_sub"].astype(bool) if "mask_sub" in raw else np.ones(shape, bool)  # MUUFL's valid-pixel mask
    assert label_map.shape == shape and label_map[valid].min() >= 1 and label_map.max() <= 16  # one class per valid pixel
    assert np.all(label_map[~valid] == 0)  # outside the mask (a constant fill spectrum): not classified
    err = capsys.readouterr().err
    assert f"{wl.size} bands, " in err and "placed by wavelength in a model trained on 200 bands" in err
    unseen = unseen_by_hand(np.load(runs["root"] / "wl.npy"), wl)
    assert int(unseen.sum()) == left_out and f"note: {left_out} of {wl.size} bands" in err and "left out" in err
    cut = {"cube": cube[:, :, ~unseen]} | ({"mask_sub": raw["mask_sub"]} if "mask_sub" in raw else {})
    np.savez(tmp_path / "cut.npz", **cut)  # the valid-pixel mask travels with the cut cube
    np.savetxt(tmp_path / "cut_nm.txt", wl[~unseen])
    assert predict(runs["wavelength"], tmp_path / "cut.npz", tmp_path / "cut_map.npy", "--wavelengths",
                   str(tmp_path / "cut_nm.txt")) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "cut_map.npy"), label_map)
    err = capsys.readouterr().err.splitlines()  # bands dead in the crop (0 on every pixel) go as bad bands, both times
    assert not [line for line in err if "left out" in line and "bad band(s) left out: 0 on every pixel" not in line]
    assert predict(runs["wavelength"], crop, tmp_path / "all.npy", "--allow-band-mismatch") == 0  # the opt-in keeps them
    assert f"WARNING: {left_out} of {wl.size} bands" in capsys.readouterr().err


def test_the_scene_recalibrated_by_a_nm_and_a_half_keeps_every_band(runs: dict[str, Path], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Indian Pines' own centres shifted by +-1.5 nm (a recalibration): no band is left out, so the map equals
    the one with every band kept by the opt-in."""
    for shift in (-1.5, 1.5):
        np.savetxt(tmp_path / "nm.txt", np.load(runs["root"] / "wl.npy") + shift)
        given = ("--wavelengths", str(tmp_path / "nm.txt"))
        assert predict(runs["wavelength"], runs["root"] / "full.npy", tmp_path / "a.npy", *given, "--overwrite") == 0
        assert "left out" not in capsys.readouterr().err
        assert predict(runs["wavelength"], runs["root"] / "full.npy", tmp_path / "b.npy", *given, "--overwrite",
                       "--allow-band-mismatch") == 0
        np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


def test_centres_in_the_wrong_unit_are_refused(runs: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from spectral.io import envi

    cube, wl = np.load(runs["root"] / "full.npy")[:12, :12], np.load(runs["root"] / "wl.npy")
    vnir = wl < 950.0
    envi.save_image(str(tmp_path / "um.hdr"), cube[:, :, vnir], ext=".img", force=True,
                    metadata={"wavelength": [str(v) for v in wl[vnir]], "wavelength units": "Micrometers"})  # nm values
    assert predict(runs["wavelength"], tmp_path / "um.hdr", tmp_path / "m.npy") == 2
    line = one_error_line(capsys)
    assert f"none of its {int(vnir.sum())} bands" in line and "unit slip" in line and "--allow-band-mismatch" in line
    assert not (tmp_path / "m.npy").exists()
    assert predict(runs["wavelength"], tmp_path / "um.hdr", tmp_path / "m.npy", "--allow-band-mismatch") == 0


def test_evaluate_leaves_out_the_same_bands(runs: dict[str, Path], tmp_path: Path) -> None:
    """Oracle: the scene evaluated without the three bands added inside Indian Pines' gaps."""
    root = runs["root"]
    cube, wl = np.load(root / "full.npy"), np.load(root / "wl.npy")
    extra = np.array([1390.0, 1900.0, 2215.0])  # one band in each gap (copies of a neighbour's values)
    np.save(tmp_path / "more.npy", np.concatenate([cube, cube[:, :, :3]], axis=-1))
    scores = []
    for name, source, centres in (("a", root / "full.npy", wl), ("b", tmp_path / "more.npy", np.r_[wl, extra])):
        listing = "data.wavelengths=[" + ",".join(f"{w:.3f}" for w in centres) + "]"
        assert main(["evaluate", "--checkpoint", str(runs["wavelength"]), "-o", str(tmp_path / name), f"data.source={source}",
                     f"data.label_path={root / 'gt.npy'}", listing, "evaluation.split=test"]) == 0
        scores.append((tmp_path / name / "confusion_matrix.csv").read_text())
    assert scores[0] == scores[1]


def test_real_crop_without_centres_is_refused_then_runs_with_them(runs: dict[str, Path], data_root: Path,
                                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = scipy.io.loadmat(data_root / "hsi_wavelengths" / "aviris_crop_224bands.mat")
    np.save(tmp_path / "aviris.npy", raw["hsi_img"])  # the cube alone: no centres
    assert predict(runs["wavelength"], tmp_path / "aviris.npy", tmp_path / "map.npy") == 2
    err = one_error_line(capsys)
    assert "the cube has 224 bands and no wavelengths; the model was trained on 200 bands" in err and "--wavelengths" in err
    assert not (tmp_path / "map.npy").exists()
    np.savetxt(tmp_path / "aviris_nm.txt", raw["wavelengths"].ravel())
    assert predict(runs["wavelength"], tmp_path / "aviris.npy", tmp_path / "map.npy", "--wavelengths",
                   str(tmp_path / "aviris_nm.txt")) == 0
    assert np.load(tmp_path / "map.npy").shape == (90, 90)


def test_every_second_band_through_a_200_band_wavelength_model(runs: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    root = runs["root"]
    assert predict(runs["wavelength"], root / "half.npy", tmp_path / "half.npy", "--wavelengths",
                   str(root / "half_nm.txt")) == 0
    half = np.load(tmp_path / "half.npy")
    assert half.shape == (145, 145) and half.min() >= 1 and half.max() <= 16
    assert "100 bands, 400.0-2489.1 nm placed by wavelength" in capsys.readouterr().err
    # the Python API takes the centres as an argument and gives the same map
    model = sciformer.load(runs["wavelength"], device="cpu")
    wl = np.load(root / "wl.npy")
    pred = model.predict(np.load(root / "half.npy"), wavelengths=wl[::2])
    np.testing.assert_array_equal(pred.labels + 1, half)
    with pytest.raises(sciformer.api.DataError, match="has 100 bands and no wavelengths; the model was trained on 200"):
        model.predict(np.load(root / "half.npy"))


def test_same_band_count_without_centres_uses_the_checkpoints(runs: dict[str, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = runs["root"]
    assert predict(runs["wavelength"], root / "full.npy", tmp_path / "a.npy") == 0
    err = capsys.readouterr().err
    assert "full.npy carries no wavelengths; using the model's (200 bands, 400.0-2499.0 nm)" in err
    assert predict(runs["wavelength"], root / "full.npy", tmp_path / "b.npy", "--wavelengths", str(root / "wl.npy")) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


def test_index_model_refuses_other_band_sets(runs: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = runs["root"]
    assert predict(runs["index"], root / "half.npy", tmp_path / "x.npy", "--wavelengths", str(root / "half_nm.txt")) == 2
    err = one_error_line(capsys)
    assert "the cube has 100 bands but the model was trained on 200 bands placed by band index" in err
    shifted = np.load(root / "wl.npy") + 20.0
    np.savetxt(tmp_path / "shifted.txt", shifted)
    assert predict(runs["index"], root / "full.npy", tmp_path / "x.npy", "--wavelengths", str(tmp_path / "shifted.txt")) == 2
    assert "--allow-band-mismatch" in one_error_line(capsys)
    assert predict(runs["index"], root / "full.npy", tmp_path / "x.npy", "--wavelengths", str(tmp_path / "shifted.txt"),
                   "--allow-band-mismatch") == 0
    assert capsys.readouterr().err.startswith("WARNING: ")
    assert np.load(tmp_path / "x.npy").shape == (145, 145)


def test_evaluate_applies_the_same_rules(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = runs["root"]
    scene = [f"data.source={root / 'half.npy'}", f"data.label_path={root / 'gt.npy'}"]
    listing = "data.wavelengths=[" + ",".join(f"{w:.2f}" for w in np.load(root / "wl.npy")[::2]) + "]"
    assert main(["evaluate", "--checkpoint", str(runs["index"]), "-o", str(tmp_path / "i"), *scene, listing]) == 2
    assert "the cube has 100 bands but the model was trained on 200 bands placed by band index" in one_error_line(capsys)
    assert main(["evaluate", "--checkpoint", str(runs["wavelength"]), "-o", str(tmp_path / "w"), *scene]) == 2
    line = one_error_line(capsys)
    assert "has 100 bands and no wavelengths" in line and "data.wavelengths=[...]" in line
    assert "--wavelengths" not in line  # a flag evaluate does not take
    assert main(["evaluate", "--checkpoint", str(runs["wavelength"]), "-o", str(tmp_path / "w"), *scene, listing]) == 0
    metrics = json.loads((tmp_path / "w" / "metrics.json").read_text())
    assert 0.0 <= metrics["oa"] <= 1.0
    # the new scene's file names no class: the table names the model's classes, as its checkpoint does
    trained = torch.load(runs["wavelength"] / "checkpoints" / "best.pt", weights_only=True)["data_state"]["class_names"]
    rows = (tmp_path / "w" / "per_class.csv").read_text().splitlines()[1:]
    assert [r.split(",")[1] for r in rows] == list(trained) and trained[0] == load_indian_pines().class_names[0]


@pytest.mark.parametrize("source", ["wavelength", "index"])
def test_the_same_bands_in_another_order_give_the_same_probabilities(runs: dict[str, Path], tmp_path: Path,
                                                                     source: str) -> None:
    """A Wavenumber header lists the bands descending in nm; any order of (band, centre) pairs is the
    same cube. The oracle: the prediction of the file in its own order."""
    root = runs["root"]
    cube, wl = np.load(root / "full.npy")[40:80, 40:80], np.load(root / "wl.npy")
    np.save(tmp_path / "cube.npy", cube)
    perm = np.random.default_rng(0).permutation(wl.size)
    np.save(tmp_path / "shuffled.npy", cube[:, :, perm])
    np.savetxt(tmp_path / "shuffled_nm.txt", wl[perm])
    np.savetxt(tmp_path / "reversed_nm.txt", wl[::-1])
    np.save(tmp_path / "reversed.npy", cube[:, :, ::-1])
    assert predict(runs[source], tmp_path / "cube.npy", tmp_path / "a.npy", "--wavelengths", str(root / "wl.npy"),
                   "--probabilities") == 0
    for name in ("shuffled", "reversed"):
        assert predict(runs[source], tmp_path / f"{name}.npy", tmp_path / f"{name}_map.npy", "--wavelengths",
                       str(tmp_path / f"{name}_nm.txt"), "--probabilities") == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}_map_probabilities.npy"),
                                      np.load(tmp_path / "a_probabilities.npy"))
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}_map.npy"), np.load(tmp_path / "a.npy"))


def test_two_bands_of_one_centre_are_refused(runs: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    wl = np.load(runs["root"] / "wl.npy")[:4].copy()
    wl[2] = wl[0]
    np.save(tmp_path / "c.npy", np.ones((5, 5, 4), np.float32))
    assert predict(runs["wavelength"], tmp_path / "c.npy", tmp_path / "m.npy", "--wavelengths", ",".join(map(str, wl))) == 2
    assert re.search(r"bands 0 and 2 have the same centre|400.02 nm is given more than once", one_error_line(capsys))



def test_evaluate_without_centres_runs_at_the_checkpoints(runs: dict[str, Path], tmp_path: Path) -> None:
    """Same band count, no centres in the file: the model (placed by wavelength) is built and run at
    the checkpoint's centres, as by predict."""
    root = runs["root"]
    scene = [f"data.source={root / 'full.npy'}", f"data.label_path={root / 'gt.npy'}"]
    assert main(["evaluate", "--checkpoint", str(runs["wavelength"]), "-o", str(tmp_path / "a"), *scene]) == 0
    assert 0.0 <= json.loads((tmp_path / "a" / "metrics.json").read_text())["oa"] <= 1.0


def test_pca_model_checks_band_centres_as_an_index_model_does(runs: dict[str, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = runs["root"]
    (tmp_path / "pca.yaml").write_text(YAML.format(source="auto"))
    assert main(["train", "-c", str(tmp_path / "pca.yaml"), "-o", str(tmp_path / "pca"), "data.pca_components=5"]) == 0
    state = torch.load(tmp_path / "pca" / "checkpoints" / "best.pt", weights_only=True)["data_state"]
    np.testing.assert_allclose(state["wavelengths"].numpy(), np.sort(np.load(root / "wl.npy")), atol=1e-3)  # recorded, ascending
    capsys.readouterr()
    np.savetxt(tmp_path / "other.txt", np.linspace(400.0, 1000.0, 200))  # another sensor's 200 centres
    assert predict(tmp_path / "pca", root / "full.npy", tmp_path / "x.npy", "--wavelengths", str(tmp_path / "other.txt")) == 2
    err = one_error_line(capsys)
    assert "band centres differ from the model's" in err and "PCA" in err and "--allow-band-mismatch" in err
    assert predict(tmp_path / "pca", root / "full.npy", tmp_path / "x.npy", "--wavelengths", str(tmp_path / "other.txt"),
                   "--allow-band-mismatch") == 0
    assert capsys.readouterr().err.startswith("WARNING: ")
    assert predict(tmp_path / "pca", root / "full.npy", tmp_path / "y.npy", "--wavelengths", str(root / "wl.npy")) == 0
    listing = "data.wavelengths=[" + ",".join(f"{w:.3f}" for w in np.linspace(400.0, 1000.0, 200)) + "]"
    assert main(["evaluate", "--checkpoint", str(tmp_path / "pca"), "-o", str(tmp_path / "e"),
                 f"data.source={root / 'full.npy'}", f"data.label_path={root / 'gt.npy'}", listing]) == 2
    assert "band centres differ from the model's" in one_error_line(capsys)


def bad_band_file(path: Path, cube: np.ndarray, wl: np.ndarray, bad: np.ndarray, fill: float | None, bbl: bool) -> Path:
    from spectral.io import envi

    cube = cube.astype(np.float32)
    if fill is not None:
        cube[:, :, bad] = fill
    meta = {"wavelength": [repr(float(v)) for v in wl], "wavelength units": "Nanometers"}
    if bbl:
        meta["bbl"] = ["0" if b else "1" for b in bad]
    envi.save_image(str(path), cube, ext=".img", force=True, metadata=meta)
    return path


def crop_with_bad_bands(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 24 x 24 Indian Pines crop, its band centres and a mask of two bad bands (file bands 104, 105)."""
    cube, wl = np.load(root / "full.npy")[40:64, 40:64], np.load(root / "wl.npy")
    bad = np.zeros(wl.size, dtype=bool)
    bad[[103, 104]] = True
    return cube, wl, bad


def test_bad_bands_are_left_out_for_a_wavelength_model(runs: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """ENVI bbl = 0 on another band set than the trained one, or NaN on every pixel: the oracle is the
    prediction of the cube with those bands cut out by hand."""
    cube, wl, bad = crop_with_bad_bands(runs["root"])
    half, half_wl, half_bad = cube[:, :, ::2], wl[::2], bad[::2] | (np.arange(100) == 30)  # another band set: 2 bad
    capsys.readouterr()
    for name, c, w, b, fill, bbl, why in (
            ("listed", half, half_wl, half_bad, 0.0, True, "ENVI bbl = 0: band(s) 31, 53 of the file"),
            ("nan_listed", half, half_wl, half_bad, np.nan, True, "ENVI bbl = 0: band(s) 31, 53 of the file"),
            ("nan", cube, wl, bad, np.nan, False, "NaN/Inf on every pixel: band(s) 104, 105 of the file")):
        np.save(tmp_path / f"{name}_cut.npy", c[:, :, ~b])
        np.save(tmp_path / f"{name}_cut_nm.npy", w[~b])
        assert predict(runs["wavelength"], tmp_path / f"{name}_cut.npy", tmp_path / f"{name}_oracle.npy", "--wavelengths",
                       str(tmp_path / f"{name}_cut_nm.npy")) == 0
        oracle = np.load(tmp_path / f"{name}_oracle.npy")
        assert oracle.min() >= 1
        capsys.readouterr()
        hdr = bad_band_file(tmp_path / f"{name}.hdr", c, w, b, fill, bbl)
        assert predict(runs["wavelength"], hdr, tmp_path / f"{name}.npy") == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), oracle)
        err = capsys.readouterr().err
        assert "2 bad band(s) left out: " + why in err
    holed = cube.astype(np.float32)
    holed[:, :, bad] = np.nan
    pred = sciformer.load(runs["wavelength"], device="cpu").predict(holed, wavelengths=wl)  # the API alike
    np.testing.assert_array_equal(pred.label_ids, oracle)


def test_bbl_on_the_trained_band_set_keeps_the_bands_the_model_trained_on(runs: dict[str, Path], tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A training file's header may list bad bands training used all the same: on the trained band set
    they stay (its own scene gave another map than the run's on 492 pixels), with a note."""
    cube, wl, bad = crop_with_bad_bands(runs["root"])
    np.save(tmp_path / "plain.npy", cube)
    np.save(tmp_path / "plain_nm.npy", wl)
    assert predict(runs["wavelength"], tmp_path / "plain.npy", tmp_path / "oracle.npy", "--wavelengths",
                   str(tmp_path / "plain_nm.npy")) == 0
    capsys.readouterr()
    hdr = bad_band_file(tmp_path / "listed.hdr", cube, wl, bad, None, True)  # real values, marked bad
    assert predict(runs["wavelength"], hdr, tmp_path / "m.npy") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "m.npy"), np.load(tmp_path / "oracle.npy"))
    assert "the ENVI bbl marks 2 band(s) bad; kept, the model was trained on this band set" in capsys.readouterr().err


def test_bad_band_numbers_are_the_files_in_a_descending_file(runs: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Bands stored in descending order are put in ascending order inside; notes number them as the file does."""
    cube, wl, bad = crop_with_bad_bands(runs["root"])
    half, half_wl = cube[:, :, ::2][:, :, ::-1], wl[::2][::-1]  # another band set, stored descending
    marked = np.zeros(100, dtype=bool)
    marked[[3, 4]] = True  # file bands 4, 5: the 4th and 5th longest centres
    hdr = bad_band_file(tmp_path / "desc.hdr", half, half_wl, marked, 0.0, True)
    capsys.readouterr()
    assert predict(runs["wavelength"], hdr, tmp_path / "m.npy") == 0
    assert "ENVI bbl = 0: band(s) 4, 5 of the file (1-based)" in capsys.readouterr().err


def test_bad_bands_stay_for_an_index_model_and_no_data_is_named(runs: dict[str, Path], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cube, wl, bad = crop_with_bad_bands(runs["root"])
    hdr = bad_band_file(tmp_path / "nan.hdr", cube, wl, bad, np.nan, True)
    assert predict(runs["index"], hdr, tmp_path / "m.npy") == 0
    assert not np.load(tmp_path / "m.npy").any()  # every pixel has a NaN band: no-data, unclassified
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"note: {hdr}: bad bands kept, the model places bands by index")
    assert err[1].startswith(f"WARNING: {hdr}: 576 of 576 pixels are no-data") and "band(s) 104, 105 (1-based)" in err[1]
    assert predict(runs["index"], bad_band_file(tmp_path / "zero.hdr", cube, wl, bad, 0.0, True), tmp_path / "z.npy") == 0
    assert np.load(tmp_path / "z.npy").min() >= 1  # zeros are data: classified, with the note only
    assert "WARNING" not in capsys.readouterr().err
