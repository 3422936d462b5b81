"""Hyperspectral ``predict`` keeps the scene's georeference: ENVI map info through to ENVI and
GeoTIFF maps (no-data, colour table, class names), GeoTIFF cubes in, and a ``--labels`` map
for the ground-truth panel and scores. GeoTIFFs are read back with rasterio (the writer)
and with Pillow (an independent TIFF reader)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
from spectral.io import envi
from synthetic import make_hsi_scene, write_tiny_hsi_config

from sciformer.cli import main
from sciformer.data.palette import class_colors

rasterio = pytest.importorskip("rasterio")
MAP_INFO = ["UTM", "1", "1", "500000.0", "4200000.0", "30.0", "30.0", "32", "North", "WGS-84", "units=Meters"]


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny trained run, its cube as an ENVI file with a UTM map info, and its label map."""
    root = tmp_path_factory.mktemp("hsi")
    cube, gt, _ = make_hsi_scene(h=20, w=24, bands=9, classes=3, block=4)
    scipy.io.savemat(root / "scene.mat", {"cube": cube.astype(np.float32), "labels": gt.astype(np.uint8)})
    write_tiny_hsi_config(root, "source: scene.mat, class_names: [red, green, blue]", train_per_class=30,
                          train="epochs: 2, batch_size: 16, progress: never")
    assert main(["train", "-c", str(root / "tiny.yaml"), "-o", str(root / "run")]) == 0
    envi.save_image(str(root / "cube.hdr"), cube.astype(np.float32), ext=".img", force=True,
                    metadata={"map info": MAP_INFO})
    np.save(root / "gt.npy", gt.astype(np.int64))
    return {"run": root / "run", "envi": root / "cube.hdr", "gt": root / "gt.npy", "cube": root / "scene.mat"}


def predict(scene: dict[str, Path], inp: Path, out: Path, *extra: str) -> int:
    return main(["predict", "--checkpoint", str(scene["run"]), "-i", str(inp), "-o", str(out), *extra])


