"""Dataset classes: the registered builder's items, indexable and iterable in plain Python."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import make_hsi_scene, write_s3dis

import sciformer
from sciformer import config
from sciformer.engine import builders
from sciformer.errors import ConfigError


def test_s3dis_class_gives_the_experiment_builder_items(tmp_path: Path) -> None:
    root = write_s3dis(tmp_path / "s3dis", {1: ["office_1", "office_2"], 5: ["office_3"]}, malformed=False)
    rooms = sciformer.S3DIS(root, split="test", crop_points=64)
    exp = config.from_dict({"data": {"name": "s3dis", "root": str(root), "crop_points": 64}, "model": {"name": "point_transformer_seg"}},
                           tmp_path)
    task = builders.build_task(exp)
    assert len(rooms) == len(task.dataset("test")) == 1 and rooms.class_names == task.info.class_names
    for ours, theirs in zip(rooms, (task.dataset("test")[i] for i in range(1)), strict=True):
        assert set(ours) == {"coord", "feat", "label"} and ours["coord"].shape[1] == 3
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key])
    batch = rooms.collate([rooms[0]])
    assert batch["offset"].tolist() == [len(rooms[0]["coord"])]


def test_hyperspectral_scene_iterates_patches(tmp_path: Path) -> None:
    cube, gt, _ = make_hsi_scene(h=12, w=12, bands=6, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", gt)
    scene = sciformer.HyperspectralScene(tmp_path / "cube.npy", split="train", label_path=str(tmp_path / "gt.npy"),
                                         patch_size=3, protocol={"kind": "stratified", "train_per_class": 4, "val_fraction": 0.2})
    items = list(scene)
    val = sciformer.HyperspectralScene(tmp_path / "cube.npy", split="val", label_path=str(tmp_path / "gt.npy"),
                                       patch_size=3, protocol={"kind": "stratified", "train_per_class": 4, "val_fraction": 0.2})
    assert len(items) == len(scene) and len(scene) + len(val) == 12 and scene.info.in_channels == 6  # 4 per class
    assert items[0]["patch"].shape == (6, 3, 3)
    assert sorted({int(i["target"]) for i in [*items, *val]}) == [0, 1, 2]
    with pytest.raises(ConfigError, match="patch_size"):
        sciformer.HyperspectralScene(tmp_path / "cube.npy", label_path=str(tmp_path / "gt.npy"), patch_size=4)
    with pytest.raises(ConfigError, match="split"):
        sciformer.ModelNet(tmp_path, split="training")


def test_to_pyg_of_a_hyperspectral_scene_is_refused_at_once(tmp_path: Path) -> None:
    """Its items are patches: the PyG view failed on its first item ("item 0 is a dict, expected a
    point sample dict with 'coord'"), long after the call; a point dataset's to_pyg is unchanged."""
    cube, gt, _ = make_hsi_scene(h=12, w=12, bands=6, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", gt)
    scene = sciformer.HyperspectralScene(tmp_path / "cube.npy", label_path=str(tmp_path / "gt.npy"), patch_size=3,
                                         protocol={"kind": "stratified", "train_per_class": 4, "val_fraction": 0.2})
    with pytest.raises(ConfigError, match=r"HyperspectralScene.to_pyg\(\): .*patches, not point clouds") as caught:
        scene.to_pyg()
    assert "\n" not in str(caught.value)
    root = write_s3dis(tmp_path / "s3dis", {1: ["office_1", "office_2"], 5: ["office_3"]}, malformed=False)
    assert len(sciformer.S3DIS(root, split="test", crop_points=64).to_pyg()) == 1
