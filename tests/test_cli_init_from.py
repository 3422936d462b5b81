"""``sciformer train --init-from``: fine-tuning a run from another run's weights.

Oracles: bit equality with the source checkpoint's tensors (loaded) and with a run built
without --init-from from the same seed (re-initialised, i.e. the fresh initialisation).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import yaml
from synthetic import make_hsi_scene

import sciformer
from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint
from sciformer.engine.inference import load_for_inference
from sciformer.engine.launch import prepare_training
from sciformer.engine.trainer import Trainer


@pytest.fixture
def source(toy_config: Path, tmp_path: Path) -> Path:
    """A finished one-epoch toy run (3 classes, 4 input channels)."""
    run = tmp_path / "source"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    return run


def _trainer(config: Path, run: Path, overrides: list[str], init_from: Path | None) -> Trainer:
    exp, run_dir, state = prepare_training(config, overrides, output_dir=run, init_from=init_from)
    return Trainer(exp, run_dir, resume_state=state, log=lambda *a, **k: None)


def test_equal_classes_load_every_tensor_and_predict_as_the_source(source: Path, toy_config: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    best = source / "checkpoints" / "best.pt"
    trainer = _trainer(toy_config, tmp_path / "a", [], source)
    src_state = load_checkpoint(best)["model"]
    assert all(torch.equal(v, src_state[k]) for k, v in trainer.model.state_dict().items())
    _, _, src_model, _ = load_for_inference(best, [])
    x = torch.randn(7, 4)
    trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(trainer.model({"x": x}), src_model({"x": x}))

    capsys.readouterr()
    run = tmp_path / "b"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "--init-from", str(source)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("init-from")]
    assert lines == [f"init-from {best}: loaded 4 of 4 tensors"]
    assert lines[0] in (run / "train.log").read_text()
    # reproducible: the run's config names the checkpoint file, env.json its digest
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["init_from"] == str(best.resolve())
    env = json.loads((run / "env.json").read_text())["init_from"]
    assert env["sha256"] == hashlib.sha256(best.read_bytes()).hexdigest() and env["loaded"] == env["tensors"] == 4
    capsys.readouterr()
    assert main(["train", "-c", str(run / "config.yaml"), "-o", str(tmp_path / "again")]) == 0
    assert f"init-from {best}: loaded 4 of 4 tensors" in capsys.readouterr().out


def test_other_class_count_reinitialises_only_the_head(source: Path, toy_config: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    fine = _trainer(toy_config, tmp_path / "fine", ["data.num_classes=4"], source).model.state_dict()
    fresh = _trainer(toy_config, tmp_path / "fresh", ["data.num_classes=4"], None).model.state_dict()
    src_state = load_checkpoint(source / "checkpoints" / "best.pt")["model"]
    for key, value in fine.items():
        expected = fresh[key] if key.startswith("net.3.") else src_state[key]  # net.3: the head
        assert torch.equal(value, expected), key
    assert not torch.equal(fine["net.0.weight"], fresh["net.0.weight"])  # the oracle tells the two apart

    capsys.readouterr()
    result = sciformer.train(toy_config, ["data.num_classes=4"], output_dir=tmp_path / "api", init_from=source)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("init-from"))
    assert line == (f"init-from {source / 'checkpoints' / 'best.pt'}: loaded 2 of 4 tensors; "
                    "re-initialised net.3.weight, net.3.bias (shape differs: 3 -> 4 classes)")
    assert len(result.metrics["per_class"]) == 4


def _scene(folder: Path, bands: int, classes: int, seed: int) -> Path:
    folder.mkdir()
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=bands, classes=classes, block=4, seed=seed)
    scipy.io.savemat(folder / "scene.mat", {"cube": cube.astype(np.float32), "labels": gt.astype(np.uint8)})
    cfg = folder / "exp.yaml"
    cfg.write_text(
        "name: tiny_hsi\n"
        "data: {name: hsi_scene, source: scene.mat, patch_size: 3, split: {kind: stratified, train_per_class: 20, val_fraction: 0.2}}\n"
        "model: {name: spectral_spatial, dim: 16, depth: 1, num_heads: 2, band_group_size: 3}\n"
        "train: {epochs: 1, batch_size: 16, progress: never, threads: 1}\n"
    )
    return cfg


def test_other_band_count_loads_and_trains(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src_cfg, dst_cfg = _scene(tmp_path / "a", bands=9, classes=3, seed=0), _scene(tmp_path / "b", bands=14, classes=2, seed=1)
    src = tmp_path / "src"
    assert main(["train", "-c", str(src_cfg), "-o", str(src)]) == 0
    capsys.readouterr()
    assert main(["train", "-c", str(dst_cfg), "-o", str(tmp_path / "dst"), "--init-from", str(src / "checkpoints" / "best.pt")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("init-from"))
    n = len(load_checkpoint(src / "checkpoints" / "best.pt")["model"])
    assert line.endswith(f": loaded {n - 2} of {n} tensors; re-initialised head.weight, head.bias (shape differs: 3 -> 2 classes)")
    assert json.loads((tmp_path / "dst" / "metrics.json").read_text())["oa"] >= 0.0


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--resume", "RUN"], "--init-from starts a new run from a checkpoint's weights, --resume continues a run"),
    (["-c", "CFG", "-o", "OUT", "train.init_from=missing.pt"], "missing.pt' does not exist"),
])
def test_usage_errors_are_one_line(extra: list[str], fragment: str, source: Path, toy_config: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    args = [a.replace("RUN", str(source)).replace("CFG", str(toy_config)).replace("OUT", str(tmp_path / "x")) for a in extra]
    if "--resume" in args:
        args += ["--init-from", str(source)]
    capsys.readouterr()
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "x").exists()


def test_a_relative_init_from_in_a_yaml_is_recorded_absolute(source: Path, tmp_path: Path) -> None:
    """train.init_from in a YAML is relative to the YAML's folder; the run's config.yaml (read from
    another folder) must name the checkpoint file itself, so that the run can be repeated from it."""
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "exp.yaml").write_text("name: toy\ndata: {name: toy_blobs}\nmodel: {name: toy_mlp, hidden: 8}\n"
                                     "train: {epochs: 1, batch_size: 16, progress: never, threads: 1, init_from: ../source}\n")
    run = tmp_path / "deep" / "er" / "run"
    assert main(["train", "-c", str(folder / "exp.yaml"), "-o", str(run)]) == 0
    best = source / "checkpoints" / "best.pt"
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["init_from"] == str(best.resolve())
    assert main(["train", "-c", str(run / "config.yaml"), "-o", str(tmp_path / "again")]) == 0


def test_a_change_of_band_placement_is_said_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Weights whose band positions meant wavelengths, loaded into a run that places bands by index
    (or the reverse), load by name and shape alike; the run says so and env.json records the source's placement."""
    cfg = _scene(tmp_path / "a", bands=9, classes=3, seed=0)
    centres = "data.wavelengths=[" + ",".join(str(400 + 50 * i) for i in range(9)) + "]"
    src = tmp_path / "src"
    assert main(["train", "-c", str(cfg), "-o", str(src), centres]) == 0  # position_source auto: by wavelength
    for name, extra, said in [("same", [centres], None), ("index", [centres, "model.position_source=index"], "band index"),
                              ("none", [], "band index")]:
        capsys.readouterr()
        assert main(["train", "-c", str(cfg), "-o", str(tmp_path / name), "--init-from", str(src), *extra]) == 0
        notes = [ln for ln in capsys.readouterr().out.splitlines() if "placed bands by" in ln]
        assert json.loads((tmp_path / name / "env.json").read_text())["init_from"]["band_placement"] == "wavelength"
        if said is None:
            assert notes == []
        else:
            assert notes == [f"note: the loaded weights placed bands by wavelength, this run places them by {said}: their band "
                             "positions mean other bands here (the encoder still transfers; the positions are relearned)"]