def test_geotiff_map_keeps_the_envi_georeference(scene: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "map.tif"
    assert predict(scene, scene["envi"], out) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.tif"]  # no .npy sibling
    with rasterio.open(out) as src:
        assert src.crs.to_epsg() == 32632  # UTM 32 North, WGS-84 from the map info
        assert list(src.transform)[:6] == [30.0, 0.0, 500000.0, 0.0, -30.0, 4200000.0]
        assert src.nodata == 0 and src.count == 1 and src.dtypes[0] == "uint8"
        label_map = src.read(1)
        cmap = src.colormap(1)
        tags = src.tags()
    assert label_map.shape == (20, 24) and set(np.unique(label_map)) <= {1, 2, 3}
    colours = class_colors(3)
    assert [cmap[i][:3] for i in range(4)] == [tuple(int(v) for v in colours[i]) for i in range(4)]
    assert tags["CLASS_1"] == "red" and tags["CLASS_0"] == "Unclassified"
    # Pillow, an independent TIFF reader: the same pixels, palette and GeoTIFF tags
    from PIL import Image

    with Image.open(out) as im:
        assert im.mode == "P"
        np.testing.assert_array_equal(np.asarray(im), label_map)
        palette = np.asarray(im.getpalette()[: 3 * 4]).reshape(4, 3)
        np.testing.assert_array_equal(palette, colours)
        tiff_tags = dict(im.tag_v2)
    assert tiff_tags[33550][:2] == (30.0, 30.0)  # ModelPixelScale
    assert tuple(tiff_tags[33922][3:5]) == (500000.0, 4200000.0)  # ModelTiepoint: pixel (0, 0) -> easting, northing
    assert 32632 in tiff_tags[34735]  # GeoKeyDirectory names the EPSG code
    assert "red" in tiff_tags[42112] and tiff_tags[42113] == "0"  # GDAL metadata (class names) and no-data


def test_envi_map_carries_map_info(scene: dict[str, Path], tmp_path: Path) -> None:
    assert predict(scene, scene["envi"], tmp_path / "map.hdr") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.hdr", "map.img"]
    header = envi.read_envi_header(str(tmp_path / "map.hdr"))
    assert [v.strip() for v in header["map info"]] == MAP_INFO
    assert header["class names"][1:] == ["red", "green", "blue"]


def test_geotiff_cube_in_envi_map_out(scene: dict[str, Path], tmp_path: Path) -> None:
    from rasterio.transform import Affine

    cube = scipy.io.loadmat(scene["cube"])["cube"]  # (H, W, B)
    tif = tmp_path / "cube.tif"
    with rasterio.open(tif, "w", driver="GTiff", height=20, width=24, count=9, dtype="float32",
                       crs="EPSG:32633", transform=Affine(10.0, 0.0, 400000.0, 0.0, -10.0, 5000000.0)) as dst:
        dst.write(np.moveaxis(cube, -1, 0))
    assert predict(scene, tif, tmp_path / "out.hdr") == 0
    header = envi.read_envi_header(str(tmp_path / "out.hdr"))
    assert [float(v) for v in header["map info"][3:7]] == [400000.0, 5000000.0, 10.0, 10.0]
    assert "UTM zone 33N" in ",".join(header["coordinate system string"])  # WKT (spectral splits braces at commas)
    assert predict(scene, scene["envi"], tmp_path / "same.npy") == 0
    np.testing.assert_array_equal(envi.open(str(tmp_path / "out.hdr")).read_band(0), np.load(tmp_path / "same.npy"))


@pytest.mark.parametrize("shear", [0.0, 5.0])
def test_rotated_and_sheared_georeference_through_predict(scene: dict[str, Path], tmp_path: Path, capsys, shear: float) -> None:
    """A turned GeoTIFF grid reaches ENVI (map info rotation=) and GeoTIFF maps as GDAL reads the input;
    a sheared one, which ENVI cannot express, gives an ENVI map without georeference and one warning line."""
    import math

    from rasterio.transform import Affine

    t = math.radians(15)
    transform = Affine(30 * math.cos(t), 30 * math.sin(t) + shear, 500000.0, 30 * math.sin(t), -30 * math.cos(t), 4000000.0)
    cube = scipy.io.loadmat(scene["cube"])["cube"]  # (H, W, B)
    tif = tmp_path / "cube.tif"
    with rasterio.open(tif, "w", driver="GTiff", height=20, width=24, count=9, dtype="float32", crs="EPSG:32633",
                       transform=transform) as dst:
        dst.write(np.moveaxis(cube, -1, 0))
    capsys.readouterr()
    for out in ("map.hdr", "map.tif"):
        assert predict(scene, tif, tmp_path / out) == 0
        with rasterio.open(tmp_path / out.replace(".hdr", ".img")) as src:
            kept = out == "map.tif" or not shear
            assert (src.crs.to_epsg() if src.crs else None) == (32633 if kept else None)
            np.testing.assert_allclose(list(src.transform)[:6], list(transform)[:6] if kept else [1, 0, 0, 0, 1, 0], atol=1e-6)
    err = capsys.readouterr().err
    assert err.count("WARNING") == (1 if shear else 0) and (not shear or "map.hdr is written without" in err)


def test_labels_give_the_truth_panel_and_scores(scene: dict[str, Path], tmp_path: Path, capsys) -> None:
    assert predict(scene, scene["envi"], tmp_path / "map.npy", "--labels", str(scene["gt"])) == 0
    line = capsys.readouterr().out.splitlines()[0]
    gt, pred = np.load(scene["gt"]), np.load(tmp_path / "map.npy")
    seen = gt > 0
    assert f"OA {100 * np.mean(pred[seen] == gt[seen]):.2f}" in line and f"on {seen.sum()} labelled pixels" in line
    assert predict(scene, scene["envi"], tmp_path / "map.png", "--labels", str(scene["gt"])) == 0
    np.save(tmp_path / "small.npy", np.zeros((5, 5), np.int64))
    assert predict(scene, scene["envi"], tmp_path / "m2.npy", "--labels", str(tmp_path / "small.npy")) == 2
    assert "the map is 5 x 5, the scene 20 x 24" in capsys.readouterr().err


def test_train_from_geotiff_cube_and_label_map(tmp_path: Path) -> None:
    """A GeoTIFF cube and a single-band GeoTIFF label map train like any scene file."""
    from rasterio.transform import Affine

    cube, gt, _ = make_hsi_scene(h=16, w=16, bands=6, classes=2, block=4)
    profile = {"driver": "GTiff", "height": 16, "width": 16, "crs": "EPSG:32633",
               "transform": Affine(10.0, 0.0, 400000.0, 0.0, -10.0, 5000000.0)}
    with rasterio.open(tmp_path / "cube.tif", "w", count=6, dtype="float32", **profile) as dst:
        dst.write(np.moveaxis(cube.astype(np.float32), -1, 0))
    with rasterio.open(tmp_path / "gt.tif", "w", count=1, dtype="uint8", **profile) as dst:
        dst.write(gt.astype(np.uint8)[None])
    (tmp_path / "geo.yaml").write_text(
        "name: geo\ndata:\n  name: hsi_scene\n  source: cube.tif\n  label_path: gt.tif\n  patch_size: 3\n"
        "  split: {kind: stratified, train_per_class: 10, val_fraction: 0.2}\n"
        "model: {name: spectral_spatial, dim: 8, depth: 1, num_heads: 2, band_group_size: 3}\n"
        "train: {epochs: 1, batch_size: 16, progress: never}\n")
    assert main(["train", "-c", str(tmp_path / "geo.yaml"), "-o", str(tmp_path / "run")]) == 0
    out = tmp_path / "map.tif"
    assert main(["predict", "--checkpoint", str(tmp_path / "run"), "-i", str(tmp_path / "cube.tif"), "-o", str(out),
                 "--labels", str(tmp_path / "gt.tif")]) == 0
    with rasterio.open(out) as src:
        assert src.crs.to_epsg() == 32633 and list(src.transform)[:6] == [10.0, 0.0, 400000.0, 0.0, -10.0, 5000000.0]


def pixel_probabilities(scene: dict[str, Path], rows_cols: list[tuple[int, int]]) -> np.ndarray:
    """Oracle: softmax of the model's logits on patches cut by hand (numpy reflect padding) at given pixels."""
    import torch

    import sciformer
    from sciformer.data.hsi.normalize import Normalizer

    model = sciformer.load(scene["run"], device="cpu")
    state = model.data_state
    cube = np.array(envi.open(str(scene["envi"])).load(), dtype=np.float32)  # (H, W, B)
    norm = np.asarray(Normalizer.from_state(state["normaliser"]).transform(cube), dtype=np.float32)  # (H, W, B)
    r = int(state["patch_size"]) // 2
    padded = np.pad(norm, ((r, r), (r, r), (0, 0)), mode="reflect")  # (H + 2r, W + 2r, B)
    patches = np.stack([padded[i:i + 2 * r + 1, j:j + 2 * r + 1].transpose(2, 0, 1) for i, j in rows_cols])  # (n, B, p, p)
    with torch.no_grad():
        logits = model._predict({"patch": torch.from_numpy(np.ascontiguousarray(patches))})  # (n, K)
    return logits.softmax(dim=1).numpy()


def test_probabilities_beside_the_map_in_every_format(scene: dict[str, Path], tmp_path: Path, capsys) -> None:
    """--probabilities: an (H, W, K) float32 raster beside the map, in the map's format, whose argmax
    is the map and whose pixels equal the model's softmax on patches cut by hand (pixel order kept)."""
    assert predict(scene, scene["envi"], tmp_path / "map.npy", "--probabilities") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.npy", "map_probabilities.npy"]
    assert "wrote " + str(tmp_path / "map_probabilities.npy") in capsys.readouterr().out
    probs, label_map = np.load(tmp_path / "map_probabilities.npy"), np.load(tmp_path / "map.npy")
    assert probs.shape == (20, 24, 3) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=2), 1.0, atol=1e-5)
    np.testing.assert_array_equal(probs.argmax(axis=2) + 1, label_map)
    pixels = [(0, 0), (0, 23), (19, 0), (19, 23), (7, 11), (12, 3)]  # corners (reflect padding) and inside
    np.testing.assert_allclose(probs[tuple(np.array(pixels).T)], pixel_probabilities(scene, pixels), atol=1e-5)

    assert predict(scene, scene["envi"], tmp_path / "env.hdr", "--probabilities") == 0
    img = envi.open(str(tmp_path / "env_probabilities.hdr"))
    assert img.metadata["band names"] == ["red", "green", "blue"] and img.metadata["interleave"] == "bsq"
    assert [v.strip() for v in img.metadata["map info"]] == MAP_INFO
    np.testing.assert_array_equal(np.array(img.load()), probs)

    assert predict(scene, scene["envi"], tmp_path / "geo.tif", "--probabilities") == 0
    with rasterio.open(tmp_path / "geo_probabilities.tif") as src:
        assert src.count == 3 and src.dtypes == ("float32",) * 3 and src.descriptions == ("red", "green", "blue")
        assert src.crs.to_epsg() == 32632 and list(src.transform)[:6] == [30.0, 0.0, 500000.0, 0.0, -30.0, 4200000.0]
        np.testing.assert_array_equal(np.moveaxis(src.read(), 0, 2), probs)

    assert predict(scene, scene["envi"], tmp_path / "fig.png", "--probabilities") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "fig_probabilities.npy"), probs)


