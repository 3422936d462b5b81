"""PNG rendering of labelled point clouds."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from sciformer.data.pointcloud.render import label_figure, render_labels
from sciformer.errors import DataError

NAMES = ["ground", "vegetation", "building", "other"]


def scene(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    coord = rng.uniform([0, 0, 0], [50, 30, 10], size=(n, 3))  # (n, 3)
    label = np.digitize(coord[:, 2], [2.0, 6.0]).astype(np.int64)  # 0, 1, 2 by height
    return coord, label


def legend_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_render_writes_png_with_legend(tmp_path: Path) -> None:
    coord, label = scene()
    path = render_labels(tmp_path / "out" / "scene.png", coord, {"prediction": label, "truth": label}, NAMES, title="toy")
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = label_figure(coord, {"prediction": label, "truth": label}, NAMES)
    assert legend_labels(fig) == ["ground", "vegetation", "building"]  # classes present only
    assert [ax.get_title() for ax in fig.axes] == ["prediction", "truth"]


def test_render_views_ignored_points_and_subsampling(tmp_path: Path) -> None:
    coord, label = scene(5000)
    label[::10] = -1  # ignored points: grey, listed in the legend
    fig = label_figure(coord, label, NAMES, view="both", max_points=1000)
    assert len(fig.axes) == 2 and fig.axes[1].name == "3d"
    assert legend_labels(fig)[-1] == "ignored"
    drawn = fig.axes[0].collections[0].get_offsets()
    assert len(drawn) == 1000
    assert render_labels(tmp_path / "v.png", coord, label, NAMES, view="3d", max_points=500).stat().st_size > 1000


def test_render_rejects_bad_input() -> None:
    coord, label = scene(100)
    with pytest.raises(DataError, match="labels"):
        label_figure(coord, label[:50], NAMES)
    with pytest.raises(DataError, match="class names"):
        label_figure(coord, label + 5, NAMES)
    with pytest.raises(DataError, match="view"):
        label_figure(coord, label, NAMES, view="side")
    with pytest.raises(DataError, match="coord"):
        label_figure(coord[:, :2], label, NAMES)


def test_names_of_any_bytes_are_drawn(tmp_path: Path) -> None:
    """A scene named with bytes that are not UTF-8 and '$' signs (mathtext to matplotlib) renders."""
    coord, label = scene(300)
    title = os.fsdecode(b"te\xff_$_$")
    path = render_labels(tmp_path / "s.png", coord, {"pred$_$": label}, ["a$", "b^$", "c\udcfe", "d"], title=title)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = label_figure(coord, {"pred$_$": label}, ["a$", "b^$", "c\udcfe", "d"], title=title)
    assert fig._suptitle.get_text() == "te\\xff_\\$_\\$"
    assert legend_labels(fig) == ["a\\$", "b^\\$", "c\\xfe"]


def test_a_failed_render_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    def half(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG partial")
        raise OSError(28, "No space left on device")

    coord, label = scene(100)
    monkeypatch.setattr(Figure, "savefig", half)
    with pytest.raises(OSError):
        render_labels(tmp_path / "s.png", coord, label, NAMES)
    assert list(tmp_path.iterdir()) == []
