"""The point_scenes dataset on the real SemanticKITTI scans and on small files of every format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sciformer.contracts import BuildContext, PredictOptions
from sciformer.data.pointcloud.io import read_point_file, write_ply
from sciformer.data.pointcloud.point_scenes import (
    PointScenesConfig,
    build_point_scenes,
    class_table,
    map_labels,
    predict_point_scenes_file,
)
from sciformer.errors import DataError
from sciformer.registry import DATASETS

KITTI = {"car": [1], "road": [9], "building": [13], "vegetation": [15]}


def kitti_cfg(root: Path, **kw) -> PointScenesConfig:
    base = {"root": str(root), "train_files": ["seq01_00000[01]_points.npy"], "val_files": ["seq01_000002_points.npy"],
                "test_files": ["demo_000700_points.npy"], "label_files": ("_points.npy", "_labels.npy"), "classes": KITTI}
    return PointScenesConfig(**{**base, **kw})


def test_registered_with_a_predictor() -> None:
    assert DATASETS.get("point_scenes").predictor is predict_point_scenes_file


def test_label_mapping_against_a_lookup_oracle() -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 30, 500)
    table = class_table({"a": [3, 7], "b": [0], "c": []})
    expected = np.array([{3: 0, 7: 0, 0: 1}.get(int(v), -1) for v in raw])
    np.testing.assert_array_equal(map_labels(raw, table, "ignore"), expected)
    np.testing.assert_array_equal(map_labels(raw, table, "c"), np.where(expected == -1, 2, expected))
    assert class_table(["x", "y"]) == {"x": [0], "y": [1]}  # a list: label value k is class k
    with pytest.raises(ValidationError, match="label value 3 is already class 'a'"):
        PointScenesConfig(train_files=["a"], val_files=["b"], classes={"a": [3], "b": [3]})
    with pytest.raises(ValidationError, match="unmapped: 'other' is neither"):
        PointScenesConfig(train_files=["a"], val_files=["b"], classes=["a"], unmapped="other")


def test_real_scans_with_sibling_label_files(data_root: Path, ctx: BuildContext) -> None:
    root = data_root / "semantickitti_scans"
    task = build_point_scenes(kitti_cfg(root, grid_size=0.5, crop_points=1000), ctx)
    assert task.info.class_names == list(KITTI) and task.info.in_channels == 0
    assert task.describe()["files"] == {"train": ["seq01_000000_points.npy", "seq01_000001_points.npy"],
                                        "val": ["seq01_000002_points.npy"], "test": ["demo_000700_points.npy"]}
    scene = task.scene("test", 0)
    raw = np.load(root / "demo_000700_labels.npy").reshape(-1)
    np.testing.assert_array_equal(scene["coord"], np.load(root / "demo_000700_points.npy").astype(np.float64))
    oracle = np.select([raw == 1, raw == 9, raw == 13, raw == 15], [0, 1, 2, 3], default=-1)
    np.testing.assert_array_equal(scene["label"], oracle)
    item = task.dataset("train")[0]
    assert len(item["coord"]) == 1000 and item["feat"].shape == (1000, 0)
    assert item["coord"][:, 2].min() == pytest.approx(0.0, abs=1e-5)  # z from the crop's lowest point


def test_absolute_paths_and_globs(data_root: Path, ctx: BuildContext, tmp_path: Path, one_line_error) -> None:
    root = data_root / "semantickitti_scans"
    cfg = kitti_cfg(tmp_path, train_files=[str(root / "seq01_00000[01]_points.npy")],
                    val_files=[str(root / "seq01_000002_points.npy")], test_files=[])
    task = build_point_scenes(cfg, ctx)
    assert task.describe()["files"]["val"] == [str(root / "seq01_000002_points.npy")]
    assert len(task.dataset("test")) == 0 and task.describe()["test"] == "none (data.test_files: [])"
    with pytest.raises(DataError) as err:
        build_point_scenes(kitti_cfg(root, val_files=["nothing_*.npy"]), ctx)
    one_line_error(err, "data.val_files: 'nothing_*.npy' matches no file")
    with pytest.raises(DataError) as err:
        build_point_scenes(kitti_cfg(root, val_files=["seq01_000001_points.npy"]), ctx)
    one_line_error(err, "also in data.train_files")


def test_no_validation_files_is_a_refit_on_every_labelled_file(data_root: Path, ctx: BuildContext) -> None:
    """``val_files: []``: every labelled scan trains, the validation split is empty (the trainer then keeps
    the last epoch as best.pt), and a file still belongs to one split only."""
    root = data_root / "semantickitti_scans"
    task = build_point_scenes(kitti_cfg(root, train_files=["seq01_00000[012]_points.npy"], val_files=[], grid_size=0.5,
                                        crop_points=1000), ctx)
    assert task.describe()["files"]["train"] == [f"seq01_00000{i}_points.npy" for i in range(3)]
    assert task.describe()["files"]["val"] == [] and len(task.dataset("val")) == 0
    assert len(task.dataset("train")) == 3 and len(task.dataset("test")) == 1
    with pytest.raises(ValidationError, match="val_files"):  # only an explicit [] means a refit, not a forgotten key
        PointScenesConfig(train_files=["a.npy"], classes=["a"])
    with pytest.raises(DataError, match="also in data.train_files"):
        build_point_scenes(kitti_cfg(root, train_files=["seq01_*_points.npy"], val_files=[],
                                     test_files=["seq01_000002_points.npy"]), ctx)


def test_formats_with_a_label_field(tmp_path: Path, ctx: BuildContext) -> None:
    """PLY with a 'class' field, a text table and a KITTI-style .bin scan with its .label file."""
    rng = np.random.default_rng(1)
    coord = rng.normal(size=(300, 3))
    label = rng.integers(0, 3, 300)
    write_ply(tmp_path / "a.ply", coord, **{"class": label.astype(np.int32)})
    np.savetxt(tmp_path / "b.txt", np.column_stack([coord, label]), header="x y z label", comments="//")
    np.column_stack([coord, np.ones(300)]).astype("<f4").tofile(tmp_path / "c.bin")
    label.astype("<u4").tofile(tmp_path / "c.label")
    base = {"root": str(tmp_path), "classes": ["p", "q", "r"], "grid_size": None, "crop_points": None}
    task = build_point_scenes(PointScenesConfig(train_files=["a.ply"], val_files=["b.txt"], **base), ctx)
    np.testing.assert_array_equal(task.scene("val", 0)["label"], label)
    bins = PointScenesConfig(train_files=["c.bin"], val_files=["c.bin"], columns=["x", "y", "z", "intensity"],
                             label_files=(".bin", ".label"), features=["intensity"], **base)
    with pytest.raises(DataError, match="splits must not share files"):
        build_point_scenes(bins, ctx)
    with pytest.raises(DataError, match="data.features uses 'intensity' but the file has no intensity"):
        build_point_scenes(PointScenesConfig(train_files=["a.ply"], val_files=["b.txt"], features=["intensity"], **base),
                           ctx).scene("val", 0)
    np.column_stack([coord, np.full(300, 2.0)]).astype("<f4").tofile(tmp_path / "d.bin")  # not a copy of c.bin
    label.astype("<u4").tofile(tmp_path / "d.label")
    train = build_point_scenes(bins.model_copy(update={"val_files": ["d.bin"]}), ctx).dataset("train")[0]
    np.testing.assert_array_equal(train["label"], label)
    np.testing.assert_allclose(train["feat"][:, 0], 1.0)


def test_predictor_keeps_every_point(tmp_path: Path, ctx: BuildContext) -> None:
    rng = np.random.default_rng(2)
    coord = rng.normal(size=(400, 3)) * 5
    label = (coord[:, 0] > 0).astype(np.int32)
    coord[[3, 50]] = np.nan
    np.save(tmp_path / "scan.npy", np.column_stack([coord, label]))
    cfg = PointScenesConfig(root=str(tmp_path), train_files=["scan.npy"], val_files=["scan.npy"], classes=["w", "e"],
                            columns=["x", "y", "z", "label"], eval_max_points=150)
    state = {"class_names": ["w", "e"], "classes": {"w": [0], "e": [1]}, "features": [], "grid_size": None,
             "eval_max_points": 150, "columns": "x,y,z,label", "unmapped": "ignore"}

    def oracle(batch):  # class from the chunk's label, so predictions must come back in input order
        import torch

        return torch.nn.functional.one_hot(batch["target"].clamp(min=0), 2).float() * 4

    out = predict_point_scenes_file(cfg, state, oracle, tmp_path / "scan.npy", tmp_path / "out.ply", 16,
                                    options=PredictOptions(overlap=0.5))
    ply = read_point_file(out, keep_invalid=True)
    assert len(ply["pred"]) == 400
    expected = label.copy()
    expected[[3, 50]] = -1
    np.testing.assert_array_equal(ply["pred"], expected)
    np.testing.assert_array_equal(ply["valid"], expected >= 0)


def test_text_table_nan_rows_kept_for_prediction(tmp_path: Path) -> None:
    """A text cloud with NaN rows: refused for training data, every row kept when predicting."""
    path = tmp_path / "scan.xyz"
    path.write_text("0 0 0\nnan nan nan\n1 1 1\n")
    with pytest.raises(DataError, match="expected 3 numbers"):
        read_point_file(path)
    data = read_point_file(path, keep_invalid=True)
    assert data["coord"].shape == (3, 3) and np.isnan(data["coord"][1]).all()


def test_geometric_feature_rows_cache_and_predict(tmp_path: Path, ctx: BuildContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """``geometric`` on point_scenes: the rows of the whole file (oracle: geometric_features on the
    file's usable points), cached per file, and recomputed identically by the predictor, where a
    NaN point and a point beyond float32 get no data and leave the others' features unchanged."""
    import torch

    from sciformer.data.pointcloud import geometric

    rng = np.random.default_rng(5)
    coord = rng.uniform(0, 20, size=(900, 3)) * [1, 1, 0.2]
    label = (coord[:, 2] > 2).astype(np.int64)
    np.save(tmp_path / "a.npy", np.column_stack([coord, label]))
    np.save(tmp_path / "b.npy", np.column_stack([coord, label])[::-1])  # not a copy: splits must not share one
    cfg = PointScenesConfig(root=str(tmp_path), train_files=["a.npy"], val_files=["b.npy"], classes=["low", "high"],
                            columns=["x", "y", "z", "label"], features=["geometric"], eval_max_points=500)
    task = build_point_scenes(cfg, ctx)
    assert task.info.in_channels == geometric.channels() == 35
    state = task.state()
    assert state["geometric"] == geometric.geometric_state()
    whole = geometric.geometric_features(coord)
    files = task.dataset("train").source
    np.testing.assert_array_equal(files.load(0)["geometric"], whole)
    assert task.dataset("train")[0]["feat"].shape[1] == 35

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("recomputed instead of read from the cache")

    monkeypatch.setattr("sciformer.data.pointcloud.geometric.geometric_features", refuse)
    np.testing.assert_array_equal(build_point_scenes(cfg, ctx).dataset("train").source.load(0)["geometric"], whole)
    monkeypatch.undo()

    def oracle(batch: dict[str, torch.Tensor]) -> torch.Tensor:  # scores read off two geometric channels
        return batch["feat"][:, [33, 34]] * torch.tensor([-1.0, 1.0])  # (N, 2)

    bad = coord.copy()
    bad[7] = np.nan
    bad[8] = [1e300, 0.0, 0.0]  # finite in float64, not in float32: not a usable point
    np.save(tmp_path / "c.npy", np.column_stack([bad, label]))
    saved = {**state, "class_names": ["low", "high"]}
    out = np.load(predict_point_scenes_file(cfg, saved, oracle, tmp_path / "c.npy", tmp_path / "c_pred.npy", 4))
    keep = np.setdiff1d(np.arange(900), [7, 8])
    rows = geometric.geometric_features(coord[keep])
    expected = np.where(rows[:, 34] > -rows[:, 33], 1, 0)
    assert out[7] == out[8] == -1
    np.testing.assert_array_equal(out[keep], expected)
    with pytest.raises(DataError, match="geometric features of version 0"):
        predict_point_scenes_file(cfg, {**saved, "geometric": {**saved["geometric"], "version": 0}}, oracle,
                                  tmp_path / "c.npy", tmp_path / "d.npy", 4)


def test_las_output_codes_follow_the_las_tiles_rule(data_root: Path, tmp_path: Path) -> None:
    """A class without label values ('other: []', the unmapped catch-all) is written to LAS as 1
    (unclassified), as las_tiles writes it, never as its class index (2 = ground's code)."""
    laspy = pytest.importorskip("laspy")
    source = data_root / "lidar" / "las_warsaw_small.las"
    table = {"ground": [2], "vegetation": [3, 4, 5], "other": []}
    cfg = PointScenesConfig(root=str(tmp_path), train_files=[str(source)], val_files=[str(source)], classes=table, unmapped="other")
    state = {"class_names": list(table), "classes": table, "features": [], "grid_size": None, "eval_max_points": 60000,
             "columns": None, "unmapped": "other"}

    def oracle(batch):  # the class of each point's own label: the LAS codes must come back through the table
        import torch

        return torch.nn.functional.one_hot(batch["target"].clamp(min=0), 3).float() * 4

    out = predict_point_scenes_file(cfg, state, oracle, source, tmp_path / "out.las", 16, options=PredictOptions())
    original = np.asarray(laspy.read(source).classification)
    expected = np.where(original == 2, 2, np.where(np.isin(original, [3, 4, 5]), 3, 1))
    assert set(np.unique(original)) - {2, 3, 4, 5}  # the tile has points of the catch-all class
    np.testing.assert_array_equal(np.asarray(laspy.read(out).classification), expected)


def _label_files_checkpoint(monkeypatch: pytest.MonkeyPatch, truth: Path, labels_exist: bool) -> tuple[dict, bytes | None]:
    """A fake point_scenes checkpoint with ``data.label_files: [_points.npy, _labels.npy]``, and
    ``truth`` written first when ``labels_exist``: (the checkpoint, truth's bytes or None). The modules
    that bind load_checkpoint at import are imported first, so the fake never outlives the test."""
    import sciformer.engine.inference  # noqa: F401
    from sciformer.engine import checkpoint

    if labels_exist:
        np.save(truth, np.arange(5))
    state = {"config": {"data": {"name": "point_scenes"}}, "data_state": {"label_files": ["_points.npy", "_labels.npy"]}}
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: state)
    return state, truth.read_bytes() if labels_exist else None