def test_probabilities_never_replace_a_file(scene: dict[str, Path], tmp_path: Path, capsys) -> None:
    """The probability file is checked like the map before the model runs: an existing one is refused
    (and nothing is written), and two inputs may not write the same file."""
    (tmp_path / "map_probabilities.npy").write_bytes(b"keep")
    assert predict(scene, scene["envi"], tmp_path / "map.npy", "--probabilities") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "map_probabilities.npy' exists; pass --overwrite" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map_probabilities.npy"]
    assert (tmp_path / "map_probabilities.npy").read_bytes() == b"keep"
    assert predict(scene, scene["envi"], tmp_path / "map.npy") == 0  # without the flag the file is not touched
    assert (tmp_path / "map_probabilities.npy").read_bytes() == b"keep"
    assert predict(scene, scene["envi"], tmp_path / "map.npy", "--probabilities", "--overwrite") == 0
    assert np.load(tmp_path / "map_probabilities.npy").shape == (20, 24, 3)
    (tmp_path / "d_probabilities.npy").mkdir()
    assert predict(scene, scene["envi"], tmp_path / "d.npy", "--probabilities", "--overwrite") == 2
    assert capsys.readouterr().err.strip().endswith("d_probabilities.npy' is a directory")

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.mat", "a_probabilities.mat"):
        (inputs / name).write_bytes(scene["cube"].read_bytes())
    assert predict(scene, inputs, tmp_path / "out/", "--format", "npy", "--probabilities") == 2
    assert "would be written for two inputs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_files_the_command_reads_are_never_written(scene: dict[str, Path], tmp_path: Path, capsys) -> None:
    """An ENVI input's data file (whatever it is called), the --labels map and a --wavelengths file
    are inputs too: no output or probability file may replace them, --overwrite or not."""
    header, data = tmp_path / "m_probabilities.img.hdr", tmp_path / "m_probabilities.img"
    header.write_bytes(scene["envi"].read_bytes())
    data.write_bytes(scene["envi"].with_suffix(".img").read_bytes())
    before = data.read_bytes()
    assert predict(scene, header, tmp_path / "m.hdr", "--probabilities", "--overwrite") == 2
    assert "m_probabilities.img' is an input file" in capsys.readouterr().err
    assert data.read_bytes() == before and not (tmp_path / "m.hdr").exists()

    labels = tmp_path / "g_probabilities.npy"
    np.save(labels, np.load(scene["gt"]))
    kept = labels.read_bytes()
    assert predict(scene, scene["envi"], tmp_path / "g.npy", "--labels", str(labels), "--probabilities", "--overwrite") == 2
    assert "g_probabilities.npy' is an input file" in capsys.readouterr().err
    assert predict(scene, scene["envi"], labels, "--labels", str(labels), "--overwrite") == 2
    assert "is an input file" in capsys.readouterr().err
    assert labels.read_bytes() == kept and not (tmp_path / "g.npy").exists()

    (tmp_path / "dangling_probabilities.npy").symlink_to(tmp_path / "nowhere.npy")
    assert predict(scene, scene["envi"], tmp_path / "dangling.npy", "--probabilities") == 2
    assert "dangling_probabilities.npy' exists" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.npy").exists()


