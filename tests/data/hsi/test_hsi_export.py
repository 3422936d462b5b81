"""Map export: .npy, ENVI classification (read back with spectral), PNG with legend."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest

from sciformer.data.hsi.export import (
    class_colors,
    render_map_figure,
    save_map_envi,
    save_map_npy,
    save_map_png,
)
from sciformer.errors import DataError

NAMES = ["Water", "Trees", "Asphalt", "Meadows"]


@pytest.fixture
def label_map():
    rng = np.random.default_rng(0)
    return rng.integers(0, 5, size=(13, 17))  # 0 = unclassified


def test_colors():
    c = class_colors(4)
    assert c.shape == (5, 3) and c.dtype == np.uint8
    assert c[0].tolist() == [0, 0, 0]
    assert len({tuple(x) for x in c}) == 5  # distinct
    assert len({tuple(x) for x in class_colors(30)}) == 31


def test_npy_round_trip(tmp_path, label_map):
    p = save_map_npy(tmp_path / "sub" / "map.npy", label_map)
    np.testing.assert_array_equal(np.load(p), label_map)


def test_envi_classification_read_back(tmp_path, label_map):
    import spectral.io.envi as envi

    hdr, img = save_map_envi(tmp_path / "map.hdr", label_map, NAMES)
    assert hdr.is_file() and img.is_file() and img.suffix == ".img"
    f = envi.open(str(hdr))
    np.testing.assert_array_equal(np.asarray(f.load())[:, :, 0], label_map)
    assert f.metadata["file type"] == "ENVI Classification"
    assert [n.strip() for n in f.metadata["class names"]] == ["Unclassified", *NAMES]
    lookup = np.asarray([int(v) for v in f.metadata["class lookup"]]).reshape(-1, 3)
    np.testing.assert_array_equal(lookup, class_colors(4))
    save_map_envi(tmp_path / "map.hdr", label_map, NAMES)  # overwrites


def test_png_with_legend_and_ground_truth(tmp_path, label_map):
    fig = render_map_figure(label_map, NAMES, gt=np.roll(label_map, 1, axis=0))
    assert len(fig.axes) == 2
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == [f"{i + 1} {n}" for i, n in enumerate(NAMES)]
    p = save_map_png(tmp_path / "map.png", label_map, NAMES, gt=label_map)
    img = matplotlib.image.imread(p)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 200
    p1 = save_map_png(tmp_path / "alone.png", label_map, NAMES)
    assert matplotlib.image.imread(p1).shape[1] < img.shape[1]  # the gt panel makes it wider


def test_bad_maps(tmp_path, label_map):
    with pytest.raises(DataError, match=r"values must lie in 0..4"):
        save_map_envi(tmp_path / "m.hdr", label_map + 1, NAMES)
    with pytest.raises(DataError, match="2-D integer"):
        save_map_png(tmp_path / "m.png", label_map.astype(float), NAMES)
    with pytest.raises(DataError, match="gt: shape"):
        render_map_figure(label_map, NAMES, gt=label_map[:-1])
