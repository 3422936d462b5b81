"""``sciformer predict`` on real SemanticKITTI scans: train, evaluate and predict the point_scenes
example from the command line, and never lose or hide data (every point kept, inputs and
existing files never replaced, exactly the outputs asked for, paths checked first)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sciformer.cli import main
from sciformer.data.pointcloud.io import read_point_file

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "point_scenes_semantickitti.yaml"
TINY = ["train.epochs=1", "train.threads=1", "train.progress=never", "data.crop_points=1500", "data.loop=1",
        "data.grid_size=0.5", "data.eval_max_points=20000", "model.channels=[16,32,64,128]"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The point_scenes SemanticKITTI experiment trained for one tiny epoch on the real scans."""
    from sciformer.contracts import default_data_root

    if not (default_data_root() / "semantickitti_scans").is_dir():
        pytest.skip("real SemanticKITTI scans absent (set SCIFORMER_DATA)")
    out = tmp_path_factory.mktemp("ps") / "run"
    assert main(["train", "-c", str(EXPERIMENT), "-o", str(out), *TINY]) == 0
    return out


@pytest.fixture
def scans(data_root: Path) -> Path:
    return data_root / "semantickitti_scans"


def predict(run: Path, *args: str) -> int:
    return main(["predict", "--checkpoint", str(run), *args])


def test_train_evaluate_predict_on_real_scans(run: Path, scans: Path, tmp_path: Path, capsys) -> None:
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["split"] == "test" and len(metrics["per_class"]) == 19
    assert metrics["protocol"]["files"]["test"] == ["demo_000700_points.npy"]
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "ev"), "--split", "val"]) == 0
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["split"] == "val"
    out = tmp_path / "demo.ply"
    assert predict(run, "-i", str(scans / "demo_000700_points.npy"), "-o", str(out), "--probabilities") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.ply", "ev"]  # no .npy sibling
    ply = read_point_file(out)
    points = np.load(scans / "demo_000700_points.npy")
    assert ply["coord"].shape == points.shape
    np.testing.assert_allclose(ply["coord"], points, atol=1e-6)  # input order
    raw = np.load(scans / "demo_000700_labels.npy").reshape(-1)
    np.testing.assert_array_equal(ply["label"], np.where(raw == 0, -1, raw - 1))  # class table: value k -> class k-1
    assert set(np.unique(ply["pred"])) <= set(range(19)) and ply["valid"].all()
    probs = np.stack([ply[f"prob_{k}"] for k in range(19)], axis=1)  # (n, 19)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    np.testing.assert_array_equal(probs.argmax(axis=1), ply["pred"])
    np.testing.assert_allclose(ply["confidence"], probs.max(axis=1), atol=1e-6)
    header = out.read_bytes()[:2000].decode("ascii", "replace")
    assert "comment class 0 car" in header and "comment class 18 traffic-sign" in header


def test_evaluation_with_test_views_equals_predict_with_the_same_flags(run: Path, scans: Path, tmp_path: Path) -> None:
    """evaluation.tta_rotations / tta_flip / overlap predict every test point as ``sciformer
    predict`` does with --tta-rotations / --tta-flip / --overlap (the other code path), and
    the full-resolution scores are those of the written predictions."""
    ev = tmp_path / "ev"
    # small chunks: the one-epoch model then predicts several classes, so a difference would show
    views = ["evaluation.tta_rotations=3", "evaluation.tta_flip=true", "evaluation.overlap=0.5", "data.eval_max_points=1000"]
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(ev), *views]) == 0
    metrics = json.loads((ev / "metrics.json").read_text())
    assert metrics["test_views"] == {"tta_rotations": 3, "tta_flip": True, "overlap": 0.5}
    evaluated = np.load(ev / "predictions" / "demo_000700_points_pred.npy")
    out = tmp_path / "p.ply"
    assert predict(run, "-i", str(scans / "demo_000700_points.npy"), "-o", str(out), "--tta-rotations", "3", "--tta-flip",
                   "--overlap", "0.5", "data.eval_max_points=1000") == 0
    assert len(np.unique(evaluated)) > 1
    np.testing.assert_array_equal(evaluated, read_point_file(out)["pred"])
    single = tmp_path / "single.ply"  # the views and the chunk size change predictions: the comparison can fail
    assert predict(run, "-i", str(scans / "demo_000700_points.npy"), "-o", str(single), "--overlap", "0.5",
                   "data.eval_max_points=1000") == 0
    assert (read_point_file(single)["pred"] != evaluated).any()
    raw = np.load(scans / "demo_000700_labels.npy").reshape(-1)
    labelled = raw > 0
    oa = float((evaluated[labelled] == raw[labelled] - 1).mean())
    assert metrics["full_resolution"]["oa"] == pytest.approx(oa, abs=1e-9)
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "plain")]) == 0
    assert "test_views" not in json.loads((tmp_path / "plain" / "metrics.json").read_text())