def test_upper_case_suffixes_write_what_they_say(scene: dict[str, Path], tmp_path: Path, capsys) -> None:
    """map.NPY holds the map (np.save appends '.npy' to other names); map.HDR is written as map.hdr +
    map.img, so an existing map.hdr is refused without --overwrite and the printed path is the real one."""
    assert predict(scene, scene["envi"], tmp_path / "map.NPY", "--probabilities") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.NPY", "map_probabilities.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "map.NPY"), np.load(tmp_path / "map_probabilities.npy").argmax(axis=2) + 1)
    capsys.readouterr()
    assert predict(scene, scene["envi"], tmp_path / "env.hdr") == 0
    assert predict(scene, scene["envi"], tmp_path / "env.HDR") == 2
    assert "env.hdr' exists" in capsys.readouterr().err
    assert predict(scene, scene["envi"], tmp_path / "env.HDR", "--overwrite") == 0
    assert f"wrote {tmp_path / 'env.hdr'}" in capsys.readouterr().out
    assert not (tmp_path / "env.HDR").exists()


def test_values_beyond_float32_are_one_line_and_write_nothing(scene: dict[str, Path], tmp_path: Path, capsys) -> None:
    """A no-data fill (-3.4e38, 1e300 in float64) becomes infinite once normalised: refused, naming the pixel."""
    cube = scipy.io.loadmat(scene["cube"])["cube"].astype(np.float64)  # (H, W, B)
    for value, dtype in ((np.finfo(np.float32).min, np.float32), (1e300, np.float64)):
        bad = cube.copy()
        bad[4, 7, 2] = value
        np.save(tmp_path / "bad.npy", bad.astype(dtype))
        assert predict(scene, tmp_path / "bad.npy", tmp_path / "out.npy", "--probabilities") == 2
        err = capsys.readouterr().err.strip().splitlines()
        # beyond float32 once normalised, or finite but so large that the model overflows (on the 3 x 3 window's pixels)
        assert len(err) == 1 and ("1 pixel(s) leave float32's range once normalised (first at (4, 7)" in err[0]
                                  or "bad.npy: the model gives non-finite scores for 9 pixel(s) of a batch (first at (3, 6), "
                                  "whose patch holds pixel (4, 7) of value" in err[0]), err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy"]


