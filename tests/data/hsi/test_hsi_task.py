"""The hsi_scene dataset: config validation, building, batches, state, artifacts, predictions."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.io
import torch
from pydantic import ValidationError
from torch.utils.data import DataLoader

from sciformer import registry
from sciformer.contracts import BuildContext, TaskData, default_data_root
from sciformer.data.hsi import task as hsi_task
from sciformer.data.hsi.task import HSISceneConfig, build_hsi_scene, predict_hsi_file
from sciformer.errors import ConfigError, DataError

NAMES = ["a", "b", "c", "d"]


@pytest.fixture
def scene_dir(tmp_path, scene_factory):
    cube, gt, wl = scene_factory(h=30, w=26, bands=8, classes=4)
    scipy.io.savemat(tmp_path / "scene.mat", {"cube": cube, "gt": gt.astype(np.uint8), "wavelength": wl})
    return tmp_path, cube, gt, wl


def build(tmp_path, **data):
    cfg = HSISceneConfig(source="scene.mat", **data)
    return build_hsi_scene(cfg, BuildContext(base_dir=tmp_path, seed=0))


def centre_predictor(num_classes: int):
    """Stand-in model: logits = the centre pixel's first ``num_classes`` channels."""

    def predict(batch):
        p = batch["patch"]
        r = p.shape[-1] // 2
        return p[:, :num_classes, r, r]

    return predict


# ----------------------------------------------------------------------------- config


def test_config_defaults_and_bool_augment():
    cfg = HSISceneConfig()
    assert cfg.source == "indian_pines" and cfg.patch_size == 7 and cfg.split.kind == "blocks"
    assert cfg.split.block_size == 12 and cfg.split.train_fraction == 0.5 and cfg.margin == 3
    assert cfg.split.val_fraction == 0.1 and cfg.normalise == "standard" and cfg.padding == "reflect"
    off = HSISceneConfig(augment=False)
    assert not off.augment.flip and not off.augment.rotate
    assert HSISceneConfig(split={"kind": "stratified", "train_per_class": 5}).split.train_per_class == 5
    assert HSISceneConfig(split={"kind": "stratified", "train_per_class": 0.05}).split.train_per_class == 0.05
    by_count = HSISceneConfig(split={"val_per_class": 3})
    assert by_count.split.val_fraction is None and by_count.split.val_per_class == 3


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"split": {"kind": "fixed", "train_path": "s.mat"}},
        {"split": {"kind": "stratified", "train_per_class": 7, "val_per_class": 2}},
        {"augment": False, "pca_components": 5, "class_names": ["x", "y"]},
    ],
)
def test_config_dump_validates_again(data):
    cfg = HSISceneConfig(**data)  # checkpoints store the dumped config and validate it again
    assert HSISceneConfig(**cfg.model_dump()) == cfg
    assert HSISceneConfig.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.parametrize(
    ("data", "loc", "text"),
    [
        ({"patch_size": 6}, "patch_size", "odd"),
        ({"padding": "wrap"}, "padding", "reflect"),
        ({"normalise": "zscore"}, "normalise", "standard"),
        ({"pca_components": 0}, "pca_components", "greater than or equal to 1"),
        ({"patchsize": 7}, "patchsize", "Extra inputs are not permitted"),
        ({"split": {"kind": "random"}}, "split.kind", "fixed"),
        ({"split": {"kind": "stratified", "train_per_class": 5.0}}, "split.train_per_class", "use an int for a count"),
        ({"split": {"kind": "stratified", "train_per_class": 0}}, "split.train_per_class", ">= 1"),
        ({"split": {"kind": "stratified", "train_per_class": True}}, "split.train_per_class", "boolean"),
        ({"split": {"kind": "stratified", "block_size": 8}}, "split", "split.block_size applies to kind 'blocks'"),
        ({"split": {"kind": "fixed"}}, "split", "split.train_path is required"),
        ({"split": {"val_fraction": 0.1, "val_per_class": 2}}, "split", "not both"),
        ({"split": {"val_fraction": 1.0}}, "split.val_fraction", "less than 1"),
        ({"split": {"train_fraction": 0}}, "split.train_fraction", "greater than 0"),
        ({"class_names": ["a", "a"]}, "class_names", "duplicate"),
    ],
)
def test_config_errors_are_precise(data, loc, text):
    with pytest.raises(ValidationError) as e:
        HSISceneConfig(**data)
    err = e.value.errors()[0]
    assert ".".join(str(p) for p in err["loc"]).startswith(loc)
    assert text in err["msg"]