@pytest.mark.parametrize("labels_exist", [True, False])
def test_predict_never_writes_the_label_file_paired_with_its_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str], labels_exist: bool) -> None:
    """With ``data.label_files: [_points.npy, _labels.npy]`` the output ``x_labels.npy`` would be read as
    ``x_points.npy``'s truth (and, existing, is that truth): refused even with --overwrite, before any model loads."""
    from sciformer import cli
    from sciformer.engine import checkpoint

    np.save(tmp_path / "x_points.npy", np.zeros((5, 3), np.float32))
    truth = tmp_path / "x_labels.npy"
    state, before = _label_files_checkpoint(monkeypatch, truth, labels_exist)
    argv = ["predict", "--checkpoint", str(tmp_path / "run"), "--input", str(tmp_path / "x_points.npy"), "--output", str(truth)]
    assert cli.main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "would be read with input" in err and "label file" in err, err
    assert (truth.read_bytes() if labels_exist else truth.exists()) == (before if labels_exist else False)
    other = tmp_path / "x_pred.npy"  # any other name passes this check (and fails later: the checkpoint is fake)
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: {**state, "config": {"data": {"name": "nope"}}})
    assert cli.main([*argv[:-1], str(other)]) == 2
    assert "would be read with input" not in capsys.readouterr().err