def test_a_failed_map_takes_its_probabilities_with_it(scene: dict[str, Path], tmp_path: Path, capsys, monkeypatch) -> None:
    import sciformer.data.hsi.predict as hsi_predict
    from sciformer.errors import DataError

    def fail(*args, **kwargs):
        raise DataError("map writer failed")

    monkeypatch.setattr(hsi_predict, "save_map_png", fail)
    assert predict(scene, scene["envi"], tmp_path / "m.png", "--probabilities") == 2
    assert "map writer failed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_odd_class_names_in_png_legend_and_envi_lists(tmp_path: Path) -> None:
    """'$' is a literal in the PNG legend (not mathtext), braces and commas cannot break ENVI lists."""
    cube, gt, _ = make_hsi_scene(h=12, w=12, bands=6, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    (tmp_path / "odd.yaml").write_text(
        "name: odd\ndata:\n  name: hsi_scene\n  source: cube.npy\n  label_path: gt.npy\n"
        "  class_names: ['$\\notacommand$', 'a}b{c', 'x,y']\n  patch_size: 3\n"
        "  split: {kind: stratified, train_per_class: 8, val_fraction: 0.2}\n"
        "model: {name: spectral_spatial, dim: 8, depth: 1, num_heads: 2, band_group_size: 3}\n"
        "train: {epochs: 1, batch_size: 16, progress: never, threads: 1}\n")
    assert main(["train", "-c", str(tmp_path / "odd.yaml"), "-o", str(tmp_path / "run")]) == 0
    run = ["predict", "--checkpoint", str(tmp_path / "run"), "-i", str(tmp_path / "cube.npy")]
    assert main([*run, "-o", str(tmp_path / "m.png"), "--probabilities"]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0 and (tmp_path / "m_probabilities.npy").is_file()
    assert main([*run, "-o", str(tmp_path / "m.hdr"), "--probabilities"]) == 0
    assert envi.read_envi_header(str(tmp_path / "m.hdr"))["class names"] == ["Unclassified", "$\\notacommand$", "a)b(c", "x-y"]
    assert envi.open(str(tmp_path / "m_probabilities.hdr")).metadata["band names"] == ["$\\notacommand$", "a)b(c", "x-y"]


def test_geotiff_paths_of_undecodable_bytes_in_and_out(scene: dict[str, Path], tmp_path: Path) -> None:
    """GDAL takes UTF-8 names only: a GeoTIFF cube read from, and a map written to, a path of bytes
    that are not UTF-8 give what the same files under plain names give (georeference included)."""
    import os

    from rasterio.transform import Affine

    cube = scipy.io.loadmat(scene["cube"])["cube"]  # (H, W, B)
    plain = tmp_path / "cube.tif"
    with rasterio.open(plain, "w", driver="GTiff", height=20, width=24, count=9, dtype="float32",
                       crs="EPSG:32633", transform=Affine(10.0, 0.0, 400000.0, 0.0, -10.0, 5000000.0)) as dst:
        dst.write(np.moveaxis(cube, -1, 0))
    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/cube\xff.tif"))
    odd.write_bytes(plain.read_bytes())
    out_odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/map\xfe.tif"))
    assert predict(scene, odd, out_odd) == 0
    assert predict(scene, plain, tmp_path / "map.tif") == 0
    with rasterio.open(tmp_path / "map.tif") as ref, open(out_odd, "rb") as handle, rasterio.open(handle) as got:
        np.testing.assert_array_equal(got.read(), ref.read())
        assert got.crs == ref.crs and got.transform == ref.transform
    assert sorted(os.listdir(os.fsencode(tmp_path))) == [b"cube.tif", b"cube\xff.tif", b"map.tif", b"map\xfe.tif"]  # no temporary left


def test_a_key_override_the_input_lacks_is_refused_the_trained_key_is_looked_for(scene: dict[str, Path], tmp_path: Path,
                                                                                  capsys) -> None:
    from sciformer.data.hsi.config import HSISceneConfig
    from sciformer.data.hsi.predict import _read_for_prediction

    for key in ("image_key", "wavelength_key"):  # given on the command line: refused, as training refuses it
        assert predict(scene, scene["cube"], tmp_path / "x.npy", f"data.{key}=no_such_key") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"scene.mat: {key} 'no_such_key' not found; available keys: cube" in err[0], err
    assert not (tmp_path / "x.npy").exists()
    cfg = HSISceneConfig(source="old.mat", image_key="radiance", wavelength_key="centres")  # the checkpoint's own keys
    scene_read, _ = _read_for_prediction(cfg, scene["cube"], {"image_key": "radiance", "wavelength_key": "centres"})
    assert scene_read.meta["image_key"] == "cube"  # another file: found automatically
