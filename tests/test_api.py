"""The Python API against the command line: ``sciformer.load(...).predict`` gives what
``sciformer predict`` writes, and ``sciformer.train`` trains the run ``sciformer train`` does."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_hsi_scene, write_s3dis

import sciformer
from sciformer.cli import main

ROOT = Path(__file__).resolve().parents[1]
HSI_YAML = ("name: api_hsi\ndata:\n  name: hsi_scene\n  source: cube.npy\n  label_path: gt.npy\n  patch_size: 3\n"
            "  split: {kind: stratified, train_per_class: 8, val_fraction: 0.2}\n"
            "model: {name: spectral_spatial, dim: 16, depth: 1, num_heads: 2, band_group_size: 3}\n"
            "train: {epochs: 1, batch_size: 16, progress: never, threads: 1}\n")
S3DIS_TINY = ["data.crop_points=100", "train.grad_clip=1.0", "data.loop=2", "data.val_fraction=0.5", "train.epochs=1", "train.batch_size=2",
              "train.threads=1", "train.progress=never", "model.channels=[8,16,32,64,128]", "export.ply=false",
              "export.png=false"]


@pytest.fixture(scope="module")
def hsi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api_hsi")
    cube, gt, _ = make_hsi_scene(h=16, w=14, bands=9, classes=3, block=4)
    np.save(root / "cube.npy", cube)
    np.save(root / "gt.npy", gt)
    (root / "tiny.yaml").write_text(HSI_YAML)
    assert main(["train", "-c", str(root / "tiny.yaml"), "-o", str(root / "run")]) == 0
    return {"root": root, "run": root / "run", "cube": root / "cube.npy", "yaml": root / "tiny.yaml"}


@pytest.fixture(scope="module")
def s3dis(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api_s3dis")
    folder = write_s3dis(root / "s3dis", {1: ["office_1", "office_2"], 5: ["office_3"]}, malformed=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", "-c", str(ROOT / "experiments" / "s3dis_area5.yaml"), "-o", str(root / "run"),
                     f"data.root={folder}", *S3DIS_TINY]) == 0
    return {"run": root / "run", "room": folder / "Area_5" / "office_3" / "office_3.txt"}


def test_import_sciformer_stays_cheap() -> None:
    code = "import sys, sciformer; assert 'torch' not in sys.modules, 'torch imported'; sciformer.load; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert callable(sciformer.load) and callable(sciformer.train)


def test_the_errors_to_catch_come_with_import_sciformer() -> None:
    """``sciformer.SciformerError`` was an AttributeError: a caller had to know ``sciformer.errors``."""
    code = ("import sys, sciformer; caught = (sciformer.SciformerError, sciformer.ConfigError, sciformer.DataError, "
            "sciformer.CheckpointError); assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    from sciformer import errors
    from sciformer.engine.loops import TrainingDiverged

    for name in ("SciformerError", "ConfigError", "DataError", "CheckpointError"):
        assert getattr(sciformer, name) is getattr(errors, name) and name in sciformer.__all__ and name in dir(sciformer)
    assert sciformer.TrainingDiverged is TrainingDiverged and issubclass(sciformer.TrainingDiverged, sciformer.SciformerError)


def test_hsi_predict_equals_the_command_line(hsi: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "map.npy"
    assert main(["predict", "--checkpoint", str(hsi["run"]), "-i", str(hsi["cube"]), "-o", str(out)]) == 0
    cli_map = np.load(out)  # (H, W), 1..K
    model = sciformer.load(hsi["run"], device="cpu")
    assert model.kind == "hsi" and len(model.class_names) == 3
    from_file = model.predict(hsi["cube"])
    cube = np.load(hsi["cube"])
    from_array = model.predict(torch.from_numpy(cube))
    for pred in (from_file, from_array):
        np.testing.assert_array_equal(pred.labels + 1, cli_map)
        assert pred.probabilities.shape == (*cube.shape[:2], 3)
        np.testing.assert_allclose(pred.probabilities.sum(axis=-1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(pred.probabilities.argmax(axis=-1), pred.labels)
    np.testing.assert_array_equal(from_file.probabilities, from_array.probabilities)
    with pytest.raises(sciformer.api.DataError, match="wavelengths"):
        model.predict(cube, wavelengths=[500.0, 600.0])
    holes = cube.astype(np.float32).copy()
    holes[2, 3, 1] = np.nan
    holed = model.predict(holes)  # a NaN band: a no-data pixel, label -1 and NaN probabilities; the rest predicted
    assert holed.labels[2, 3] == -1 and np.isnan(holed.probabilities[2, 3]).all()
    assert (holed.labels >= 0).sum() == holed.labels.size - 1


def test_label_ids_are_the_command_line_map_for_label_ids_not_1_to_k(hsi: dict[str, Path], tmp_path: Path) -> None:
    """Training ids {3, 7, 10}: ``label_ids`` are the map ``sciformer predict`` writes (the oracle), in those
    same ids; ``labels`` are the 0-based class indices into ``class_names`` and ``probabilities``."""
    cube, gt = np.load(hsi["cube"]), np.load(hsi["root"] / "gt.npy")
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", np.array([0, 3, 7, 10])[gt])  # (H, W) ids 1, 2, 3 -> 3, 7, 10
    (tmp_path / "ids.yaml").write_text(HSI_YAML)
    assert main(["train", "-c", str(tmp_path / "ids.yaml"), "-o", str(tmp_path / "run")]) == 0
    assert main(["predict", "--checkpoint", str(tmp_path / "run"), "-i", str(tmp_path / "cube.npy"), "-o", str(tmp_path / "map.npy")]) == 0
    cli_map = np.load(tmp_path / "map.npy")  # (H, W) label ids
    assert set(np.unique(cli_map)) <= {3, 7, 10}
    model = sciformer.load(tmp_path / "run", device="cpu")
    assert len(model.class_names) == 10
    for pred in (model.predict(tmp_path / "cube.npy"), model.predict(cube)):
        np.testing.assert_array_equal(pred.label_ids, cli_map)
        np.testing.assert_array_equal(pred.labels, cli_map - 1)
        np.testing.assert_array_equal(pred.probabilities.argmax(axis=-1), pred.labels)
    holes = cube.astype(np.float32).copy()
    holes[2, 3, 1] = np.nan
    holed = model.predict(holes)  # a no-data pixel: 0 in the map's ids, -1 as a class index
    assert holed.label_ids[2, 3] == 0 and holed.labels[2, 3] == -1


def test_points_predict_equals_the_command_line(s3dis: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "room.npz"
    assert main(["predict", "--checkpoint", str(s3dis["run"]), "-i", str(s3dis["room"]), "-o", str(out),
                 "--probabilities", "--tta-rotations", "2"]) == 0
    with np.load(out) as npz:
        cli_pred, cli_probs = npz["pred"], npz["probabilities"]
    model = sciformer.load(s3dis["run"], device="cpu")
    assert model.kind == "points" and model.features == ["colour"]
    from_file = model.predict(s3dis["room"], rotations=2)
    table = np.loadtxt(s3dis["room"])  # x y z r g b, 0..255 colour
    from_array = model.predict(table[:, :3], features={"colour": table[:, 3:6].astype(np.uint8)}, rotations=2)
    stacked = model.predict(table[:, :3], features=table[:, 3:6].astype(np.uint8), rotations=2)
    for pred in (from_file, from_array, stacked):
        np.testing.assert_array_equal(pred.labels, cli_pred)
        np.testing.assert_array_equal(pred.label_ids, cli_pred)  # a point file's pred: the class index
        np.testing.assert_allclose(pred.probabilities, cli_probs, atol=1e-6)
        assert pred.valid.all() and len(pred.label_names) == len(table)
    with pytest.raises(sciformer.api.SciformerError, match="unknown option"):
        model.predict(table[:, :3], rotation=2)


def test_train_matches_the_command_line(hsi: dict[str, Path], tmp_path: Path) -> None:
    result = sciformer.train(hsi["yaml"], {"train.seed": 3}, output_dir=tmp_path / "api")
    assert main(["train", "-c", str(hsi["yaml"]), "-o", str(tmp_path / "cli"), "--seed", "3"]) == 0
    assert result.run_dir == tmp_path / "api" and result.best_epoch == 1 and len(result.history) == 1
    assert set(result.metrics) >= {"oa", "aa", "kappa"}
    a = torch.load(tmp_path / "api" / "checkpoints" / "best.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cli" / "checkpoints" / "best.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    for run in ("api", "cli"):
        log = (tmp_path / run / "train.log").read_text()
        assert "run folder:" in log and "epoch 1/1" in log and "test results" in log


def test_shape_predict_equals_the_command_line(tmp_path: Path) -> None:
    from synthetic import write_modelnet_h5

    root = write_modelnet_h5(tmp_path / "mn", ["bed", "chair"], per_class=(5, 1), points=64)
    run = tmp_path / "run"
    assert main(["train", "-c", str(ROOT / "experiments" / "modelnet10.yaml"), "-o", str(run), f"data.root={root}",
                 "data.num_points=64", "data.train_transforms=[]", "data.eval_transforms=[]",
                 "data.vote_transforms=[{name: random_jitter, sigma: 0.01}]", "model.channels=[8,16]",
                 "model.blocks=[0,1]", "model.strides=[1,4]", "train.epochs=1", "train.batch_size=2",
                 "train.threads=1", "evaluation.votes=1"]) == 0
    shape = tmp_path / "shape.npy"
    points = np.random.default_rng(3).normal(size=(64, 3)) * 0.1 + 1.0
    np.save(shape, points)
    out = tmp_path / "shape_probs.npy"
    assert main(["predict", "--checkpoint", str(run), "-i", str(shape), "-o", str(out), "--votes", "3"]) == 0
    model = sciformer.load(run)
    assert model.kind == "shape" and model.class_names == ["bed", "chair"]
    for pred in (model.predict(shape, votes=3), model.predict(points, votes=3)):
        np.testing.assert_array_equal(pred.probabilities, np.load(out))
        assert pred.labels.shape == () and int(pred.labels) == int(np.load(out).argmax()) == int(pred.label_ids)


def test_a_run_leaves_the_callers_threads_and_random_generators_as_they_were(hsi: dict[str, Path], tmp_path: Path) -> None:
    """train.threads and the run's seeding hold for the run only: the caller's code goes on as before."""
    import random

    torch.set_num_threads(2)
    def seed_all() -> None:
        random.seed(11)
        np.random.seed(11)
        torch.manual_seed(11)

    seed_all()
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    seed_all()
    sciformer.train(hsi["yaml"], ["train.threads=1"], output_dir=tmp_path / "run")
    assert torch.get_num_threads() == 2
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected


def test_pretrain_leaves_the_callers_threads_and_random_generators_as_they_were(hsi: dict[str, Path], tmp_path: Path) -> None:
    import random

    torch.set_num_threads(2)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    sciformer.pretrain(hsi["yaml"], ["train.threads=1"], epochs=1, band_group=3, output_dir=tmp_path / "pre")
    assert torch.get_num_threads() == 2
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected


def test_load_and_predict_leave_the_callers_threads_and_predict_on_the_runs(hsi: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """train.threads (1 in this run) holds inside predict only; load changes nothing."""
    torch.set_num_threads(2)
    model = sciformer.load(hsi["run"], device="cpu")
    assert torch.get_num_threads() == 2
    seen = []
    run = sciformer.api.Predictor._run
    monkeypatch.setattr(sciformer.api.Predictor, "_run", lambda self, *a: seen.append(torch.get_num_threads()) or run(self, *a))
    model.predict(np.load(hsi["cube"]))
    assert seen == [1] and torch.get_num_threads() == 2


def test_arguments_of_the_wrong_kind_are_one_line_errors(hsi: dict[str, Path], s3dis: dict[str, Path], tmp_path: Path) -> None:
    """Wrong types raise sciformer's errors naming the argument, never a bare TypeError from deep inside
    nor a silent reinterpretation (a (c, n) feature table, flip="no", batch_size=0)."""
    from sciformer.errors import SciformerError as Error  # (sciformer.api is imported on first use)
    for bad in (None, 5, [3]):
        with pytest.raises(Error, match="load: expected a run folder"):
            sciformer.load(bad)
    for kwargs, needle in [({"config": 5}, "config must be a YAML path"), ({"config": hsi["yaml"], "overrides": 5}, "overrides: expected")]:
        with pytest.raises(Error, match=needle):
            sciformer.train(**kwargs, output_dir=tmp_path / "never")
    assert not (tmp_path / "never").exists()
    model = sciformer.load(hsi["run"], overrides="evaluation.batch_size=4")  # one override as a string, as train takes it
    assert model.batch_size == 4
    cube = np.load(hsi["cube"])
    for kwargs, needle in [({"batch_size": 0}, "batch_size must be"), ({"batch_size": 1.5}, "batch_size must be"),
                           ({"batch_size": "x"}, "batch_size must be")]:
        with pytest.raises(Error, match=needle):
            model.predict(cube, **kwargs)
    with pytest.raises(Error, match="a folder; predict takes one file"):
        model.predict(tmp_path)
    with pytest.raises(Error, match="features= goes with a point array"):  # never silently ignored
        model.predict(cube, features={"intensity": np.ones(5)})
    # numpy's and torch's scalars are numbers too (a uint8 batch size once overflowed in the batch arithmetic)
    np.testing.assert_array_equal(model.predict(cube, batch_size=np.uint8(16)).labels, model.predict(cube).labels)
    np.testing.assert_array_equal(model.predict(cube, batch_size=torch.tensor(16)).labels, model.predict(cube).labels)
    assert sciformer.api._override_list({"train.epochs": np.int64(2), "a.b": np.array([1, 2])}) == ["train.epochs=2", "a.b=[1, 2]"]
    points = sciformer.load(s3dis["run"], device="cpu")
    table = np.loadtxt(s3dis["room"])  # x y z r g b
    for kwargs, needle in [({"features": table[:, 3:6].T.copy()}, r"an \(n, c\) table with a row per point"),
                           ({"features": table[:-1, 3:6]}, "a row per point"),
                           ({"features": np.concatenate([table[:, 3:6]] * 2)[:, :3].reshape(-1, 2)[: len(table)]}, "columns"),
                           ({"flip": "no"}, "^flip=: expected true or false"), ({"rotations": "x"}, "^rotations= must be"),
                           ({"overlap": "x"}, "^overlap= must be")]:  # the keywords, not the command line's flags
        with pytest.raises(Error, match=needle):
            points.predict(table[:, :3], **{"features": table[:, 3:6], **kwargs})
    assert points.predict(table[:, :3], features=table[:, 3:6], overlap=torch.tensor(0.5), flip=np.bool_(True)).labels.shape == (len(table),)
    with pytest.raises(Error, match="points must be real numbers"):
        points.predict(table[:, :3] + 1j, features=table[:, 3:6])


def test_a_feature_that_is_not_a_row_per_point_is_a_one_line_error(s3dis: dict[str, Path]) -> None:
    points = sciformer.load(s3dis["run"], device="cpu")
    xyz = np.loadtxt(s3dis["room"])[:, :3]
    for features, needle in [({"intensity": 5.0}, rf"feature 'intensity' \(features=\{{'intensity': ...\}}\) must be an array of shape \({len(xyz)},\)"),
                             ({"colour": np.zeros((len(xyz), 3, 1))}, rf"feature 'colour' \(features=\{{'colour': ...\}}\) must be an array of shape \({len(xyz)}, 3\)"),
                             ({"rgb": np.zeros((len(xyz), 2))}, rf"^predict: feature 'rgb' \(features=\{{'rgb': ...\}}\) must be an array of shape "
                                                                rf"\({len(xyz)}, 3\) \(a row per point\), got shape \({len(xyz)}, 2\)$"),
                             (None, r"^predict: the model was trained with feature 'colour'; pass it as features=\{'colour': ...\} "
                                    rf"\(shape \({len(xyz)}, 3\)\), or use a model trained without it$")]:  # the keyword, not 'a file'
        with pytest.raises(sciformer.api.DataError, match=needle):
            points.predict(xyz, features=features)


def test_lines_printed_for_an_array_name_the_array_not_its_temporary_file(hsi: dict[str, Path],
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """model.predict(array, labels=...) prints its score line for "the cube array" (it named the temporary
    cube.npy the array was written to); the caller's streams are theirs again after the call, and a
    name that merely contains the temporary one is left as it is."""
    import sys

    from sciformer.frontend import printed_as

    model = sciformer.load(hsi["run"], device="cpu")
    before = (sys.stdout, sys.stderr)
    model.predict(np.load(hsi["cube"]), labels=str(hsi["root"] / "gt.npy"))
    out = capsys.readouterr()
    assert (sys.stdout, sys.stderr) == before
    assert "the cube array: OA" in out.out and "cube.npy:" not in out.out and "sciformer-predict-" not in out.out + out.err
    with printed_as({"/tmp/x/cube.npy": "the cube array", "cube.npy": "the cube array"}):
        print("/tmp/x/cube.npy: ok; mycube.npy and cube.npy2 stay; cube.npy.")
    assert capsys.readouterr().out == "the cube array: ok; mycube.npy and cube.npy2 stay; the cube array.\n"


def test_a_path_that_is_no_regular_file_is_worded_as_the_command_line_words_it(hsi: dict[str, Path], tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """predict on a FIFO, a socket, a /dev/zero link or a link loop said "no such file"."""
    import os
    import socket

    from sciformer.errors import DataError

    monkeypatch.chdir(tmp_path)  # short relative names: a socket path has at most 107 bytes
    os.mkfifo("fifo.npy")
    os.symlink("/dev/zero", "zero.npy")
    os.symlink("loop2.npy", "loop.npy")
    os.symlink("loop.npy", "loop2.npy")
    os.symlink("/nonexistent/tile.npy", "gone.npy")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind("sock.npy")
    model = sciformer.load(hsi["run"])
    cases = {"fifo.npy": "a FIFO", "zero.npy": "a device", "sock.npy": "a socket",
             "loop.npy": "a link to nothing, or a loop", "gone.npy": "a link to nothing, or a loop"}
    try:
        for name, kind in cases.items():
            with pytest.raises(DataError) as e:
                model.predict(name)
            assert str(e.value) == f"{name}: is not a regular file ({kind})"
            assert main(["predict", "--checkpoint", str(hsi["run"]), "-i", name, "-o", "out.npy"]) == 2
            assert capsys.readouterr().err.strip().endswith(f"--input '{name}' is not a regular file or folder ({kind})")
    finally:
        sock.close()
    with pytest.raises(DataError, match=r"^absent\.npy: does not exist$"):
        model.predict("absent.npy")
    assert not Path("out.npy").exists()
