"""A random forest on per-point geometric features beside sciformer, on an experiment's own data.

What LiDAR users run instead of a deep model (Weinmann et al. 2015; CloudCompare CANUPO):
per point, covariance eigenvalue features of its k nearest neighbours at several scales
(linearity, planarity, scattering, omnivariance, anisotropy, eigenentropy, change of
curvature, verticality), height above the local minimum (2-D cells), the neighbourhood's
height range and spread (:mod:`sciformer.data.pointcloud.geometric`, the library's one
home for them: the ``geometric`` input feature of ``las_tiles`` is the same rows), plus
intensity and colour when the scene has them. The forest
trains on the experiment's training (and validation) scenes with the experiment's label
mapping, and is scored on every point of its test scenes with the library's one mIoU rule
(:func:`sciformer.engine.metrics.scores_from_confusion`; ignored labels left out).

    python benchmarks/bench_point_baselines.py -c experiments/lidar_tiles.yaml --seeds 0 1 2
    python benchmarks/bench_point_baselines.py -c experiments/lidar_tiles.yaml --runs runs/A runs/B runs/C

``--runs`` prints those sciformer runs' test metrics (their ``metrics.json``) beside the
forest as mean +- std. Needs scikit-learn (``pip install -e ".[baselines]"``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from sciformer import config
from sciformer.data.pointcloud.geometric import geometric_features
from sciformer.engine import builders
from sciformer.engine.metrics import scores_from_confusion


def point_features(sample: dict[str, Any]) -> np.ndarray:
    """Every feature of one scene, (n, F): the library's geometric features
    (:func:`sciformer.data.pointcloud.geometric.geometric_features`, the same rows the
    ``geometric`` input feature of ``las_tiles`` gives a network) plus intensity / colour where present."""
    coord = np.asarray(sample["coord"], dtype=np.float64)  # (n, 3)
    parts = [geometric_features(coord)]
    for key in ("intensity", "colour"):
        if key in sample and sample[key] is not None:
            parts.append(np.asarray(sample[key], dtype=np.float32).reshape(len(coord), -1))
    return np.concatenate(parts, axis=1).astype(np.float32)


def whole_scenes(task: Any, split: str) -> list[dict[str, Any]]:
    """Every whole scene of ``split`` at full resolution, with the experiment's labels."""
    if split != "train":
        return [task.scene(split, i) for i in range(len(task.scene_names(split)))]
    dataset = task.dataset("train")
    source = getattr(dataset, "source", None) or getattr(dataset, "scenes", None)
    if source is None or not hasattr(source, "load"):
        raise SystemExit(f"{type(dataset).__name__}: cannot list whole training scenes for the baseline")
    return [source.load(i) for i in range(len(source))]


def scene_table(scenes: list[dict[str, Any]], keys: set[str]) -> tuple[np.ndarray, np.ndarray]:
    feats, labels = [], []
    for s in scenes:
        feats.append(point_features({k: v for k, v in s.items() if k in keys}))
        labels.append(np.asarray(s["label"], dtype=np.int64))
    return np.concatenate(feats), np.concatenate(labels)


def miou_table(pred: np.ndarray, target: np.ndarray, num_classes: int) -> dict[str, Any]:
    keep = target >= 0
    cm = np.bincount(target[keep] * num_classes + pred[keep], minlength=num_classes**2).reshape(num_classes, num_classes)
    s = scores_from_confusion(cm)
    return {"miou": 100 * s.miou, "oa": 100 * s.oa, "iou": [100 * float(v) for v in s.per_class_iou]}


def run_forest(task: Any, seed: int, max_train: int) -> dict[str, Any]:
    from sklearn.ensemble import RandomForestClassifier

    t0 = time.perf_counter()
    fit_scenes, test_scenes = whole_scenes(task, "train") + whole_scenes(task, "val"), whole_scenes(task, "test")
    keys = set.intersection(*[set(s) for s in fit_scenes + test_scenes])  # intensity / colour only where every scene has it
    x, y = scene_table(fit_scenes, keys)
    keep = np.flatnonzero(y >= 0)
    rng = np.random.default_rng(seed)
    if len(keep) > max_train:
        keep = np.sort(rng.choice(keep, max_train, replace=False))
    forest = RandomForestClassifier(n_estimators=200, min_samples_leaf=2, class_weight="balanced", n_jobs=1, random_state=seed)
    forest.fit(x[keep], y[keep])
    xt, yt = scene_table(test_scenes, keys)
    n = task.info.num_classes
    pred = np.zeros(len(xt), dtype=np.int64)
    pred[:] = forest.classes_[forest.predict_proba(xt).argmax(axis=1)]
    out = miou_table(pred, yt, n)
    out["seconds"] = time.perf_counter() - t0
    out["points"] = int(len(xt))
    return out


def run_scores(path: Path, class_names: list[str]) -> dict[str, Any]:
    m = json.loads((path / "metrics.json").read_text())
    m = m.get("full_resolution") or m  # every original point (a grid-sampled run's top level holds the kept points)
    per = m.get("per_class", {})  # {class name: {"accuracy", "iou", "support"}}
    iou = [100 * float(per[c]["iou"]) if per.get(c, {}).get("iou") is not None else float("nan") for c in class_names]
    return {"miou": 100 * float(m["miou"]), "oa": 100 * float(m["oa"]), "iou": iou}


def summary(name: str, rows: list[dict[str, Any]], class_names: list[str]) -> str:
    def ms(values: list[float]) -> str:
        v = np.array(values, dtype=np.float64)
        v = v[np.isfinite(v)]  # a class without points or predictions in a run has no IoU there
        return f"{v.mean():5.1f} +- {v.std():4.1f}" if len(v) else "-"

    cells = [ms([r["miou"] for r in rows]), ms([r["oa"] for r in rows])]
    cells += [ms([r["iou"][c] for r in rows]) for c in range(len(class_names))]
    return f"{name:<14} " + " ".join(f"{c:>14}" for c in cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True, help="a point-scene segmentation experiment YAML")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-train-points", type=int, default=300_000)
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="finished sciformer runs of the same experiment")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for sciformer train")
    args = parser.parse_args()
    exp = config.load(args.config, list(args.overrides))
    task = builders.build_task(exp)
    names = list(task.info.class_names)
    forest = []
    for seed in args.seeds:
        r = run_forest(task, seed, args.max_train_points)
        print(f"seed {seed}: random forest mIoU {r['miou']:.1f} on {r['points']} test points ({r['seconds']:.0f} s)", flush=True)
        forest.append(r)
    print(f"\n{args.config}: test scenes {', '.join(task.scene_names('test'))}, every point; mean +- std")
    print(f"{'method':<14} " + " ".join(f"{h:>14}" for h in ["mIoU", "OA", *names]))
    print(summary(f"forest x{len(forest)}", forest, names))
    if args.runs:
        print(summary(f"sciformer x{len(args.runs)}", [run_scores(p, names) for p in args.runs], names))


if __name__ == "__main__":
    main()
