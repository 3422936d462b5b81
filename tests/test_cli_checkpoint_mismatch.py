"""Every checkpoint that does not fit is one stderr line naming what differs, never a traceback.

Driven through the CLI's ``main`` (as the other CLI tests): ``train --resume``,
``evaluate`` and ``predict`` with another class count, band / input-channel count, model
name or model parameter, a checkpoint whose weights were altered, and data that changed
on disk under a run. (A point model's feature set at predict time is covered by
tests/test_cli_predict_las.py.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from synthetic import make_hsi_scene

from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint, save_checkpoint

TOY = ("name: toy\ndata: {name: toy_blobs}\nmodel: {name: toy_mlp, hidden: 8}\n"
       "train: {epochs: 1, batch_size: 16, progress: never, threads: 1}\n")
HSI = ("name: tiny_hsi\n"
       "data: {name: hsi_scene, source: scene.mat, patch_size: 3, split: {kind: stratified, train_per_class: 20, val_fraction: 0.2}}\n"
       "model: {name: spectral_spatial, dim: 16, depth: 1, num_heads: 2, band_group_size: 3}\n"
       "train: {epochs: 1, batch_size: 16, progress: never, threads: 1}\n")


def _write_scene(folder: Path, bands: int = 9, classes: int = 3) -> None:
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=bands, classes=classes, block=4)
    scipy.io.savemat(folder / "scene.mat", {"cube": cube.astype(np.float32), "labels": gt.astype(np.uint8)})


def _train(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exp.yaml").write_text(text)
    assert main(["train", "-c", str(folder / "exp.yaml"), "-o", str(folder / "run")]) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("toy"), TOY)


@pytest.fixture(scope="module")
def hsi_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hsi")
    _write_scene(folder)
    return _train(folder, HSI)


def _alter_weights(run: Path) -> None:
    """Replace the head of last.pt by one of another shape (its config unchanged)."""
    last = run / "checkpoints" / "last.pt"
    state = load_checkpoint(last)
    state["model"]["net.3.weight"] = torch.zeros(4, 8)
    save_checkpoint(last, {k: v for k, v in state.items() if k not in ("format", "version")})


# (fixture, mutate the run's data or files first, CLI arguments with RUN for the run, fragment of the one line)
CASES = {
    "resume/classes": ("toy_run", None, ["train", "--resume", "RUN", "data.num_classes=4"],
                       "--resume cannot change data.num_classes"),
    "resume/bands": ("toy_run", None, ["train", "--resume", "RUN", "data.dim=6"], "--resume cannot change data.dim"),
    "resume/model name": ("toy_run", None, ["train", "--resume", "RUN", "model.name=spectral_spatial"],
                          "holds model 'toy_mlp', model.name=spectral_spatial asks for another model"),
    "resume/model config": ("toy_run", None, ["train", "--resume", "RUN", "model.hidden=4"], "--resume cannot change model.hidden"),
    "resume/altered weights": ("toy_run", _alter_weights, ["train", "--resume", "RUN", "train.epochs=2"],
                               "net.3.weight has shape (4, 8), the model wants (3, 8): its weights do not fit"),
    "resume/data now has other bands": ("hsi_run", lambda run: _write_scene(run.parent, bands=12), ["train", "--resume", "RUN", "train.epochs=2"],
                                        "the run's data changed since it was written: the checkpoint was trained on 9 bands, this data has 12"),
    "resume/data now has other classes": ("hsi_run", lambda run: _write_scene(run.parent, classes=4), ["train", "--resume", "RUN", "train.epochs=2"],
                                          "the checkpoint was trained for 3 classes, this experiment has 4"),
    "evaluate/classes": ("toy_run", None, ["evaluate", "--checkpoint", "RUN", "data.num_classes=4"],
                         "net.3.weight has shape (3, 8), the model wants (4, 8): the checkpoint was trained for 3 classes, "
                         "this experiment has 4; to fine-tune it on this data, train a new run with --init-from"),
    "evaluate/input channels": ("toy_run", None, ["evaluate", "--checkpoint", "RUN", "data.dim=6"],
                                "net.0.weight has shape (8, 4), the model wants (8, 6): the checkpoint was trained on 4 input channels, this data has 6"),
    "evaluate/model config": ("toy_run", None, ["evaluate", "--checkpoint", "RUN", "model.hidden=4"],
                              "net.0.weight has shape (8, 4), the model wants (4, 4): model.hidden is 8 in the checkpoint, 4 here"),
    "evaluate/model name": ("hsi_run", None, ["evaluate", "--checkpoint", "RUN", "model.name=spectralformer"],
                            "holds model 'spectral_spatial', model.name=spectralformer asks for another model (to start a 'spectralformer' "
                            "run from the weights they share, train with --init-from)"),
    "evaluate/data now has other classes": ("hsi_run", lambda run: _write_scene(run.parent, classes=4), ["evaluate", "--checkpoint", "RUN"],
                                            "head.weight has shape (3, 32), the model wants (4, 32): the checkpoint was trained for 3 classes"),
    "evaluate/hsi model config": ("hsi_run", None, ["evaluate", "--checkpoint", "RUN", "model.depth=2"],
                                  "lacks encoder.blocks.1.norm1.weight (and 11 more), which model 'spectral_spatial' needs: model.depth is 1 in the checkpoint, 2 here"),
    "predict/model config": ("hsi_run", None, ["predict", "--checkpoint", "RUN", "--input", "SCENE", "--output", "OUT", "model.dim=32"],
                             "type_embed has shape (2, 16), the model wants (2, 32): model.dim is 16 in the checkpoint, 32 here"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mismatch_is_one_line(case: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fixture, mutate, argv, fragment = CASES[case]
    run = request.getfixturevalue(fixture)
    if mutate is not None:  # a private copy: the shared run stays as trained
        shutil.copytree(run.parent, tmp_path / "copy")
        run = tmp_path / "copy" / "run"
        state = load_checkpoint(run / "checkpoints" / "last.pt")
        for name in ("last.pt", "best.pt"):  # the copy's checkpoints read the copy's data
            ckpt = load_checkpoint(run / "checkpoints" / name)
            ckpt["config_dir"] = str(run.parent)
            save_checkpoint(run / "checkpoints" / name, {k: v for k, v in ckpt.items() if k not in ("format", "version")})
        assert state["config_dir"] != str(run.parent)
        mutate(run)
    argv = [a.replace("RUN", str(run)).replace("SCENE", str(run.parent / "scene.mat")).replace("OUT", str(tmp_path / "p.npy")) for a in argv]
    before = (run / "metrics.csv").read_text()
    capsys.readouterr()
    assert main(argv) != 0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]
    assert (run / "metrics.csv").read_text() == before  # a refused resume rewrites nothing