def test_never_writes_over_an_input_or_an_existing_file(run: Path, scans: Path, tmp_path: Path, capsys) -> None:
    scan = tmp_path / "room.npy"
    shutil.copy(scans / "seq01_000000_points.npy", scan)
    before = scan.read_bytes()
    assert predict(run, "-i", str(scan), "-o", str(scan)) == 2  # today: the input became a (n,) int64 array
    assert "is an input file" in capsys.readouterr().err
    assert predict(run, "-i", str(scan), "-o", str(scan), "--overwrite") == 2
    assert scan.read_bytes() == before
    out = tmp_path / "room.ply"
    assert predict(run, "-i", str(scan), "-o", str(out)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["room.npy", "room.ply"]  # today: room.npy overwritten too
    assert scan.read_bytes() == before
    stamp = out.stat().st_mtime_ns
    assert predict(run, "-i", str(scan), "-o", str(out)) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.stat().st_mtime_ns == stamp
    assert predict(run, "-i", str(scan), "-o", str(out), "--overwrite") == 0


def test_nan_points_keep_their_rows(run: Path, scans: Path, tmp_path: Path) -> None:
    """An organised PCD with NaN holes: one output row per input point, in order (today: NaN rows dropped)."""
    points = np.load(scans / "seq01_000000_points.npy")[:4000].astype(np.float32)  # (4000, 3)
    holes = np.zeros(len(points), dtype=bool)
    holes[::7] = True
    points[holes] = np.nan
    pcd = tmp_path / "organised.pcd"
    header = ("# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
              f"WIDTH 80\nHEIGHT 50\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {len(points)}\nDATA binary\n")
    pcd.write_bytes(header.encode() + points.tobytes())
    assert predict(run, "-i", str(pcd), "-o", str(tmp_path / "pred.npz")) == 0
    out = np.load(tmp_path / "pred.npz")
    assert out["pred"].shape == (4000,)
    np.testing.assert_array_equal(out["valid"], ~holes)
    assert (out["pred"][holes] == -1).all() and (out["pred"][~holes] >= 0).all()
    assert (out["confidence"][holes] == 0).all() and list(out["class_names"])[:2] == ["car", "bicycle"]


def test_evaluation_predictions_keep_a_row_for_every_row_of_the_file(run: Path, scans: Path, tmp_path: Path) -> None:
    """A test scan with non-finite rows: <scene>_pred.npy has one row per row of the file, -1
    on the rows left out, the others as ``predict`` labels them; metrics.json counts them."""
    root = tmp_path / "scans"
    shutil.copytree(scans, root)
    points = np.load(root / "demo_000700_points.npy")
    holes = np.zeros(len(points), dtype=bool)
    holes[::53] = holes[7] = True
    points[holes] = np.nan
    points[11] = [np.inf, 0.0, 0.0]
    holes[11] = True
    np.save(root / "demo_000700_points.npy", points)
    ev = tmp_path / "ev"
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(ev), f"data.root={root}"]) == 0
    pred = np.load(ev / "predictions" / "demo_000700_points_pred.npy")
    assert pred.shape == (len(points),)
    assert (pred[holes] == -1).all() and (pred[~holes] >= 0).all()
    out = tmp_path / "p.npz"
    assert predict(run, "-i", str(root / "demo_000700_points.npy"), "-o", str(out)) == 0
    np.testing.assert_array_equal(pred, np.load(out)["pred"])
    full = json.loads((ev / "metrics.json").read_text())["full_resolution"]
    raw = np.load(root / "demo_000700_labels.npy").reshape(-1)
    assert full["left_out_points"] == int(holes.sum()) and full["points"] == int(((raw > 0) & ~holes).sum())