def test_registered(monkeypatch):
    # Only this module's registration matters here: do not import the other built-ins.
    monkeypatch.setattr(registry, "_loaded", True)
    entry = registry.DATASETS.get("hsi_scene")
    assert entry.builder is build_hsi_scene
    assert entry.config is HSISceneConfig
    assert entry.predictor is predict_hsi_file
    assert "sciformer.data.hsi.task" in registry._BUILTIN_MODULES


# ----------------------------------------------------------------------------- building


def test_build_from_file_relative_to_config(scene_dir):
    tmp_path, cube, gt, wl = scene_dir
    task = build(tmp_path, patch_size=5, class_names=NAMES, split={"kind": "stratified", "train_per_class": 10})
    assert isinstance(task, TaskData)
    assert task.info.num_classes == 4 and task.info.class_names == NAMES and task.info.in_channels == 8
    assert task.info.patch_size == 5
    np.testing.assert_allclose(task.info.wavelengths, wl)
    counts = task.split.counts()
    total = 0
    for part in ("train", "val", "test"):
        ds = task.dataset(part)
        assert len(ds) == counts[part]
        total += len(ds)
        label_map = task.split.maps()[part]
        coords = ds.coords.numpy()
        np.testing.assert_array_equal(ds.targets.numpy(), gt[coords[:, 0], coords[:, 1]] - 1)  # 0-based
        assert np.all(gt[coords[:, 0], coords[:, 1]] > 0) and np.all(label_map[coords[:, 0], coords[:, 1]] > 0)
    assert total == np.count_nonzero(gt)  # stratified, no margin: every labelled pixel, none unlabelled
    assert task.dataset("train").flip and not task.dataset("test").flip
    with pytest.raises(ConfigError, match="unknown split 'dev'"):
        task.dataset("dev")


def test_normaliser_fitted_on_training_pixels(scene_dir):
    tmp_path, cube, gt, _ = scene_dir
    task = build(tmp_path)
    train = task.split.train > 0
    np.testing.assert_allclose(task.normalizer.shift, cube[train].astype(np.float64).mean(0), rtol=1e-9)
    r = 3
    centre = task.padded[:, r:-r, r:-r].permute(1, 2, 0).numpy()  # (H, W, C)
    np.testing.assert_allclose(centre[train].mean(0), 0.0, atol=1e-4)


def test_collate_and_dataloader(scene_dir):
    tmp_path, *_ = scene_dir
    task = build(tmp_path, patch_size=3)
    loader = DataLoader(task.dataset("train"), batch_size=8, collate_fn=task.collate, shuffle=True)
    batch = next(iter(loader))
    assert batch["patch"].shape == (8, 8, 3, 3) and batch["patch"].dtype == torch.float32
    assert batch["target"].shape == (8,) and batch["target"].dtype == torch.int64
    assert batch["wavelength"].shape == (8,) and batch["wavelength"].dtype == torch.float32
    pca = build(tmp_path, patch_size=3, pca_components=3)
    b = pca.collate([pca.dataset("test")[0], pca.dataset("test")[1]])
    assert b["patch"].shape == (2, 3, 3, 3) and "wavelength" not in b
    assert pca.info.in_channels == 3 and pca.info.wavelengths is None


def test_blocks_protocol_and_no_leakage(scene_dir):
    tmp_path, *_ = scene_dir
    task = build(tmp_path, split={"block_size": 6})
    d = task.describe()
    assert d["split"]["kind"] == "blocks" and d["split"]["margin"] == 3
    assert d["split"]["leakage"]["test_with_train_in_window"] == 0
    assert d["normalisation"]["fitted_on"] == "training pixels"
    assert set(d["split"]["per_class"]["train"]) == {"class_1", "class_2", "class_3", "class_4"}
    json.dumps(d)  # JSON-ready


