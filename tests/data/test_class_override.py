"""Class names against the checkpoint's, for every dataset (``sciformer.data.predicting``): the
model's class k is the checkpoint's k-th class, so data whose classes are named otherwise or
ordered otherwise is refused in one line naming both, by ``evaluate`` and ``predict`` alike;
a checkpoint whose classes were never named (``class_1``, ...) takes names for them. A table of
codes keeps the checkpoint's classes in order and may change their codes (with a note).

Oracles: the names written in the test (hyperspectral ``data.class_names``, a ModelNet
``shape_names.txt`` in another order) and the per-class table ``evaluate`` writes."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml
from synthetic import make_hsi_scene, write_modelnet_h5, write_tiny_hsi_config

import sciformer
from sciformer.cli import main
from sciformer.data.predicting import check_class_names, table_as_given
from sciformer.errors import CheckpointError

TABLE = {"ground": [2], "vegetation": [3, 4, 5], "building": [6], "other": []}


def test_same_names_pass_and_others_are_refused_naming_both() -> None:
    check_class_names(["a", "b"], ("a", "b"), "data.classes")
    check_class_names(["class_1", "class_2"], ["road", "tree"], "data.class_names")  # never named: names for them
    with pytest.raises(CheckpointError) as err:
        check_class_names(["a", "b", "c"], ["b", "a", "c"], "data.class_names")
    assert str(err.value) == ("data.class_names lists the classes b, a, c; the checkpoint's model predicts a, b, c, in that order "
                              "(class 0 is 'b' here, 'a' in the checkpoint): give its class names in its order (the codes a class takes may change)")
    with pytest.raises(CheckpointError, match=r"\(3 classes here, 2 in the checkpoint\)"):
        check_class_names(["a", "b"], ["a", "b", "c"], "this data")
    with pytest.raises(CheckpointError, match="class 1 is 'road' here"):
        check_class_names(["class_1", "class_2", "c"], ["class_1", "road", "c"], "x")  # one class named: no exemption


def test_table_as_given_keeps_the_codes_and_notes_them(capsys: pytest.CaptureFixture) -> None:
    assert table_as_given(TABLE, dict(TABLE), "other", "other") == TABLE
    assert capsys.readouterr().err == ""  # the trained table repeated: nothing to say
    recoded = {**TABLE, "building": [6, 7]}
    assert table_as_given(TABLE, recoded, "other", "ignore") == recoded
    assert capsys.readouterr().err.strip() == ("note: data.classes recodes the checkpoint's classes (building [6] -> [6, 7]; "
                                               "unmapped other -> ignore): labels are read, and classes written, with these codes")
    with pytest.raises(CheckpointError, match="lists the classes vegetation, ground, building, other; the checkpoint's model "
                                              "predicts ground, vegetation, building, other"):
        table_as_given(TABLE, {k: TABLE[k] for k in ("vegetation", "ground", "building", "other")}, "other", "other")


# --------------------------------------------------------------------------- hyperspectral


@pytest.fixture(scope="module")
def hsi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hsi_names")
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=8, classes=3, block=4)
    np.save(root / "cube.npy", cube)
    np.save(root / "gt.npy", gt)
    write_tiny_hsi_config(root, "source: cube.npy, label_path: gt.npy, class_names: [corn, wheat, soy]", name="named")
    assert main(["train", "-c", str(root / "tiny.yaml"), "-o", str(root / "named")]) == 0
    write_tiny_hsi_config(root, "source: cube.npy, label_path: gt.npy", name="unnamed")
    assert main(["train", "-c", str(root / "tiny.yaml"), "-o", str(root / "unnamed")]) == 0
    return root


def _per_class_names(folder: Path) -> list[str]:
    with open(folder / "per_class.csv") as fh:
        return [row[1] for row in list(csv.reader(fh))[1:]]


def test_hsi_reordered_class_names_are_refused(hsi: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    swapped = "data.class_names=[wheat, corn, soy]"
    assert main(["evaluate", "--checkpoint", str(hsi / "named"), "-o", str(tmp_path / "ev"), swapped]) == 2
    err = capsys.readouterr().err
    assert "data.class_names lists the classes wheat, corn, soy; the checkpoint's model predicts corn, wheat, soy" in err
    assert not (tmp_path / "ev").exists()
    assert main(["predict", "--checkpoint", str(hsi / "named"), "-i", str(hsi / "cube.npy"), "-o", str(tmp_path / "m.npy"), swapped]) == 2
    assert "the checkpoint's model predicts corn, wheat, soy, in that order" in capsys.readouterr().err
    assert not (tmp_path / "m.npy").exists()
    assert main(["evaluate", "--checkpoint", str(hsi / "named"), "-o", str(tmp_path / "same"), "data.class_names=[corn, wheat, soy]"]) == 0
    assert _per_class_names(tmp_path / "same") == ["corn", "wheat", "soy"]


def test_hsi_names_for_a_checkpoint_s_unnamed_classes(hsi: Path, tmp_path: Path) -> None:
    names = "data.class_names=[road, tree, roof]"
    assert main(["evaluate", "--checkpoint", str(hsi / "unnamed"), "-o", str(tmp_path / "ev"), names]) == 0
    assert _per_class_names(tmp_path / "ev") == ["road", "tree", "roof"]
    out = tmp_path / "map.hdr"  # predict names them alike (ENVI class names)
    assert main(["predict", "--checkpoint", str(hsi / "unnamed"), "-i", str(hsi / "cube.npy"), "-o", str(out), names]) == 0
    header = out.read_text().replace("\n", " ")
    assert "road" in header and "tree" in header and "roof" in header and "class_1" not in header
    model = sciformer.load(hsi / "unnamed", overrides={"data.class_names": ["road", "tree", "roof"]})  # the Python API alike
    assert model.class_names == model.predict(np.load(hsi / "cube.npy")).class_names == ["road", "tree", "roof"]
    with pytest.raises(CheckpointError, match="data.class_names lists the classes wheat, corn, soy; the checkpoint's model predicts corn"):
        sciformer.load(hsi / "named", overrides=["data.class_names=[wheat, corn, soy]"])


# --------------------------------------------------------------------------- ModelNet


def test_modelnet_test_set_naming_its_classes_in_another_order(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    classes = ["chair", "desk", "lamp"]
    cfg = {
        "name": "mn_names",
        "data": {"name": "modelnet", "root": str(write_modelnet_h5(tmp_path / "mn", classes, per_class=(6, 2), points=48)),
                 "num_points": 48, "features": [], "val_fraction": 0.25},
        "model": {"name": "point_transformer_cls", "channels": [8, 16], "blocks": [0, 1], "strides": [1, 4], "k": 4, "head_hidden": [16]},
        "train": {"epochs": 1, "batch_size": 6, "progress": "never", "threads": 1},
    }
    (tmp_path / "mn.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "-c", str(tmp_path / "mn.yaml"), "-o", str(tmp_path / "run")]) == 0
    other = write_modelnet_h5(tmp_path / "mn2", ["desk", "chair", "lamp"], per_class=(6, 2), points=48)  # label 0 is a desk there
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run"), "-o", str(tmp_path / "ev"), f"data.root={other}"]) == 2
    err = capsys.readouterr().err
    assert "this data lists the classes desk, chair, lamp; the checkpoint's model predicts chair, desk, lamp, in that order" in err
    same = write_modelnet_h5(tmp_path / "mn3", classes, per_class=(6, 2), points=48)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run"), "-o", str(tmp_path / "ev3"), f"data.root={same}"]) == 0


# --------------------------------------------------------------------------- point_scenes


def test_point_scenes_predict_reads_and_writes_a_recoded_table(data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A model that predicts each point's own label (read through the table) writes each class's first code."""
    import torch

    from sciformer.contracts import PredictOptions
    from sciformer.data.pointcloud.point_scenes import PointScenesConfig, predict_point_scenes_file

    laspy = pytest.importorskip("laspy")
    source = data_root / "lidar" / "las_warsaw_small.las"
    trained = {"ground": [2], "vegetation": [3, 4, 5], "other": []}
    state = {"class_names": list(trained), "classes": trained, "features": [], "grid_size": None, "eval_max_points": 60000,
             "columns": None, "unmapped": "other"}

    def own_label(batch: dict) -> torch.Tensor:
        return torch.nn.functional.one_hot(batch["target"].clamp(min=0), 3).float() * 4  # (n, 3)

    def run(table: dict, out: Path) -> Path:
        cfg = PointScenesConfig(root=str(tmp_path), train_files=[str(source)], val_files=[], classes=table, unmapped="other")
        return predict_point_scenes_file(cfg, state, own_label, source, out, 16, options=PredictOptions())

    out = run({"ground": [2, 3], "vegetation": [4, 5], "other": []}, tmp_path / "recoded.las")  # code 3 is ground now
    assert "ground [2] -> [2, 3]; vegetation [3, 4, 5] -> [4, 5]" in capsys.readouterr().err
    original = np.asarray(laspy.read(source).classification)
    assert 3 in original
    expected = np.where(np.isin(original, [2, 3]), 2, np.where(np.isin(original, [4, 5]), 4, 1))
    np.testing.assert_array_equal(np.asarray(laspy.read(out).classification), expected)
    with pytest.raises(CheckpointError, match="lists the classes vegetation, ground, other; the checkpoint's model predicts ground"):
        run({"vegetation": [3, 4, 5], "ground": [2], "other": []}, tmp_path / "reordered.las")
    assert not (tmp_path / "reordered.las").exists()
