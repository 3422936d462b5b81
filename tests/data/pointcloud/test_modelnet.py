"""ModelNet dataset: real ModelNet10 h5, and miniature h5 / normal_resampled / raw .off layouts."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from pydantic import ValidationError
from torch.utils.data import DataLoader

from sciformer.contracts import BuildContext
from sciformer.data.pointcloud.modelnet import ModelNetConfig, build_modelnet
from sciformer.errors import DataError
from sciformer.registry import DATASETS

CLASSES = ["bathtub", "bed", "chair"]
MODELNET10 = ["bathtub", "bed", "chair", "desk", "dresser", "monitor", "night_stand", "sofa", "table", "toilet"]
TEST_COUNTS = [50, 100, 100, 86, 86, 100, 86, 100, 100, 100]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_registered() -> None:
    entry = DATASETS._entries["modelnet"]  # direct: load_builtins may import modules still being written
    assert entry.config is ModelNetConfig and entry.builder is build_modelnet


def test_real_modelnet10_h5(fakes, ctx: BuildContext) -> None:
    fakes.real_path("modelnet10_hdf5_1024")
    task = build_modelnet(ModelNetConfig(), ctx)
    assert task.info.class_names == MODELNET10 and task.info.num_classes == 10
    assert task.info.in_channels == 3 and task.info.task == "classification"
    train, val, test = (task.dataset(s) for s in ("train", "val", "test"))
    assert len(train) + len(val) == 3991 and len(test) == 908
    assert 350 <= len(val) <= 450
    assert np.bincount(test.labels[test.index], minlength=10).tolist() == TEST_COUNTS
    assert not set(train.index.tolist()) & set(val.index.tolist())
    assert set(np.unique(train.labels[val.index]).tolist()) == set(range(10))  # stratified
    sample = test[0]
    assert sample["coord"].shape == (1024, 3) and sample["feat"].shape == (1024, 3)
    assert sample["label"].shape == () and sample["label"].dtype == np.int64
    assert np.linalg.norm(sample["coord"], axis=1).max() <= 1.0 + 1e-4  # unit sphere release
    facts = task.describe()
    assert facts["sizes"] == {"train": len(train), "val": len(val), "test": 908}
    assert "never used" in facts["test"]
    assert task.state()["class_names"] == MODELNET10


def test_h5_layout_and_loader(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES, per_class=(6, 2), points=64)
    cfg = ModelNetConfig(root=str(root), num_points=32, val_fraction=0.2, features=[])
    task = build_modelnet(cfg, ctx)
    assert task.info.in_channels == 0
    assert [len(task.dataset(s)) for s in ("train", "val", "test")] == [15, 3, 6]
    loader = DataLoader(task.dataset("train"), batch_size=4, collate_fn=task.collate, shuffle=True)
    batch = next(iter(loader))
    assert batch["coord"].shape == (128, 3) and batch["feat"].shape == (128, 0)
    assert batch["offset"].tolist() == [32, 64, 96, 128] and batch["target"].shape == (4,)
    # evaluation items are deterministic (first num_points points, no augmentation)
    with h5py.File(root / "ply_data_test0.h5") as fh:
        np.testing.assert_array_equal(task.dataset("test")[1]["coord"], fh["data"][1, :32])


def test_h5_bad_input(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES)
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(root), num_points=1000), ctx)
    assert "fewer than num_points=1000" in str(e.value)
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(root), features=["coord", "normal"]), ctx)
    assert "'normal'" in str(e.value)
    (root / "shape_names.txt").write_text("bathtub\n")
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(root), num_points=8), ctx)
    assert "outside 0..0 of shape_names.txt" in str(e.value)
    (root / "shape_names.txt").unlink()
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(root), layout="h5"), ctx)
    msg = str(e.value)
    assert "shape_names.txt" in msg and "missing class file" in msg and "\n" not in msg
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(tmp_path / "nowhere")), ctx)
    assert "not found" in str(e.value)


def test_h5_missing_key(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES)
    with h5py.File(root / "ply_data_train0.h5", "a") as fh:
        del fh["label"]
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(root), num_points=8), ctx)
    assert "ply_data_train0.h5: missing key 'label'" in str(e.value)


def test_normal_resampled_layout_cached(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_txt(tmp_path / "mn40", CLASSES, per_class=(4, 2), points=40)
    before = files_under(root)
    cfg = ModelNetConfig(root=str(root), num_points=32, features=["coord", "normal"], val_fraction=0.25)
    task = build_modelnet(cfg, ctx)
    assert task.describe()["layout"] == "normal_resampled"
    assert task.info.in_channels == 6
    assert [len(task.dataset(s)) for s in ("train", "val", "test")] == [9, 3, 6]
    item = task.dataset("test")[0]
    np.testing.assert_allclose(np.linalg.norm(item["feat"][:, 3:], axis=1), 1.0, atol=1e-4)
    assert files_under(root) == before  # nothing written beside the raw data
    assert any((ctx.cache_dir / "modelnet").iterdir())
    # the second build reads the cache, not the text files
    from sciformer.data.pointcloud import modelnet_layouts

    def unread(*args: object) -> None:
        raise AssertionError("a shape file was parsed again")

    real = modelnet_layouts._load_txt_shape
    modelnet_layouts._load_txt_shape = unread
    try:
        again = build_modelnet(cfg, ctx)
    finally:
        modelnet_layouts._load_txt_shape = real
    np.testing.assert_array_equal(again.dataset("test")[0]["feat"], item["feat"])
    # an edited shape file (here: every shape moved 1 along x) is read again
    for txt in root.glob("*/*.txt"):
        rows = np.loadtxt(txt, delimiter=",", ndmin=2)
        rows[:, 0] += 1.0
        np.savetxt(txt, rows, delimiter=",", fmt="%.6f")
    edited = build_modelnet(cfg, ctx)
    assert not np.array_equal(edited.dataset("test")[0]["feat"], item["feat"])


def test_normal_resampled_unknown_class(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_txt(tmp_path / "mn40", CLASSES, per_class=(2, 1), points=10)
    (root / "modelnet40_test.txt").write_text("sofa_0001\n")
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(root), num_points=8), ctx)
    assert "class 'sofa' not in modelnet40_shape_names.txt" in str(e.value)


def test_off_layout_sampled_and_cached(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_off(tmp_path / "off", CLASSES, per_class=(3, 1))
    before = files_under(root)
    cfg = ModelNetConfig(root=str(root), num_points=128, features=["normal"], val_fraction=0.0)
    task = build_modelnet(cfg, ctx)
    assert task.describe()["layout"] == "off"
    assert task.info.class_names == CLASSES
    assert [len(task.dataset(s)) for s in ("train", "val", "test")] == [9, 0, 3]
    test = task.dataset("test")
    radii = [np.linalg.norm(test[i]["coord"], axis=1).max() for i in range(3)]
    np.testing.assert_allclose(radii, 1.0, atol=1e-5)  # unit sphere
    np.testing.assert_allclose(np.linalg.norm(test[0]["feat"], axis=1), 1.0, atol=1e-5)
    assert files_under(root) == before
    # same sampling seed -> same points; another seed -> other points
    again = build_modelnet(cfg, ctx).dataset("test")[2]["coord"]
    np.testing.assert_array_equal(again, test[2]["coord"])
    other = build_modelnet(cfg.model_copy(update={"sample_seed": 1}), ctx).dataset("test")[2]["coord"]
    assert not np.array_equal(other, again)


def test_layout_not_recognised(tmp_path: Path, ctx: BuildContext) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as e:
        build_modelnet(ModelNetConfig(root=str(tmp_path / "empty")), ctx)
    assert "not a ModelNet folder" in str(e.value)


def test_config_validation() -> None:
    with pytest.raises(ValidationError):
        ModelNetConfig(num_point=1024)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="did you mean 'random_scale'"):
        ModelNetConfig(train_transforms=[{"name": "random_scal"}])
    with pytest.raises(ValidationError, match="unknown feature 'colour'"):
        ModelNetConfig(features=["colour"])
    assert ModelNetConfig(features=["xyz", "normals"]).features == ["coord", "normal"]


def test_predictor_classifies_a_mesh(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    import json

    import torch

    from sciformer.data.pointcloud.modelnet import predict_modelnet_file

    assert DATASETS._entries["modelnet"].predictor is predict_modelnet_file
    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES)
    cfg = ModelNetConfig(root=str(root), num_points=48)
    state = build_modelnet(cfg, ctx).state()
    (tmp_path / "cube.off").write_text(fakes.off_text(fakes.cube_vertices, fakes.cube_quads, quirk=True))

    def bed(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        assert batch["coord"].shape == (48, 3) and batch["offset"].tolist() == [48]
        assert torch.linalg.norm(batch["coord"], dim=1).max() <= 1.0 + 1e-5  # unit sphere
        return torch.tensor([[0.0, 3.0, 1.0]])

    out = predict_modelnet_file(cfg, state, bed, tmp_path / "cube.off", tmp_path / "cube.json", batch_size=1)
    report = json.loads(out.read_text())
    assert report["class"] == "bed" and report["index"] == 1
    assert sum(report["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    probs = np.load(predict_modelnet_file(cfg, state, bed, tmp_path / "cube.off", tmp_path / "p.npy", batch_size=1))
    assert probs.shape == (3,) and probs.argmax() == 1


def test_predictor_votes_average_augmented_copies(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    import json

    import torch

    from sciformer.contracts import PredictOptions
    from sciformer.data.pointcloud.modelnet import predict_modelnet_file
    from sciformer.errors import SciformerError

    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES)
    cfg = ModelNetConfig(root=str(root), num_points=48, vote_transforms=[{"name": "random_sample", "n": 20},
                                                                       {"name": "random_scale", "scale": [0.5, 2.0]}])
    state = build_modelnet(cfg, ctx).state()
    (tmp_path / "cube.off").write_text(fakes.off_text(fakes.cube_vertices, fakes.cube_quads, quirk=True))
    batches: list[torch.Tensor] = []

    def by_extent(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batches.append(batch["offset"].clone())
        ends = batch["offset"].tolist()
        extent = torch.stack([batch["coord"][s:e].abs().max() for s, e in zip([0] + ends[:-1], ends, strict=True)])  # (b,)
        return torch.stack([extent, -extent, torch.zeros_like(extent)], dim=1)  # (b, 3) logits vary per copy

    out = predict_modelnet_file(cfg, state, by_extent, tmp_path / "cube.off", tmp_path / "v.json", batch_size=3,
                                options=PredictOptions(votes=5))
    assert [b.tolist() for b in batches] == [[20, 40, 60], [20, 40]]  # 5 copies of 20 points, in batches of 3
    report = json.loads(out.read_text())
    assert sum(report["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    again = json.loads(predict_modelnet_file(cfg, state, by_extent, tmp_path / "cube.off", tmp_path / "w.json", batch_size=5,
                                             options=PredictOptions(votes=5)).read_text())
    assert again["probabilities"] == report["probabilities"]  # seeded copies, whatever the batch size
    single = json.loads(predict_modelnet_file(cfg, state, by_extent, tmp_path / "cube.off", tmp_path / "s.json", batch_size=5).read_text())
    assert single["probabilities"] != report["probabilities"]
    with pytest.raises(SciformerError, match="--tta-rotations does not apply to 'modelnet' predictions"):
        predict_modelnet_file(cfg, state, by_extent, tmp_path / "cube.off", tmp_path / "x.json", batch_size=1,
                              options=PredictOptions(rotations=4))


def test_a_point_file_is_classified_whatever_order_it_lists_its_points_in(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    """A scan sorted by height or in scan lines: the same points give the same subset (a seeded
    random one, as training draws from its randomly ordered files), never the file's first points."""
    import torch

    from sciformer.contracts import PredictOptions
    from sciformer.data.pointcloud.modelnet import predict_modelnet_file
    from sciformer.errors import SciformerError

    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES)
    cfg = ModelNetConfig(root=str(root), num_points=48)
    state = build_modelnet(cfg, ctx).state()
    rng = np.random.default_rng(4)
    cloud = rng.normal(size=(5000, 3)) * [1.0, 0.5, 2.0]  # (5000, 3)
    seen: list[np.ndarray] = []

    def order_sensitive(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        coord = batch["coord"]  # (48, 3): logits from the first points, so only the same points in the same order agree
        seen.append(coord.numpy().copy())
        return torch.stack([coord[:5, 0].sum(), coord[:5, 1].sum(), coord[:5, 2].sum()])[None]  # (1, 3)

    probs = []
    for name, rows in (("shuffled", rng.permutation(5000)), ("by_height", np.argsort(cloud[:, 2])), ("as_is", np.arange(5000))):
        np.save(tmp_path / f"{name}.npy", cloud[rows])
        probs.append(np.load(predict_modelnet_file(cfg, state, order_sensitive, tmp_path / f"{name}.npy", tmp_path / f"{name}_p.npy", 1)))
    np.testing.assert_array_equal(probs[0], probs[1])
    np.testing.assert_array_equal(probs[0], probs[2])
    spread = seen[1][:, 2]
    assert spread.min() < -0.3 and spread.max() > 0.3  # drawn across the whole height, not its bottom slice
    for option, value in (("category", "Chair"), ("labels", "gt.npy"), ("probabilities", True)):
        with pytest.raises(SciformerError, match="does not apply to 'modelnet' predictions"):
            predict_modelnet_file(cfg, state, order_sensitive, tmp_path / "as_is.npy", tmp_path / "x.npy", 1,
                                  options=PredictOptions(**{option: value}))


def test_cached_labels_follow_the_class_list(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    """A class folder added (with training meshes only) shifts every class index after it: the
    cached test labels must follow, not keep the indices of the earlier class list."""
    root = fakes.modelnet_off(tmp_path / "off", CLASSES, per_class=(2, 1))
    cfg = ModelNetConfig(root=str(root), num_points=32, val_fraction=0.0)
    task = build_modelnet(cfg, ctx)
    before = [task.info.class_names[int(task.dataset("test")[i]["label"])] for i in range(3)]
    (root / "aaa" / "train").mkdir(parents=True)
    for src in sorted((root / CLASSES[0] / "train").glob("*.off")):
        (root / "aaa" / "train" / src.name).write_bytes(src.read_bytes())
    again = build_modelnet(cfg, ctx)
    assert again.info.class_names == ["aaa", *CLASSES]
    after = [again.info.class_names[int(again.dataset("test")[i]["label"])] for i in range(3)]
    assert after == before


def test_a_test_mesh_linked_to_a_training_mesh_is_refused(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_off(tmp_path / "off", CLASSES, per_class=(2, 1))
    test_mesh = sorted((root / CLASSES[0] / "test").glob("*.off"))[0]
    test_mesh.unlink()
    test_mesh.symlink_to(sorted((root / CLASSES[0] / "train").glob("*.off"))[0])
    with pytest.raises(DataError, match=r"<class>/test/: .* is also in <class>/train/"):
        build_modelnet(ModelNetConfig(root=str(root), num_points=32, val_fraction=0.0), ctx)


def test_a_shape_in_both_normal_resampled_lists_is_refused(tmp_path: Path, fakes, ctx: BuildContext) -> None:
    root = fakes.modelnet_txt(tmp_path / "mn40", CLASSES, per_class=(2, 1), points=10)
    train = (root / "modelnet40_train.txt").read_text().split()
    test = root / "modelnet40_test.txt"
    test.write_text(test.read_text().rstrip("\n") + f"\n{train[0]}\n")
    with pytest.raises(DataError, match=rf"modelnet40_test\.txt: {train[0]}\.txt is also in modelnet40_train\.txt"):
        build_modelnet(ModelNetConfig(root=str(root), num_points=8), ctx)


def test_shape_points_are_the_same_for_any_order_even_with_repeated_coordinates() -> None:
    """A point repeated with other normals (a mesh vertex shared by faces): the subset, normals
    included, does not depend on which of the copies the file lists first."""
    from sciformer.data.pointcloud.modelnet import shape_points

    rng = np.random.default_rng(9)
    coord = np.repeat(rng.normal(size=(100, 3)), 3, axis=0)  # (300, 3) every point three times
    normal = rng.normal(size=(300, 3))
    first = shape_points({"coord": coord, "normal": normal}, 64)
    for rows in (rng.permutation(300), np.arange(300)[::-1]):
        other = shape_points({"coord": coord[rows], "normal": normal[rows]}, 64)
        np.testing.assert_array_equal(other["coord"], first["coord"])
        np.testing.assert_array_equal(other["normal"], first["normal"])


def test_degenerate_shapes_are_refused_or_a_warning(tmp_path: Path, fakes, ctx: BuildContext, one_line_error) -> None:
    """Today: 1,024 copies of one point and a 10-point file get a confident class without a word
    (7.5 % and 20 % accuracy on ModelNet10). All points at one location: one line; fewer distinct
    points than the model trained on (or than 128): a warning naming num_points."""
    import warnings

    import torch

    from sciformer.data.pointcloud.modelnet import predict_modelnet_file

    root = fakes.modelnet_h5(tmp_path / "mn", CLASSES)
    cfg = ModelNetConfig(root=str(root), num_points=48)
    state = build_modelnet(cfg, ctx).state()
    calls: list[int] = []

    def counting(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        calls.append(len(batch["coord"]))
        return torch.tensor([[0.0, 3.0, 1.0]])

    np.save(tmp_path / "one.npy", np.tile([[0.3, -1.0, 2.0]], (1024, 1)))
    with pytest.raises(DataError) as err:
        predict_modelnet_file(cfg, state, counting, tmp_path / "one.npy", tmp_path / "one.json", 1)
    one_line_error(err, "one.npy", "all 1024 points lie at one location (0.3, -1, 2)")
    assert calls == [] and not (tmp_path / "one.json").exists()
    rng = np.random.default_rng(2)
    for n, warned in ((10, True), (47, True), (48, False), (5000, False)):
        np.save(tmp_path / f"n{n}.npy", rng.normal(size=(n, 3)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            predict_modelnet_file(cfg, state, counting, tmp_path / f"n{n}.npy", tmp_path / f"n{n}.json", 1)
        said = [str(w.message) for w in caught]
        assert len(said) == warned, said
        if warned:
            assert f"only {n} distinct points" in said[0] and "num_points=48" in said[0] and f"n{n}.npy" in said[0]
