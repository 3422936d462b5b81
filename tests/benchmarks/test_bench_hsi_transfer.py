"""benchmarks/bench_hsi_transfer.py: the source and target parts it writes from Indian Pines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorly", reason="Indian Pines ships in tensorly==0.10.0: pip install 'sciformer[hsi-data]'")

from bench_scripts import BENCHMARKS, load_benchmark  # noqa: E402

SCRIPT = BENCHMARKS / "bench_hsi_transfer.py"


def _script():
    return load_benchmark("bench_hsi_transfer")


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    wd = tmp_path_factory.mktemp("transfer")
    facts = _script().write_parts(wd, split_col=72, gap=1, band_step=2)
    return wd, facts


def _original() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from tensorly.datasets import load_indian_pines

    data = Path(importlib.util.find_spec("tensorly").submodule_search_locations[0]) / "datasets" / "data"
    cube = np.load(data / "Indian_pines_corrected.npy")  # (145, 145, 200) uint16, read directly
    gt = np.load(data / "Indian_pines_gt.npy")  # (145, 145)
    nm = np.asarray(load_indian_pines()["ticks"][1], dtype=np.float64)  # (200,)
    return cube, gt, nm


def test_target_is_every_second_band_of_the_right_part(parts: tuple[Path, dict]) -> None:
    wd, facts = parts
    cube, gt, nm = _original()
    target = np.load(wd / "target_cube.npy")
    assert target.shape == (145, 72, 100)
    np.testing.assert_array_equal(target, cube[:, 73:, ::2])
    np.testing.assert_array_equal(np.load(wd / "target_nm.npy"), nm[::2])
    np.testing.assert_array_equal(np.load(wd / "target_gt.npy"), gt[:, 73:])
    np.testing.assert_array_equal(np.load(wd / "source_cube.npy"), cube[:, :72, :])
    np.testing.assert_array_equal(np.load(wd / "source_nm.npy"), nm)
    assert facts["target"]["labelled"] == int(np.count_nonzero(gt[:, 73:]))


def test_source_and_target_labels_are_disjoint_in_pixels(parts: tuple[Path, dict]) -> None:
    wd, _ = parts
    _, gt, _ = _original()
    src_gt, tgt_gt = np.load(wd / "source_gt.npy"), np.load(wd / "target_gt.npy")
    rows, cols = np.nonzero(src_gt)
    src = {(int(r), int(c)) for r, c in zip(rows, cols)}  # original coordinates: offset 0
    rows, cols = np.nonzero(tgt_gt)
    tgt = {(int(r), int(c) + 73) for r, c in zip(rows, cols)}  # original coordinates: offset 73
    assert src and tgt and not (src & tgt)
    for r, c in src | tgt:  # each keeps the scene's own 16-class label
        assert gt[r, c] > 0
    assert max(c for _, c in src) < 72 <= 73 <= min(c for _, c in tgt)
    # every labelled pixel outside the one-column gap is in exactly one part
    assert len(src) + len(tgt) == int(np.count_nonzero(gt)) - int(np.count_nonzero(gt[:, 72]))


def test_split_only_writes_outside_the_repository(tmp_path: Path) -> None:
    mod = _script()
    with pytest.raises(SystemExit, match="inside the repository"):
        mod.main(["--workdir", str(SCRIPT.parents[1] / "runs" / "x"), "--split-only"])
    mod.main(["--workdir", str(tmp_path), "--split-only"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{part}_{kind}.npy" for part in ("source", "target") for kind in ("cube", "gt", "nm"))