def test_state_is_weights_only_safe(scene_dir):
    tmp_path, *_ = scene_dir
    task = build(tmp_path, pca_components=2)
    buf = io.BytesIO()
    torch.save({"data_state": task.state()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["data_state"]
    assert state["in_bands"] == 8 and state["in_channels"] == 2 and state["patch_size"] == 7
    assert state["class_names"] == task.class_names


def test_save_artifacts(scene_dir):
    tmp_path, *_ = scene_dir
    task = build(tmp_path, split={"kind": "stratified", "train_per_class": 0.2})
    run = tmp_path / "run"
    task.save_artifacts(run)
    with np.load(run / "splits.npz") as z:
        for part in ("train", "val", "test"):
            np.testing.assert_array_equal(z[part], task.split.maps()[part])
    proto = json.loads((run / "protocol.json").read_text())
    assert proto["split"]["counts"] == task.split.counts()
    assert proto["split"]["kind"] == "stratified"


def test_export_predictions(scene_dir):
    import spectral.io.envi as envi

    tmp_path, cube, gt, _ = scene_dir
    task = build(tmp_path, normalise="none", class_names=NAMES)
    out = tmp_path / "pred"
    facts = task.export_predictions(centre_predictor(4), out, 50, SimpleNamespace(png=True, envi=True, npy=True))
    expected = cube[:, :, :4].argmax(2) + 1  # stand-in model's decision, 1-based
    np.testing.assert_array_equal(np.load(out / "map.npy"), expected)
    assert (out / "map.png").stat().st_size > 0
    img = envi.open(str(out / "map.hdr"))
    np.testing.assert_array_equal(np.asarray(img.load())[:, :, 0], expected)
    assert [n.strip() for n in img.metadata["class names"]][1:] == NAMES
    assert facts["map_shape"] == [30, 26] and facts["map_split"] == "test"
    test = task.split.test
    assert facts["map_overall_accuracy"] == pytest.approx(np.mean(expected[test > 0] == test[test > 0]))
    with pytest.raises(ConfigError, match="unknown split"):
        task.export_predictions(centre_predictor(4), out, 50, None, split="holdout")
    only_npy = tmp_path / "pred2"
    task.export_predictions(centre_predictor(4), only_npy, 50, SimpleNamespace(png=False, envi=False, npy=True))
    assert sorted(p.name for p in only_npy.iterdir()) == ["map.npy"]


def test_predict_file(scene_dir):
    tmp_path, cube, gt, _ = scene_dir
    cfg = HSISceneConfig(source="scene.mat", normalise="none", patch_size=3)
    task = build_hsi_scene(cfg, BuildContext(base_dir=tmp_path))
    state = task.state()
    expected = cube[:, :, :4].argmax(2) + 1
    np.save(tmp_path / "new.npy", cube)
    for name in ("out.npy", "out.png", "out.hdr"):
        out = predict_hsi_file(cfg, state, centre_predictor(4), tmp_path / "new.npy", tmp_path / name, 64)
        assert out == tmp_path / name and out.is_file()
        np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
    assert (tmp_path / "out.img").is_file()
    import matplotlib.image

    with_gt = predict_hsi_file(cfg, state, centre_predictor(4), tmp_path / "scene.mat", tmp_path / "gt.png", 64)
    assert matplotlib.image.imread(with_gt).shape[1] > matplotlib.image.imread(tmp_path / "out.png").shape[1]
    np.save(tmp_path / "short.npy", cube[:, :, :5])
    with pytest.raises(DataError, match="has 5 bands and no wavelengths; the model was trained on 8 bands"):
        predict_hsi_file(cfg, state, centre_predictor(4), tmp_path / "short.npy", tmp_path / "x.npy", 64)
    with pytest.raises(DataError, match="unsupported output suffix '.csv'"):
        predict_hsi_file(cfg, state, centre_predictor(4), tmp_path / "new.npy", tmp_path / "x.csv", 64)
    with pytest.raises(DataError, match="not a hsi_scene checkpoint"):
        predict_hsi_file(cfg, {}, centre_predictor(4), tmp_path / "new.npy", tmp_path / "x.npy", 64)


def test_build_errors(scene_dir):
    tmp_path, cube, gt, _ = scene_dir
    with pytest.raises(DataError, match="file not found"):
        build_hsi_scene(HSISceneConfig(source="missing.mat"), BuildContext(base_dir=tmp_path))
    with pytest.raises(ConfigError, match="2 names given but the labels go up to 4"):
        build(tmp_path, class_names=["x", "y"])
    with pytest.raises(ConfigError, match="data.image_key: does not apply to the built-in"):
        build_hsi_scene(HSISceneConfig(image_key="x"), BuildContext(base_dir=tmp_path))
    np.save(tmp_path / "nolabels.npy", cube)
    with pytest.raises(DataError, match="no 2-D integer label map"):
        build_hsi_scene(HSISceneConfig(source="nolabels.npy"), BuildContext(base_dir=tmp_path))


def test_fixed_split_from_separate_files(scene_dir):
    tmp_path, cube, gt, _ = scene_dir
    tr = np.where((np.arange(gt.size).reshape(gt.shape) % 5) == 0, gt, 0)
    te = np.where(tr > 0, 0, gt)
    scipy.io.savemat(tmp_path / "split.mat", {"TR": tr.astype(np.uint8), "TE": te.astype(np.uint8)})
    task = build(tmp_path, split={"kind": "fixed", "train_path": "split.mat", "val_fraction": 0.0})
    np.testing.assert_array_equal(task.split.train, tr)
    np.testing.assert_array_equal(task.split.test, te)
    np.save(tmp_path / "tr.npy", tr)
    np.save(tmp_path / "te.npy", te)
    task = build(tmp_path, split={"kind": "fixed", "train_path": "tr.npy", "test_path": "te.npy"})
    np.testing.assert_array_equal(task.split.train + task.split.val, tr)


# ----------------------------------------------------------------------------- real data

SPLIT_FILE = default_data_root() / "indian_pines_splits" / "spectralformer_TR_TE.mat"


def test_indian_pines_default_blocks():
    pytest.importorskip("tensorly", reason="Indian Pines ships in tensorly==0.10.0: pip install 'sciformer[hsi-data]'")
    task = build_hsi_scene(HSISceneConfig(), BuildContext(base_dir=SPLIT_FILE.parent))
    d = task.describe()
    assert task.info.num_classes == 16 and task.info.in_channels == 200
    assert d["scene"] == {"height": 145, "width": 145, "bands": 200, "labelled_pixels": 10249}
    assert d["split"]["leakage"]["test_with_train_in_window"] == 0
    assert d["split"]["classes_without_train"] == []
    assert 0.4 < d["split"]["counts"]["train"] / 10249 < 0.6
    assert task.padded.shape == (200, 151, 151)


@pytest.mark.skipif(not SPLIT_FILE.is_file(), reason=f"real data not found: {SPLIT_FILE} (set SCIFORMER_DATA)")
def test_indian_pines_fixed_split_task():
    pytest.importorskip("tensorly", reason="Indian Pines ships in tensorly==0.10.0: pip install 'sciformer[hsi-data]'")
    cfg = HSISceneConfig(split={"kind": "fixed", "train_path": SPLIT_FILE.name, "val_fraction": 0.0}, pca_components=30)
    task = build_hsi_scene(cfg, BuildContext(base_dir=SPLIT_FILE.parent))
    assert len(task.dataset("train")) == 695 and len(task.dataset("test")) == 9671
    assert task.info.in_channels == 30
    leak = task.describe()["split"]["leakage"]
    assert leak["same_class_fraction"] == pytest.approx(0.76, abs=0.01)


def test_module_docstring_defaults_match_config():
    doc = hsi_task.__doc__
    cfg = HSISceneConfig()
    assert f"block_size: {cfg.split.block_size}" in doc and f"patch_size: {cfg.patch_size}" in doc


@pytest.mark.parametrize("normalise, pca", [("standard", None), ("minmax", None), ("standard", 4)])
def test_illumination_augmentation_is_a_scaled_raw_spectrum(scene_dir, normalise, pca):
    """illumination: a training patch equals the normaliser applied to the raw patch times the
    drawn factor (oracle: transform of the scaled raw cube), for every affine normalisation."""
    tmp_path, cube, _, _ = scene_dir
    task = build(tmp_path, normalise=normalise, pca_components=pca, split={"kind": "stratified", "train_per_class": 5},
                 augment={"flip": False, "rotate": False, "illumination": 0.3})
    train = task.dataset("train")
    r = task.cfg.patch_size // 2
    padded_raw = np.pad(cube, ((r, r), (r, r), (0, 0)), mode="reflect")  # (H + 2r, W + 2r, B) raw spectra
    factors = []
    for index in (0, 3, 7):
        torch.manual_seed(11 + index)
        item = train[index]
        torch.manual_seed(11 + index)
        s = 1.0 + 0.3 * (2.0 * float(torch.rand(())) - 1.0)  # the factor the item drew
        i, j = (int(v) for v in train.coords[index])
        raw = padded_raw[i : i + 2 * r + 1, j : j + 2 * r + 1]  # (p, p, B)
        expected = task.normalizer.transform(s * raw).transpose(2, 0, 1)  # (C, p, p)
        np.testing.assert_allclose(item["patch"].numpy(), expected, rtol=1e-4, atol=1e-4)
        factors.append(s)
    assert len(set(factors)) == 3 and all(0.7 <= s <= 1.3 for s in factors)
    assert not hasattr(task.dataset("val"), "zero") or task.dataset("val").illumination == 0.0


def test_noise_augmentation_spread_and_eval_untouched(scene_dir):
    """noise: residuals against the clean patch have the configured standard deviation
    (oracle: the sample std over many values); validation patches are never augmented."""
    tmp_path, _, _, _ = scene_dir
    split = {"kind": "stratified", "train_per_class": 8, "val_per_class": 2}
    clean = build(tmp_path, split=split, augment=False).dataset("train")
    noisy = build(tmp_path, split=split, augment={"flip": False, "rotate": False, "noise": 0.2}).dataset("train")
    residual = torch.cat([(noisy[k]["patch"] - clean[k]["patch"]).reshape(-1) for k in range(len(clean))])
    assert residual.numel() > 5000 and abs(float(residual.std()) - 0.2) < 0.01 and abs(float(residual.mean())) < 0.01
    val = build(tmp_path, split=split, augment={"noise": 0.2, "illumination": 0.2}).dataset("val")
    ref = build(tmp_path, split=split, augment=False).dataset("val")
    assert torch.equal(val[0]["patch"], ref[0]["patch"])
    assert "illumination=0.2" in repr(build(tmp_path, split=split, augment={"illumination": 0.2}).dataset("train"))


def test_a_scene_without_centres_is_evaluated_in_the_training_files_order(scene_dir) -> None:
    """A checkpoint trained on bands sorted by centre records the file's order (band_order); a
    scene without centres (same band count) is fed in that order. Oracle: the cube indexed by it."""
    tmp_path, cube, gt, _ = scene_dir
    scipy.io.savemat(tmp_path / "plain.mat", {"cube": cube, "gt": gt.astype(np.uint8)})
    task = build_hsi_scene(HSISceneConfig(source="plain.mat"), BuildContext(base_dir=tmp_path, seed=0))
    before = task.padded.clone()
    order = np.array([3, 1, 0, 2, 7, 6, 5, 4])
    state = {**task.state(), "wavelengths": torch.linspace(400.0, 1100.0, 8), "band_order": torch.as_tensor(order),
             "bands_ascending": True, "position_source": "wavelength"}
    task.match_checkpoint(state)
    torch.testing.assert_close(task.padded, before[torch.as_tensor(order)])
    torch.testing.assert_close(task.make_batch(task.padded[None, :, :3, :3])["wavelength"], state["wavelengths"])