@pytest.mark.parametrize("labels_exist", [True, False])
def test_predict_never_writes_the_label_file_of_another_point_file_of_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], labels_exist: bool) -> None:
    """Predicting ``a_points.npy`` into ``b_labels.npy`` beside ``b_points.npy`` would make (or replace) b's
    truth for the next train / evaluate: refused before any model loads, with or without --overwrite; a
    ``c_labels.npy`` without a ``c_points.npy`` is no one's truth and passes this check."""
    from sciformer import cli
    from sciformer.engine import checkpoint

    for name in ("a", "b"):
        np.save(tmp_path / f"{name}_points.npy", np.zeros((5, 3), np.float32))
    truth = tmp_path / "b_labels.npy"
    state, before = _label_files_checkpoint(monkeypatch, truth, labels_exist)
    argv = ["predict", "--checkpoint", str(tmp_path / "run"), "--input", str(tmp_path / "a_points.npy"), "--output"]
    for extra in ([], ["--overwrite"]):
        assert cli.main([*argv, str(truth), *extra]) == 2
        err = capsys.readouterr().err.strip()
        refused_as = "exists; pass --overwrite" if labels_exist and not extra else "b_points.npy"  # the first check met
        assert len(err.splitlines()) == 1 and refused_as in err, err
        assert (truth.read_bytes() if labels_exist else truth.exists()) == (before if labels_exist else False)
    folder_out = tmp_path / "out"  # a folder output: each input's name, checked the same way
    folder_out.mkdir()
    np.save(folder_out / "a_points.npy", np.zeros((5, 3), np.float32))
    assert cli.main(["predict", "--checkpoint", str(tmp_path / "run"), "--input", str(tmp_path / "a_points.npy"),
                     "--output", f"{folder_out}/", "--format", ".npy"]) == 2
    assert "label file" not in capsys.readouterr().err  # a_points.npy in out/ is no label file name
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: {**state, "config": {"data": {"name": "nope"}}})
    assert cli.main([*argv, str(tmp_path / "c_labels.npy")]) == 2  # passes the check, fails later (fake checkpoint)
    assert "label file" not in capsys.readouterr().err