def test_output_checked_before_the_model_loads(run: Path, scans: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    from sciformer.engine import inference

    def boom(*args, **kwargs):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr(inference, "load_for_inference", boom)
    scan = str(scans / "demo_000700_points.npy")
    for output, message in ((tmp_path / "x.csv", "unsupported output suffix '.csv'"),
                            (tmp_path / "missing" / "x.ply", "does not exist"),
                            (tmp_path / "x.laz", "LAS/LAZ output copies a LAS/LAZ input")):
        assert predict(run, "-i", scan, "-o", str(output)) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_folder_and_glob_inputs_load_the_model_once(run: Path, scans: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    from sciformer.engine import inference

    calls = []
    original = inference.load_for_inference
    monkeypatch.setattr(inference, "load_for_inference", lambda *a, **k: calls.append(a) or original(*a, **k))
    out = tmp_path / "preds"
    assert predict(run, "-i", str(scans / "seq01_*_points.npy"), "-o", str(out), "--format", "npy",
                   "data.eval_max_points=30000") == 0
    assert len(calls) == 1 and calls[0][1] == ["data.eval_max_points=30000"]  # key=value overrides reach the run
    assert sorted(p.name for p in out.iterdir()) == [f"seq01_00000{i}_points.npy" for i in range(3)]
    for i in range(3):
        assert np.load(out / f"seq01_00000{i}_points.npy").shape == (len(np.load(scans / f"seq01_00000{i}_points.npy")),)
    assert predict(run, "-i", str(scans), "-o", str(tmp_path / "one.ply")) == 2  # a folder of inputs needs a folder output
    assert "need an output folder" in capsys.readouterr().err
    assert predict(run, "-i", str(scans / "demo_000700_points.npy"), "-o", f"{tmp_path / 'single'}/", "--format", "ply") == 0
    assert [p.name for p in (tmp_path / "single").iterdir()] == ["demo_000700_points.ply"]  # 'DIR/': into the folder


def test_raw_bin_scan_needs_its_columns(run: Path, scans: Path, tmp_path: Path, capsys) -> None:
    points = np.load(scans / "demo_000700_points.npy")  # (n, 3) float32
    table = np.concatenate([points, np.zeros((len(points), 1), np.float32)], axis=1)  # KITTI x, y, z, intensity
    scan = tmp_path / "000700.bin"
    table.astype("<f4").tofile(scan)
    assert predict(run, "-i", str(scan), "-o", str(tmp_path / "a.npy")) == 2
    assert "--columns x,y,z,intensity" in capsys.readouterr().err
    assert predict(run, "-i", str(scan), "-o", str(tmp_path / "a.npy"), "--columns", "x,y,z,intensity") == 0
    assert predict(run, "-i", str(scans / "demo_000700_points.npy"), "-o", str(tmp_path / "b.npy")) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))  # same points, same labels


def test_inference_applies_the_training_thread_default(run: Path) -> None:
    """Loading a model for inference sets train.threads as training does (null: the measured best)."""
    import torch

    from sciformer.engine.inference import load_for_inference
    from sciformer.engine.runtime import default_threads

    before = torch.get_num_threads()
    try:
        load_for_inference(run, ["train.threads=3"])
        assert torch.get_num_threads() == 3
        load_for_inference(run, ["train.threads=null"])
        assert torch.get_num_threads() == default_threads()
    finally:
        torch.set_num_threads(before)


def test_a_gross_outlier_changes_no_other_point(run: Path, scans: Path, tmp_path: Path) -> None:
    """A no-data point (x = 1e6, x = -1e6, or z far below the ground) put in a scan: every other
    point gets exactly the probabilities it gets without it; the outlier gets a row of its own."""
    points = np.load(scans / "seq01_000000_points.npy")[:6000].astype(np.float32)  # (6000, 3)
    np.save(tmp_path / "clean.npy", points)
    assert predict(run, "-i", str(tmp_path / "clean.npy"), "-o", str(tmp_path / "clean.ply"), "--probabilities") == 0
    clean = read_point_file(tmp_path / "clean.ply")
    for name, (row, outlier) in {"x": (77, [1e6, 0.0, 0.0]), "-x": (0, [-1e6, 3.0, 0.0]), "z": (6000, [5.0, 2.0, -5000.0])}.items():
        dirty = np.insert(points, row, outlier, axis=0)  # (6001, 3)
        np.save(tmp_path / f"{name}.npy", dirty)
        assert predict(run, "-i", str(tmp_path / f"{name}.npy"), "-o", str(tmp_path / f"{name}.ply"), "--probabilities") == 0
        out = read_point_file(tmp_path / f"{name}.ply")
        others = np.arange(len(dirty)) != row
        for key in [k for k in clean if k.startswith("prob_")] + ["pred"]:
            np.testing.assert_array_equal(out[key][others], clean[key], err_msg=f"{name}: {key}")
        assert out["valid"].all() and out["pred"][row] >= 0


