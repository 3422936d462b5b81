"""``sciformer predict`` and ``model.predict`` of part segmentation end to end: a tiny ShapeNetPart
run records its training frame; a shape in other units is a warning, and ``--match-frame`` /
``match_frame=True`` predicts it as the shape in the training frame."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from synthetic import write_shapenetpart

import sciformer
from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "shapenetpart.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("parts")
    root = write_shapenetpart(tmp / "shapenetpart", points=300)
    out = tmp / "run"
    assert main(["train", "-c", str(EXPERIMENT), "-o", str(out), f"data.root={root}", "data.num_points=256",
                 "data.features=[coord]", "train.epochs=1", "train.threads=1", "train.progress=never", "train.batch_size=2",
                 "train.device=cpu", "model.channels=[16,32,64,128,256]", "model.blocks=[1,1,1,1,1]"]) == 0
    return out


def test_the_run_records_its_frame_and_predict_places_a_shape_in_other_units(run: Path, tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    frame = load_checkpoint(run / "checkpoints" / "best.pt")["data_state"]["shape_frame"]
    assert set(frame) == {"Airplane", "Bag"} and frame["Bag"]["shapes"] == 2
    root = Path(load_checkpoint(run / "checkpoints" / "best.pt")["config"]["data"]["root"])
    xyz = np.loadtxt(min((root / "02773838").glob("*.txt")))[:, :3]  # (300, 3) a Bag
    np.savetxt(tmp_path / "bag.xyz", xyz, fmt="%.9f")
    np.savetxt(tmp_path / "bag_mm.xyz", xyz * 1000.0 + [5e5, 4e6, 100.0], fmt="%.6f")
    args = ["predict", "--checkpoint", str(run), "--category", "Bag", "--columns", "x,y,z"]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main([*args, "-i", str(tmp_path / "bag_mm.xyz"), "-o", str(tmp_path / "mm.npy")]) == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "frame" in line]  # the command line's one line
        assert len(said) == 1 and said[0].startswith("WARNING: ") and "bag_mm.xyz: the shape's radius" in said[0]
        assert "--match-frame" in said[0]
        assert main([*args, "-i", str(tmp_path / "bag_mm.xyz"), "-o", str(tmp_path / "mm_placed.npy"), "--match-frame"]) == 0
        assert main([*args, "-i", str(tmp_path / "bag.xyz"), "-o", str(tmp_path / "placed.npy"), "--match-frame"]) == 0
        assert not [line for line in capsys.readouterr().err.splitlines() if "frame" in line]
    np.testing.assert_array_equal(np.load(tmp_path / "mm_placed.npy"), np.load(tmp_path / "placed.npy"))
    model = sciformer.load(run)
    np.testing.assert_array_equal(model.predict(xyz * 1000.0 + [5e5, 4e6, 100.0], category="Bag", match_frame=True).labels,
                                  np.load(tmp_path / "placed.npy"))
    with pytest.raises(sciformer.SciformerError, match="match_frame=: expected true or false"):
        model.predict(xyz, category="Bag", match_frame="no")
