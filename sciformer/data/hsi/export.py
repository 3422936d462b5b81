"""Classification maps out: PNG with a legend, ENVI classification file, ``.npy`` (GeoTIFF:
:mod:`sciformer.data.hsi.geotiff`). Every file is written atomically.

Maps use the ground-truth convention: (H, W) integers, 0 = unclassified / unlabelled,
class k (1..K) = ``class_names[k - 1]``. Colours: index 0 is black, classes take
matplotlib's ``tab20`` palette (``hsv`` beyond 20 classes). Class probabilities
(``predict --probabilities``) go to a second file beside the map: :func:`probability_paths`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sciformer.data.palette import class_colors
from sciformer.errors import DataError
from sciformer.utils.atomic import atomic_write_with
from sciformer.utils.text import drawable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

UNCLASSIFIED = "Unclassified"


def _check_map(label_map: np.ndarray, class_names: list[str], name: str = "map") -> np.ndarray:
    m = np.asarray(label_map)
    if m.ndim != 2 or m.dtype.kind not in "uib":
        raise DataError(f"{name}: expected a 2-D integer label map, got shape {m.shape} dtype {m.dtype}")
    if m.size and (m.min() < 0 or m.max() > len(class_names)):
        raise DataError(
            f"{name}: values must lie in 0..{len(class_names)} (0 = unclassified), found {m.min()}..{m.max()}"
        )
    return m.astype(np.int64)


def save_map_npy(path: str | os.PathLike[str], label_map: np.ndarray) -> Path:
    """Write the map as ``.npy`` (int64, 0 = unclassified), atomically."""
    path = Path(path)
    m = np.asarray(label_map, dtype=np.int64)
    atomic_write_with(path, lambda tmp: np.save(tmp, m))
    return path


def render_map_figure(
    label_map: np.ndarray,
    class_names: list[str],
    gt: np.ndarray | None = None,
    title: str = "Prediction",
) -> Figure:
    """A matplotlib Figure: the map (and ``gt`` beside it) with a class legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    m = _check_map(label_map, class_names)
    class_names = [drawable(n) for n in class_names]  # drawn as written: '$' literal, undecodable bytes escaped
    panels = [(drawable(title), m)]
    if gt is not None:
        g = _check_map(gt, class_names, "gt")
        if g.shape != m.shape:
            raise DataError(f"gt: shape {g.shape} does not match the map's {m.shape}")
        panels.append(("Ground truth", g))
    k = len(class_names)
    colors = class_colors(k) / 255.0
    cmap = ListedColormap(colors)
    h, w = m.shape
    panel_w = 4.0 * min(2.0, max(0.5, w / max(h, 1)))
    fig = Figure(figsize=(panel_w * len(panels) + 3.2, 4.4), dpi=120)
    FigureCanvasAgg(fig)  # Agg canvas: no display, no global backend change
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, data) in zip(axes, panels):
        ax.imshow(data, cmap=cmap, vmin=0, vmax=k, interpolation="nearest")
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [
        Patch(facecolor=colors[i + 1], edgecolor="black", linewidth=0.3, label=f"{i + 1} {n}")
        for i, n in enumerate(class_names)
    ]
    fig.subplots_adjust(left=0.02, right=1.0 - 3.0 / fig.get_figwidth(), top=0.9, bottom=0.03, wspace=0.05)
    fig.legend(
        handles=handles, loc="center left", bbox_to_anchor=(1.0 - 2.9 / fig.get_figwidth(), 0.5),
        fontsize=7, frameon=False, title="Classes",
    )
    return fig


def save_map_png(
    path: str | os.PathLike[str],
    label_map: np.ndarray,
    class_names: list[str],
    gt: np.ndarray | None = None,
    title: str = "Prediction",
) -> Path:
    """Write the map (beside ``gt`` when given) with a legend of class names and colours."""
    path = Path(path)
    fig = render_map_figure(label_map, class_names, gt, title)
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.1))  # keeps long legend names
    return path


def envi_names(names: list[str]) -> list[str]:
    """Class names as ENVI header list items: braces delimit the list, commas separate items,
    so ``{`` / ``}`` become ``(`` / ``)`` and ``,`` becomes ``-`` (as spectral writes it)."""
    return [str(n).replace("{", "(").replace("}", ")").replace(",", "-") for n in names]


