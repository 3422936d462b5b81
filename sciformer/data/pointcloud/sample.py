"""Samples and packed batches: feature assembly and collation.

Sample (what a dataset item is)::

    {"coord": (n, 3) float32, "feat": (n, c) float32,
     "label": () int64 (classification) or (n,) int64 (segmentation, -1 = ignore),
     "category": () int64 (ShapeNetPart only)}

``feat`` is assembled after the transforms from the configured feature names
(:data:`FEATURE_CHANNELS`: ``coord`` (3), ``colour`` (3, in [0, 1]), ``normal`` (3),
``intensity`` (1), ``height`` (1, z above the sample's lowest point), ``geometric``
(35, per-point eigenvalue and height features of the whole tile,
:mod:`sciformer.data.pointcloud.geometric`)). With no
features ``c == 0`` and the model decides what to use (coordinates or ones).

Packed batch (no padding; what :func:`collate_points` returns)::

    {"coord": (N, 3) float32, "feat": (N, C) float32,
     "offset": (B,) int64 cumulative ends (sizes [3, 5] -> [3, 8]),
     "target": (B,) int64 (classification) or (N,) int64 (segmentation),
     "category": (B,) int64 where the samples have one}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sciformer.contracts import Batch
from sciformer.data.pointcloud import geometric
from sciformer.data.transforms import Sample
from sciformer.errors import DataError
from sciformer.utils.suggest import did_you_mean

FEATURE_CHANNELS = {"coord": 3, "colour": 3, "normal": 3, "intensity": 1, "height": 1, "geometric": geometric.channels()}
_FEATURE_ALIASES = {"color": "colour", "rgb": "colour", "normals": "normal", "xyz": "coord"}


def check_features(names: Sequence[str], allowed: Sequence[str] | None = None) -> list[str]:
    """Validate feature names (aliases color/rgb -> colour); raises ValueError for pydantic."""
    allowed = list(allowed or FEATURE_CHANNELS)
    out = []
    for name in names:
        canon = _FEATURE_ALIASES.get(name, name)
        if canon not in allowed:
            raise ValueError(f"unknown feature '{name}'{did_you_mean(name, allowed)}; valid features: {', '.join(allowed)}")
        if canon in out:
            raise ValueError(f"feature '{canon}' listed twice")
        out.append(canon)
    return out


def feature_channels(names: Sequence[str]) -> int:
    """Number of ``feat`` channels for a list of feature names."""
    return sum(FEATURE_CHANNELS[n] for n in names)


def assemble_features(sample: Sample, features: Sequence[str], where: str = "sample") -> Sample:
    """The final sample: coord float32, feat (n, c) float32 built from ``features``, label int64.

    Keeps ``category`` and ``label``; drops every other key.
    """
    coord = sample.get("coord")
    if not isinstance(coord, np.ndarray) or coord.ndim != 2 or coord.shape[1] != 3:
        raise DataError(f"{where}: 'coord' has shape {getattr(coord, 'shape', None)}, expected (n, 3)")
    n = coord.shape[0]
    if n == 0:
        raise DataError(f"{where}: empty point cloud (0 points)")
    parts = []
    for name in features:
        if name == "coord":
            value = coord
        elif name == "height":
            value = coord[:, 2:3] - coord[:, 2].min()
        else:
            value = sample.get(name)
            if value is None:
                raise DataError(f"{where}: feature '{name}' is not available (keys: {', '.join(sorted(sample))})")
        value = np.asarray(value, dtype=np.float32).reshape(n, -1)  # (n, c_i)
        if value.shape[1] != FEATURE_CHANNELS[name]:
            raise DataError(f"{where}: feature '{name}' has {value.shape[1]} channels, expected {FEATURE_CHANNELS[name]}")
        parts.append(value)
    feat = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), dtype=np.float32)  # (n, c)
    out: Sample = {"coord": coord.astype(np.float32), "feat": feat}
    if "label" in sample:
        label = np.asarray(sample["label"], dtype=np.int64)
        if label.ndim == 1 and label.shape[0] != n:
            raise DataError(f"{where}: 'label' has {label.shape[0]} entries for {n} points")
        out["label"] = label
    if "category" in sample:
        out["category"] = np.asarray(sample["category"], dtype=np.int64).reshape(())
    return out


def collate_points(items: Sequence[Sample]) -> Batch:
    """Pack samples into one batch without padding (see module docstring).

    Shapes: items of n_i points -> coord (N, 3), feat (N, C), offset (B,),
    target (B,) or (N,), category (B,); N = sum n_i.
    """
    if not items:
        raise DataError("collate: empty batch (no items)")
    coords, feats, sizes = [], [], []
    for i, item in enumerate(items):
        for key in ("coord", "feat"):
            if key not in item:
                raise DataError(f"collate: item {i} has no '{key}' (keys: {', '.join(sorted(item))})")
        coord = np.asarray(item["coord"], dtype=np.float32)  # (n_i, 3)
        feat = np.asarray(item["feat"], dtype=np.float32)  # (n_i, c)
        if coord.ndim != 2 or coord.shape[1] != 3 or coord.shape[0] == 0:
            raise DataError(f"collate: item {i} 'coord' has shape {coord.shape}, expected (n, 3) with n > 0")
        if feat.ndim != 2 or feat.shape[0] != coord.shape[0]:
            raise DataError(f"collate: item {i} 'feat' has shape {feat.shape}, expected ({coord.shape[0]}, c)")
        if feats and feat.shape[1] != feats[0].shape[1]:
            raise DataError(f"collate: item {i} has {feat.shape[1]} feature channels, item 0 has {feats[0].shape[1]}")
        coords.append(coord)
        feats.append(feat)
        sizes.append(coord.shape[0])
    batch: Batch = {
        "coord": torch.from_numpy(np.concatenate(coords)),  # (N, 3)
        "feat": torch.from_numpy(np.concatenate(feats)),  # (N, C)
        "offset": torch.from_numpy(np.cumsum(sizes).astype(np.int64)),  # (B,)
    }
    has_label = ["label" in it for it in items]
    if any(has_label):
        if not all(has_label):
            raise DataError(f"collate: item {has_label.index(False)} has no 'label' while others do")
        labels = [np.asarray(it["label"], dtype=np.int64) for it in items]
        if all(lab.ndim == 0 for lab in labels):
            batch["target"] = torch.from_numpy(np.stack(labels))  # (B,)
        else:
            for i, (lab, n) in enumerate(zip(labels, sizes, strict=True)):
                if lab.shape != (n,):
                    raise DataError(f"collate: item {i} 'label' has shape {lab.shape}, expected ({n},) or ()")
            batch["target"] = torch.from_numpy(np.concatenate(labels))  # (N,)
    if all("category" in it for it in items):
        batch["category"] = torch.as_tensor(np.array([int(it["category"]) for it in items]), dtype=torch.int64)  # (B,)
    return batch


def split_by_offset(values: np.ndarray, offset: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    """Split packed rows (N, ...) into per-sample arrays using cumulative ends (B,)."""
    return np.split(values, np.asarray(offset)[:-1])