def test_geometric_rows_follow_the_features_that_decide_the_kept_points(tmp_path: Path, ctx: BuildContext) -> None:
    """One file, trained with [colour, geometric] and then [intensity, geometric] on one cache:
    each drops the rows its own features make invalid (the same count, other rows), and each
    gets the geometric features of its own kept points (oracle: geometric_features on them)."""
    from sciformer.data.pointcloud import geometric

    rng = np.random.default_rng(8)
    coord = rng.uniform(0, 20, size=(400, 3)) * [1, 1, 0.2]
    label = (coord[:, 2] > 2).astype(np.int64)
    rgb, intensity = rng.uniform(0, 255, size=(400, 3)), rng.uniform(0, 1, size=400)
    rgb[5], intensity[9] = np.nan, np.nan  # colour invalid on row 5, intensity on row 9
    for name in ("a", "b"):  # b: another file for validation (splits may not share one)
        table = np.column_stack([coord, rgb, intensity, label])
        np.save(tmp_path / f"{name}.npy", table if name == "a" else table[::-1])
    base = {"root": str(tmp_path), "train_files": ["a.npy"], "val_files": ["b.npy"], "classes": ["low", "high"],
            "columns": ["x", "y", "z", "red", "green", "blue", "intensity", "label"]}
    for features, dropped in ((["colour", "geometric"], 5), (["intensity", "geometric"], 9)):
        task = build_point_scenes(PointScenesConfig(**base, features=features), ctx)
        kept = np.delete(coord, dropped, axis=0)
        np.testing.assert_array_equal(task.dataset("train").source.load(0)["geometric"], geometric.geometric_features(kept))