def save_map_envi(
    hdr_path: str | os.PathLike[str],
    label_map: np.ndarray,
    class_names: list[str],
    description: str = "sciformer classification map",
    georef: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write an ENVI classification file (``.hdr`` + ``.img``) with class names and colours.

    Class 0 is ``Unclassified``; the header's ``class names`` / ``class lookup`` hold all
    ``K + 1`` entries. ``georef`` (see :mod:`sciformer.data.hsi.georef`) adds the input's
    ``map info`` and ``coordinate system string``. Both files are written to temporary
    names and renamed (data first). Returns (header path, data path).
    """
    from spectral.io import envi

    from sciformer.data.hsi.georef import envi_metadata

    hdr_path = Path(hdr_path)
    if hdr_path.suffix.lower() != ".hdr":
        hdr_path = hdr_path.with_suffix(".hdr")
    hdr_path.parent.mkdir(parents=True, exist_ok=True)
    m = _check_map(label_map, class_names)
    dtype = np.uint8 if len(class_names) < 256 else np.uint16
    colors = class_colors(len(class_names))
    return _write_envi_pair(hdr_path, lambda tmp_hdr: envi.save_classification(
        str(tmp_hdr), m.astype(dtype), dtype=dtype, force=True, ext=".img",
        class_names=envi_names([UNCLASSIFIED, *class_names]),
        class_colors=[[int(v) for v in c] for c in colors],
        metadata={"description": description, **envi_metadata(georef)},
    ))


def _write_envi_pair(hdr_path: Path, write: Any) -> tuple[Path, Path]:
    """``write(tmp_header)`` makes a header + ``.img`` pair in a temporary sibling folder; the
    data file, then the header, are renamed to ``hdr_path`` / its ``.img``. Returns both."""
    img_path = hdr_path.with_suffix(".img")
    with tempfile.TemporaryDirectory(prefix=f".{hdr_path.stem}.", dir=hdr_path.parent) as tmp:
        tmp_hdr = Path(tmp) / hdr_path.name
        write(tmp_hdr)
        os.replace(tmp_hdr.with_suffix(".img"), img_path)
        os.replace(tmp_hdr, hdr_path)
    return hdr_path, img_path


# ----------------------------------------------------------------------------- probabilities
# ``sciformer predict --probabilities`` writes the class probabilities beside the map, one band
# per class in the map's class order, float32 in [0, 1] summing to 1 over the bands of a pixel.
PROBABILITY_SUFFIX = "_probabilities"


def probability_paths(map_path: str | os.PathLike[str]) -> list[Path]:
    """Files ``--probabilities`` writes beside the map ``map_path`` (which it never replaces).

    ``a.hdr`` / ``a.img`` -> ``a_probabilities.hdr`` + ``.img`` (ENVI, float32, BSQ);
    ``a.tif`` -> ``a_probabilities.tif`` (float32 GeoTIFF); ``a.npy`` / ``a.png`` ->
    ``a_probabilities.npy`` ((H, W, K) float32).
    """
    path = Path(map_path)
    suffix = path.suffix.lower()
    stem = path.with_name(path.stem + PROBABILITY_SUFFIX)
    if suffix in (".hdr", ".img"):
        return [stem.with_suffix(".hdr"), stem.with_suffix(".img")]
    if suffix in (".tif", ".tiff"):
        return [stem.with_suffix(path.suffix)]
    return [stem.with_suffix(".npy")]


def save_probabilities_npy(path: str | os.PathLike[str], probs: np.ndarray, class_names: list[str]) -> Path:
    """Write (H, W, K) float32 class probabilities as ``.npy``, atomically.

    Shapes:
        probs: (H, W, K), K = len(class_names)
    """
    from sciformer.data.hsi.geotiff import check_probabilities

    path = Path(path)
    p = check_probabilities(probs, class_names, path)
    atomic_write_with(path, lambda tmp: np.save(tmp, p))
    return path


def save_probabilities_envi(
    hdr_path: str | os.PathLike[str],
    probs: np.ndarray,
    class_names: list[str],
    georef: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write class probabilities as an ENVI float32 BSQ image, one band per class.

    The header's ``band names`` are the class names; ``georef`` adds the input's ``map
    info`` and ``coordinate system string``. Data first, then header, each renamed into place.

    Shapes:
        probs: (H, W, K), K = len(class_names)
    """
    from spectral.io import envi

    from sciformer.data.hsi.georef import envi_metadata
    from sciformer.data.hsi.geotiff import check_probabilities

    hdr_path = Path(hdr_path).with_suffix(".hdr")
    p = check_probabilities(probs, class_names, hdr_path)
    metadata = {"description": "sciformer class probabilities", "band names": envi_names(class_names), **envi_metadata(georef)}
    return _write_envi_pair(hdr_path, lambda tmp_hdr: envi.save_image(
        str(tmp_hdr), p, dtype=np.float32, interleave="bsq", ext=".img", force=True, metadata=metadata))
