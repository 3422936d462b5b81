"""Every shipped experiment file validates against the schema (data and model sections included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer import config
from sciformer.registry import DATASETS, MODELS

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))


def test_experiments_folder_is_populated() -> None:
    names = {p.stem for p in EXPERIMENTS}
    assert {"indian_pines_demo", "modelnet10", "modelnet40", "s3dis_area5", "shapenetpart", "lidar_tiles"} <= names, names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_validates(path: Path) -> None:
    exp = config.load(path)
    assert exp.cfg.name == path.stem  # run folders are named after it
    assert exp.cfg.description.strip(), f"{path.name}: describe the experiment and its published figure"
    assert exp.cfg.data.name in DATASETS.names() and exp.cfg.model.name in MODELS.names()