def test_test_files_sharing_a_name_each_get_their_predictions(tmp_path: Path, ctx: BuildContext) -> None:
    """Two test scenes named t.npy in two folders: one prediction file each, one row per row of its file."""
    import torch

    rng = np.random.default_rng(1)
    for sub, n in (("train", 50), ("a", 40), ("b", 30)):
        (tmp_path / sub).mkdir()
        np.save(tmp_path / sub / "t.npy", np.column_stack([rng.uniform(0, 5, (n, 3)), rng.integers(0, 2, n)]))
    cfg = PointScenesConfig(root=str(tmp_path), train_files=["train/t.npy"], val_files=[], test_files=["a/t.npy", "b/t.npy"],
                            classes=["p", "q"], columns=["x", "y", "z", "label"], crop_points=None)
    task = build_point_scenes(cfg, ctx)
    assert task.scene_names("test") == ["a__t", "b__t"]
    out = tmp_path / "pred"
    task.export_predictions(lambda batch: torch.zeros(len(batch["coord"]), 2), out, 4, {"ply": False, "png": False})  # (N, 2)
    assert sorted(p.name for p in out.iterdir()) == ["a__t_pred.npy", "b__t_pred.npy"]
    assert [len(np.load(out / f"{s}__t_pred.npy")) for s in "ab"] == [40, 30]


@pytest.mark.parametrize(("classes", "message"), [
    ({"a": [1.5]}, "class 'a': label value 1.5 is not an integer"),
    ({"a": [True]}, "class 'a': label value True is not an integer"),
    ({"": [1], "b": [9]}, "class name '' is blank"),
    (["x", " "], "class name ' ' is blank"),
    ({"a\nb": [1]}, "holds a control character"),
    ({"a": [-1], "b": [9]}, "classes.a: label value -1 is the ignore value"),
    ({"a": [2_000_000], "b": [9]}, "classes.a: label value 2000000 is not an id a label can hold"),
])
def test_class_tables_no_label_could_use_are_refused_in_one_line(classes: object, message: str) -> None:
    """A class id that is not an integer (it read "Input should be a valid list"), a blank class
    name (it reached the tables and the .ply header), the ignore value -1, an id beyond any label."""
    with pytest.raises(ValidationError, match=message) as info:
        PointScenesConfig(train_files=["a"], val_files=[], classes=classes)
    assert info.value.error_count() == 1
    assert PointScenesConfig(train_files=["a"], val_files=[], classes={"a": [0, 2.0], "b": [1_000_000]}).classes == {"a": [0, 2], "b": [1_000_000]}
