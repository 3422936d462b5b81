"""A tiny hyperspectral experiment end to end through the CLI: train, resume, evaluate, predict."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import spectral
from synthetic import make_hsi_scene

from sciformer.cli import main


@pytest.fixture
def scene(tmp_path: Path) -> Path:
    """A 20 x 24 x 9 scene with three spectrally distinct classes (the shared builder), as a .mat file."""
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=9, classes=3, block=4)
    scipy.io.savemat(tmp_path / "scene.mat", {"cube": cube.astype(np.float32), "labels": gt.astype(np.uint8)})
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        "name: tiny_hsi\n"
        "data:\n"
        "  name: hsi_scene\n"
        "  source: scene.mat\n"  # relative to this file
        "  class_names: [red, green, blue]\n"
        "  patch_size: 3\n"
        "  split: {kind: stratified, train_per_class: 30, val_fraction: 0.2}\n"
        "model: {name: spectral_spatial, dim: 16, depth: 1, num_heads: 2, band_group_size: 3}\n"
        "train: {epochs: 2, batch_size: 16, progress: never}\n"
    )
    return cfg


def test_train_resume_evaluate_predict(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(scene), "-o", str(run)]) == 0
    out = capsys.readouterr().out
    assert "test results (tiny_hsi)" in out and "blue" in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["protocol"]["split"]["kind"] == "stratified"
    assert set(metrics["per_class"]) == {"red", "green", "blue"}
    for name in ("splits.npz", "protocol.json", "predictions/map.png", "predictions/map.npy", "predictions/map.hdr"):
        assert (run / name).is_file(), name
    full_map = np.load(run / "predictions" / "map.npy")
    assert full_map.shape == (20, 24) and set(np.unique(full_map)) <= {0, 1, 2, 3}

    # resume the finished run for two more epochs
    assert main(["train", "--resume", str(run), "train.epochs=4"]) == 0
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + 4

    assert main(["evaluate", "--checkpoint", str(run / "checkpoints" / "best.pt"), "-o", str(tmp_path / "eval")]) == 0
    again = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert again["split"] == "test" and 0.0 <= again["oa"] <= 1.0

    for suffix in (".npy", ".png", ".hdr"):
        out_path = tmp_path / f"pred{suffix}"
        assert main(["predict", "--checkpoint", str(run / "checkpoints" / "best.pt"), "--input", str(tmp_path / "scene.mat"), "--output", str(out_path)]) == 0
        assert out_path.is_file()
    predicted = np.load(tmp_path / "pred.npy")
    assert predicted.shape == (20, 24)
    envi = spectral.open_image(str(tmp_path / "pred.hdr")).read_band(0)
    np.testing.assert_array_equal(np.asarray(envi), predicted)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("data.source=missing.mat", "missing.mat"),
        ("model.name=spectral_former", "did you mean 'spectralformer'"),
        ("data.patch_size=4", "data.patch_size"),
        ("data.split.kind=random", "data.split.kind"),
    ],
)
def test_bad_experiment_is_one_line_exit_2(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture, override: str, fragment: str) -> None:
    run = tmp_path / "bad_run"
    assert main(["train", "-c", str(scene), "-o", str(run), override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (run / "metrics.json").exists() and not (run / "checkpoints").exists()


def test_predict_rejects_band_mismatch(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "-c", str(scene), "-o", str(run), "train.epochs=1"]) == 0
    np.save(tmp_path / "other.npy", np.zeros((5, 5, 4), np.float32))
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run), "--input", str(tmp_path / "other.npy"), "--output", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "band" in err[0]


@pytest.mark.parametrize("extra", [[], ["data.wavelengths=[400,450,500,550,600,650,700,750,800]", "data.pca_components=4"]])
def test_wavelength_positions_without_centres_stop_before_the_run(scene: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture, extra: list[str]) -> None:
    """No centres, or PCA components (placed by index): one line when the model is built, no run folder."""
    run = tmp_path / "run"
    assert main(["train", "-c", str(scene), "-o", str(run), "model.position_source=wavelength", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.position_source" in err and "data.pca_components" in err
    assert not run.exists()
