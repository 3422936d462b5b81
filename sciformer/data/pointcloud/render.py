"""PNG pictures of labelled point clouds: top view and/or 3D view, one colour per class.

Rendering uses matplotlib's Agg canvas directly (no display, no global backend change).
Class ``k`` takes colour ``k + 1`` of :func:`sciformer.data.palette.class_colors` (the
palette of the hyperspectral maps); ignored points (label < 0) are grey. Clouds larger
than ``max_points`` are drawn from a seeded random subset of points::

    render_labels("scene.png", coord, {"prediction": pred, "truth": label}, class_names)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sciformer.data.palette import class_colors
from sciformer.errors import DataError
from sciformer.utils.atomic import atomic_write_with
from sciformer.utils.text import drawable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["render_labels", "label_figure"]

VIEWS = ("top", "3d", "both")
_IGNORED = np.array([0.6, 0.6, 0.6])


def _panels(labels: np.ndarray | Mapping[str, np.ndarray], n: int, num_classes: int) -> list[tuple[str, np.ndarray]]:
    items = labels.items() if isinstance(labels, Mapping) else [("labels", labels)]
    out = []
    for name, lab in items:
        lab = np.asarray(lab).reshape(-1)
        if lab.shape[0] != n or lab.dtype.kind not in "iu":
            raise DataError(f"render: labels '{name}' must be {n} integers, got shape {lab.shape} dtype {lab.dtype}")
        if lab.size and lab.max() >= num_classes:
            raise DataError(f"render: labels '{name}' reach {lab.max()} but there are {num_classes} class names")
        out.append((drawable(name), lab.astype(np.int64)))
    if not out:
        raise DataError("render: no labels to draw")
    return out


def label_figure(
    coord: np.ndarray,
    labels: np.ndarray | Mapping[str, np.ndarray],
    class_names: Sequence[str],
    *,
    view: str = "top",
    max_points: int = 200_000,
    seed: int = 0,
    title: str | None = None,
    point_size: float | None = None,
) -> Figure:
    """A matplotlib Figure: one column per labelling (e.g. prediction, truth), one row per view.

    Args:
        coord: point coordinates.
        labels: class ids per point (-1 = ignored), or a mapping name -> class ids.
        class_names: names of the classes, in id order (the legend).
        view: ``"top"`` (x-y scatter, drawn low to high so roofs cover the ground),
            ``"3d"`` or ``"both"``.
        max_points: draw at most this many points (seeded random subset).
        seed: seed of the subset.
        title: figure title.
        point_size: marker area; default from the number of points drawn.

    Shapes:
        coord: (n, 3); labels: (n,) or {name: (n,)}
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    coord = np.asarray(coord, dtype=np.float64)
    if coord.ndim != 2 or coord.shape[1] != 3 or coord.shape[0] == 0:
        raise DataError(f"render: coord must have shape (n, 3) with n > 0, got {coord.shape}")
    if view not in VIEWS:
        raise DataError(f"render: view must be one of {', '.join(VIEWS)}, got {view!r}")
    if max_points < 1:
        raise DataError(f"render: max_points must be >= 1, got {max_points}")
    names = [drawable(c) for c in class_names]  # drawn as written: '$' literal, undecodable bytes escaped
    panels = _panels(labels, coord.shape[0], len(names))
    keep = np.arange(coord.shape[0])
    if coord.shape[0] > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(coord.shape[0], max_points, replace=False))
    keep = keep[np.argsort(coord[keep, 2], kind="stable")]  # low to high: the top view shows the top
    pts = coord[keep] - coord[keep].mean(axis=0)  # (m, 3)
    palette = class_colors(len(names))[1:] / 255.0  # (K, 3)
    size = point_size if point_size is not None else float(np.clip(2e4 / len(keep), 0.1, 8.0))
    views = ["top", "3d"] if view == "both" else [view]
    fig = Figure(figsize=(4.6 * len(panels) + 2.6, 4.4 * len(views)), dpi=110)
    FigureCanvasAgg(fig)
    for r, v in enumerate(views):
        for c, (name, lab) in enumerate(panels):
            lab = lab[keep]
            colours = np.where((lab >= 0)[:, None], palette[np.clip(lab, 0, None)], _IGNORED)  # (m, 3)
            pos = r * len(panels) + c + 1
            if v == "top":
                ax = fig.add_subplot(len(views), len(panels), pos)
                ax.scatter(pts[:, 0], pts[:, 1], c=colours, s=size, marker="o", linewidths=0, rasterized=True)
                ax.set_aspect("equal", adjustable="datalim")
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                ax = fig.add_subplot(len(views), len(panels), pos, projection="3d")
                ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], c=colours, s=size, marker="o", linewidths=0, depthshade=False)
                ax.set_box_aspect(np.maximum(np.ptp(pts, axis=0), 1e-9 + 0.02 * np.ptp(pts, axis=0).max()))
                ax.view_init(elev=30, azim=-60)
                ax.set_axis_off()
            ax.set_title(f"{name} ({v})" if len(views) > 1 else name, fontsize=9)
    present = sorted({int(x) for _, lab in panels for x in np.unique(lab[keep]) if x >= 0})
    handles = [Patch(facecolor=palette[i], edgecolor="black", linewidth=0.3, label=names[i]) for i in present]
    if any((lab[keep] < 0).any() for _, lab in panels):
        handles.append(Patch(facecolor=_IGNORED, edgecolor="black", linewidth=0.3, label="ignored"))
    if title:
        fig.suptitle(drawable(title), fontsize=10)
    right = 1.0 - 2.4 / fig.get_figwidth()
    fig.subplots_adjust(left=0.02, right=right, top=0.9, bottom=0.03, wspace=0.05, hspace=0.12)
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(right + 0.01, 0.5), fontsize=7, frameon=False, title="Classes")
    return fig


def render_labels(
    path: str | os.PathLike[str],
    coord: np.ndarray,
    labels: np.ndarray | Mapping[str, np.ndarray],
    class_names: Sequence[str],
    **kwargs: object,
) -> Path:
    """Write :func:`label_figure` (same arguments) as a PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = label_figure(coord, labels, class_names, **kwargs)  # type: ignore[arg-type]
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.1))
    return path
