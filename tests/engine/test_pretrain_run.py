"""``sciformer pretrain`` end to end on a tiny scene: what it writes, what it refuses, and
how ``train --init-from`` starts from it.

Oracles: the checkpoint's tensors against the fine-tuning model's before its first step;
two runs of one seed bit-equal; the pixels used against the scene's size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from synthetic import write_hsi_experiment

import sciformer
from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint
from sciformer.engine.compare import compare_runs
from sciformer.engine.launch import prepare_training
from sciformer.engine.trainer import Trainer
from sciformer.errors import ConfigError


@pytest.fixture
def scene(tmp_path: Path) -> Path:
    return write_hsi_experiment(tmp_path, bands=12, train="epochs: 1, batch_size: 32, progress: never")


def _pretrain(cfg: Path, out: Path, *extra: str) -> int:
    return main(["pretrain", "-c", str(cfg), "-o", str(out), "--epochs", "3", "--band-group", "3", *extra])


def test_pretrain_writes_the_encoder_and_train_starts_from_it(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pre = tmp_path / "pre"
    assert _pretrain(scene, pre) == 0
    record = json.loads((pre / "pretrain.json").read_text())
    assert record["pixels_used"] == 16 * 18  # every pixel of the scene, unlabelled ones included
    losses = [row["train_loss"] for row in record["history"]]
    assert len(losses) == 3 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert len((pre / "metrics.csv").read_text().splitlines()) == 1 + 3
    state = load_checkpoint(pre / "checkpoints" / "best.pt")
    assert state["pretrain"]["mask_ratio"] == 0.5 and not any(k.startswith("head.") for k in state["model"])

    capsys.readouterr()
    exp, run_dir, _ = prepare_training(scene, [], output_dir=tmp_path / "fine", init_from=pre)
    model = Trainer(exp, run_dir, log=print).model.state_dict()
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("init-from"))
    assert line.endswith(f"loaded {len(model) - 2} of {len(model)} tensors; re-initialised head.weight, head.bias (not in the checkpoint)")
    for key, value in state["model"].items():
        assert torch.equal(model[key], value), key
    assert "note: the encoder was pre-trained without labels on every pixel of 'scene.mat', test pixels included" in out  # said
    assert main(["train", "-c", str(scene), "-o", str(tmp_path / "run"), "--init-from", str(pre)]) == 0
    for name in ("env.json", "metrics.json"):  # the fine-tuned run records how its encoder was pre-trained
        data = json.loads((tmp_path / "run" / name).read_text())
        pretrained = data["init_from"]["pretrain"] if name == "env.json" else data["pretrained"]
        assert pretrained["pixels"] == "all" and pretrained["mask_ratio"] == 0.5 and pretrained["band_group"] == 3


def test_a_pre_training_on_another_split_is_said(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _pretrain(scene, tmp_path / "same", "--pixels", "train") == 0
    assert _pretrain(scene, tmp_path / "other", "--pixels", "train", "--seed", "7") == 0
    for source, said in (("same", False), ("other", True)):
        capsys.readouterr()
        exp, run_dir, _ = prepare_training(scene, [], output_dir=tmp_path / f"fine-{source}", init_from=tmp_path / source)
        Trainer(exp, run_dir, log=print)
        out = capsys.readouterr().out
        assert ("pre-trained on the training pixels of another split (seed 7" in out) == said, out


def test_one_seed_reproduces_from_the_command_line_and_python_and_train_pixels_are_the_training_split(scene: Path, tmp_path: Path) -> None:
    assert _pretrain(scene, tmp_path / "a", "--seed", "4") == 0
    sciformer.pretrain(yaml.safe_load(scene.read_text()), seed=4, epochs=3, band_group=3, output_dir=tmp_path / "b",
                       base_dir=scene.parent)  # the Python API, from a dict: the same run
    a, b = (load_checkpoint(tmp_path / n / "checkpoints" / "best.pt")["model"] for n in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _pretrain(scene, tmp_path / "c", "--pixels", "train") == 0
    train_pixels = int((np.load(tmp_path / "c" / "splits.npz")["train"] > 0).sum())  # the split the normaliser was fitted on
    assert json.loads((tmp_path / "c" / "pretrain.json").read_text())["pixels_used"] == train_pixels < 16 * 18


def test_refusals_are_one_line_and_leave_nothing(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pre = tmp_path / "pre"
    assert _pretrain(scene, pre) == 0
    for args in (["evaluate", "--checkpoint", str(pre)], ["predict", "--checkpoint", str(pre), "-i", str(tmp_path / "scene.mat"), "-o", str(tmp_path / "m.npy")]):
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "pre-trained weights without a classifier" in err and "--init-from" in err
    assert not (tmp_path / "m.npy").exists()
    capsys.readouterr()
    assert _pretrain(scene, pre) == 2 and "already holds a run" in capsys.readouterr().err
    former = tmp_path / "former.yaml"
    former.write_text(scene.read_text().replace("band_group_size: 3", "group_size: 3").replace("spectral_spatial", "spectralformer"))
    for cfg, extra, match in ((former, [], "needs model 'spectral_spatial'"), (scene, ["--mask-ratio", "1"], "mask-ratio"),
                              (scene, ["--epochs", "0"], "--epochs"), (scene, ["--band-group", "12"], "every band would be hidden"),
                              (scene, ["--pixel-ratio", "0.05"], "hides no pixel of a 3 x 3 patch"),
                              (scene, [f"train.init_from={pre}"], "train.init_from does not apply")):
        out = tmp_path / f"bad{len(extra)}{extra[0][-2:] if extra else ''}"
        assert _pretrain(cfg, out, *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err
        assert not out.exists()  # a refused run leaves no folder


def test_a_failed_write_keeps_nothing_and_bad_api_types_are_one_line(scene: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import sciformer.engine.pretrain as engine

    def full(path: Path, payload: dict) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(engine, "save_checkpoint", full)
    assert _pretrain(scene, tmp_path / "full") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "nothing was kept" in err
    assert not (tmp_path / "full").exists()  # no record that looks like a finished pre-training
    monkeypatch.undo()
    for bad in ({"epochs": 2.5}, {"epochs": True}, {"band_group": "3"}, {"mask_ratio": "0.5"}):
        with pytest.raises(ConfigError, match="pretrain"):
            sciformer.pretrain(scene, output_dir=tmp_path / "api", **bad)
    assert not (tmp_path / "api").exists()


def test_compare_and_report_read_pretraining_folders(scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """compare shows the pre-training settings that differ (from pretrain.json) and the last masked-band loss."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert _pretrain(scene, a) == 0 and _pretrain(scene, b, "--mask-ratio", "0.25") == 0
    rows = [ln.split(",") for ln in (a / "metrics.csv").read_text().splitlines()]
    assert rows[0] == ["epoch", "train_loss", "lr", "epoch_time_s"] and all(float(r[2]) > 0 for r in rows[1:])
    header, table = compare_runs([a, b])
    assert "pretrain.mask_ratio" in header and "pretrain_loss" in header and "pretrain.band_group" not in header
    col, loss = header.index("pretrain.mask_ratio"), header.index("pretrain_loss")
    assert [float(r[col]) for r in table] == [0.5, 0.25]
    for run, row in zip((a, b), table):
        assert float(row[loss]) == pytest.approx(json.loads((run / "pretrain.json").read_text())["history"][-1]["train_loss"], rel=1e-3)
    capsys.readouterr()
    assert main(["report", str(a)]) == 0 and (a / "curves.png").is_file()