def test_evaluation_keeps_gross_outliers_apart_as_predict_does(run: Path, scans: Path, tmp_path: Path) -> None:
    """The test scan with two no-data points put in (x = -1e6, z = -9999): evaluation predicts
    every other point as on the clean scan, and with test views exactly as ``predict``."""
    data = tmp_path / "scans"
    shutil.copytree(scans, data)
    points, labels = np.load(scans / "demo_000700_points.npy"), np.load(scans / "demo_000700_labels.npy")
    at = [100, 200]  # they land on rows 100 and 201
    np.save(data / "demo_000700_points.npy", np.insert(points, at, [[-1e6, 0.0, 0.0], [0.0, 0.0, -9999.0]], axis=0).astype(points.dtype))
    np.save(data / "demo_000700_labels.npy", np.insert(labels, at, 0, axis=0))  # unlabelled
    others = np.ones(len(points) + 2, dtype=bool)
    others[[100, 201]] = False
    clean, dirty = tmp_path / "clean", tmp_path / "dirty"
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(clean)]) == 0
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(dirty), f"data.root={data}"]) == 0
    name = "predictions/demo_000700_points_pred.npy"
    np.testing.assert_array_equal(np.load(dirty / name)[others], np.load(clean / name))
    views = ["evaluation.tta_rotations=2", "evaluation.overlap=0.5", "data.eval_max_points=5000"]
    assert main(["evaluate", "--checkpoint", str(run), "-o", str(tmp_path / "views"), f"data.root={data}", *views]) == 0
    out = tmp_path / "p.npz"
    assert predict(run, "-i", str(data / "demo_000700_points.npy"), "-o", str(out), "--tta-rotations", "2",
                   "--overlap", "0.5", "data.eval_max_points=5000") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "views" / name), np.load(out)["pred"])


def test_a_repeated_no_data_fill_changes_no_other_point(run: Path, scans: Path, tmp_path: Path) -> None:
    """A no-data value repeated on 0.5 % of a scan's points (x = 1e6): the other points get the
    predictions of the scan without them."""
    points = np.load(scans / "seq01_000000_points.npy")[:6000].astype(np.float32)  # (6000, 3)
    np.save(tmp_path / "clean.npy", points[:-30])
    filled = points.copy()
    filled[-30:, 0] = 1e6
    np.save(tmp_path / "filled.npy", filled)
    for name in ("clean", "filled"):
        assert predict(run, "-i", str(tmp_path / f"{name}.npy"), "-o", str(tmp_path / f"{name}.npz"), "--probabilities") == 0
    clean, out = np.load(tmp_path / "clean.npz"), np.load(tmp_path / "filled.npz")
    np.testing.assert_array_equal(out["probabilities"][:-30], clean["probabilities"])
    assert out["pred"].shape == (6000,) and out["valid"].all()


def test_a_folder_entry_that_cannot_be_read_stops_predict_before_anything_is_written(tmp_path: Path, capsys) -> None:
    """A link to a tile on an unmounted drive was left out of a folder --input unsaid: the rest was
    predicted and the command exited 0. The inputs are checked before the checkpoint is opened."""
    tiles = tmp_path / "tiles"
    tiles.mkdir()
    np.save(tiles / "a_good.npy", np.zeros((20, 3), np.float32))
    (tiles / "b_missing.las").symlink_to("/mnt/unmounted/tile_b.las")
    out = tmp_path / "out"
    assert main(["predict", "--checkpoint", str(tmp_path / "no_run"), "-i", str(tiles), "-o", f"{out}/", "--format", "npz"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"'{tiles / 'b_missing.las'}' is not a regular file (a link to nothing, or a loop)" in err, err
    assert not out.exists()