def test_pretrain_json_comes_after_the_checkpoint_and_compare_needs_both(scene: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill between the writes must not leave a folder that looks finished: pretrain.json (the mark
    compare reads) is written after checkpoints/best.pt, and compare wants the checkpoint too."""
    import sciformer.engine.pretrain as engine

    real, seen = engine.save_checkpoint, []

    def save(path: Path, payload: dict) -> None:
        seen.append((path.parent.parent / "pretrain.json").exists())
        real(path, payload)

    monkeypatch.setattr(engine, "save_checkpoint", save)
    run = tmp_path / "run"
    assert _pretrain(scene, run) == 0
    assert seen == [False] and (run / "pretrain.json").is_file()
    header, table = compare_runs([run])
    assert table[0][header.index("status")] == "finished"
    (run / "checkpoints" / "best.pt").unlink()  # what a kill between the writes of an older version left
    header, table = compare_runs([run])
    assert table[0][header.index("status")] == "unfinished: no checkpoints/best.pt"


def test_an_unlabelled_scene_is_refused_saying_why_pretrain_reads_labels(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from synthetic import make_hsi_scene, write_tiny_hsi_config

    cube, _, _ = make_hsi_scene(h=16, w=18, bands=12, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube)  # no label map anywhere
    cfg = write_tiny_hsi_config(tmp_path, "source: cube.npy")
    assert _pretrain(cfg, tmp_path / "pre") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cube.npy: no 2-D integer label map" in err, err
    assert "pretrain needs the scene's label map too: the experiment's split is drawn from it" in err, err
    assert not (tmp_path / "pre").exists()
