"""Classical baselines beside sciformer, on exactly an experiment's split and normalisation.

For each seed the experiment's ``hsi_scene`` task is built once (split masks and the
normaliser fitted on training pixels, as ``sciformer train`` builds them), then:

- ``svm``: RBF SVM on the centre pixel's normalised spectrum, C and gamma chosen by
  5-fold stratified cross-validation on the training + validation pixels only;
- ``rf``: random forest (500 trees) on the same spectra;
- ``cnn1d``: a small 1-D CNN on the same spectra, epoch chosen on the validation pixels;
- ``sciformer``: the experiment itself (``--train``), or the ``metrics.json`` of runs
  given with ``--runs`` (one per seed, in seed order; an ensemble's evaluation folder
  works too). ``--train --ensemble K`` trains K runs per seed S (``train.seed`` S,
  S + 100, ... with ``data.split.seed=S``, so all share the baselines' split) and scores
  them together as ``sciformer evaluate --checkpoint A --checkpoint B ...`` does.

Test pixels are read once per method, after its model is fixed. Prints OA / AA / kappa
as mean +- std over seeds::

    python benchmarks/bench_hsi_baselines.py -c experiments/indian_pines_fixed.yaml --seeds 0 1 2 --train
    python benchmarks/bench_hsi_baselines.py -c experiments/indian_pines_demo.yaml --seeds 0 --runs runs/demo-...
    python benchmarks/bench_hsi_baselines.py -c experiments/indian_pines_blocks.yaml --seeds 0 1 2 --train --ensemble 3

Needs scikit-learn (``pip install -e ".[baselines]"``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sciformer import config
from sciformer.engine import builders
from sciformer.engine.metrics import scores_from_confusion

METHODS = ("svm", "rf", "cnn1d")


def pixel_sets(task: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Normalised centre-pixel spectra (n, C) and 0-based labels (n,) of each split."""
    r = task.cfg.patch_size // 2
    cube = task.padded.numpy()  # (C, H + 2r, W + 2r), normalised on training pixels
    out = {}
    for split, label_map in task.split.maps().items():
        rows, cols = np.nonzero(label_map)  # row-major, as the task's datasets
        out[split] = (cube[:, rows + r, cols + r].T.astype(np.float32), label_map[rows, cols] - 1)
    return out


def scores(pred: np.ndarray, target: np.ndarray, num_classes: int) -> dict[str, float]:
    cm = np.bincount(target * num_classes + pred, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
    s = scores_from_confusion(cm)
    return {"oa": 100 * s.oa, "aa": 100 * s.aa, "kappa": 100 * s.kappa}


def fit_svm(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import SVC

    folds = max(2, min(5, int(np.bincount(y).min())))
    grid = {"C": [1, 10, 100, 1000, 10000], "gamma": ["scale", 0.001, 0.01, 0.1]}
    search = GridSearchCV(SVC(kernel="rbf"), grid, cv=StratifiedKFold(folds, shuffle=True, random_state=seed), n_jobs=1)
    return search.fit(x, y).best_estimator_


def fit_rf(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=500, random_state=seed, n_jobs=1).fit(x, y)


class SpectralCNN(nn.Module):
    """A small 1-D CNN over one pixel's spectrum.

    Shapes:
        x: (n, C) -> logits (n, K)
    """

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, width, 7, padding=3), nn.BatchNorm1d(width), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(width, 2 * width, 5, padding=2), nn.BatchNorm1d(2 * width), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(2 * width, 2 * width, 3, padding=1), nn.BatchNorm1d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool1d(8), nn.Flatten(),  # keeps where along the spectrum a feature fired
            nn.Dropout(0.2), nn.Linear(2 * width * 8, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.unsqueeze(1))  # (n, 1, C) -> (n, K)


def fit_cnn(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], num_classes: int, seed: int,
            epochs: int = 150) -> nn.Module:
    torch.manual_seed(seed)
    model = SpectralCNN(num_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy(train[0]), torch.from_numpy(train[1]).long()
    xv, yv = torch.from_numpy(val[0]), torch.from_numpy(val[1]).long()
    gen = torch.Generator().manual_seed(seed)
    best = (-1.0, float("inf"), None)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            if len(idx) < 2:
                continue
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(xv)
            acc = float((logits.argmax(1) == yv).float().mean()) if len(yv) else 0.0
            loss = float(nn.functional.cross_entropy(logits, yv)) if len(yv) else 0.0
        if (acc, -loss) > (best[0], -best[1]):  # validation accuracy, validation loss breaks ties
            best = (acc, loss, {k: v.clone() for k, v in model.state_dict().items()})
    model.load_state_dict(best[2])
    return model.eval()


def run_baselines(sets: dict[str, tuple[np.ndarray, np.ndarray]], num_classes: int, seed: int, methods: list[str]) -> dict[str, dict[str, float]]:
    xtr = np.concatenate([sets["train"][0], sets["val"][0]])
    ytr = np.concatenate([sets["train"][1], sets["val"][1]])
    xte, yte = sets["test"]
    out: dict[str, dict[str, float]] = {}
    for method in methods:
        t0 = time.perf_counter()
        if method == "svm":
            pred = fit_svm(xtr, ytr, seed).predict(xte)
        elif method == "rf":
            pred = fit_rf(xtr, ytr, seed).predict(xte)
        else:
            model = fit_cnn(sets["train"], sets["val"], num_classes, seed)
            with torch.no_grad():
                pred = model(torch.from_numpy(xte)).argmax(1).numpy()
        out[method] = {**scores(np.asarray(pred), yte, num_classes), "seconds": time.perf_counter() - t0}
        print(f"  seed {seed} {method:<9} OA {out[method]['oa']:.2f}  ({out[method]['seconds']:.0f} s)", flush=True)
    return out


def sciformer_scores(path: Path) -> dict[str, float]:
    metrics = json.loads((path / "metrics.json").read_text())
    test = metrics.get("test", metrics)
    return {k: 100 * float(test[k]) for k in ("oa", "aa", "kappa")}


def train_sciformer(args: argparse.Namespace, exp: Any, seed: int) -> Path:
    """Train the experiment for ``seed`` (``--ensemble K``: K runs sharing the split); returns the folder with its test metrics.json."""
    from sciformer.cli import main as cli
    from sciformer.engine.trainer import Trainer

    root = Path("runs") / f"baselines-{exp.cfg.name}"
    if args.ensemble == 1:
        Trainer(exp, root / f"seed{seed}").fit()
        return root / f"seed{seed}"
    members = [root / f"seed{seed}-member{j}" for j in range(args.ensemble)]
    for j, run_dir in enumerate(members):
        member = config.load(args.config, list(args.overrides) + [f"train.seed={seed + 100 * j}", f"data.split.seed={seed}"])
        Trainer(member, run_dir).fit()
    out = root / f"seed{seed}-ensemble{args.ensemble}"
    if cli(["evaluate", *[a for m in members for a in ("--checkpoint", str(m))], "-o", str(out)]) != 0:
        raise SystemExit(f"evaluating the ensemble of seed {seed} failed")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True, help="an hsi_scene experiment YAML")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--train", action="store_true", help="also train the experiment per seed (runs/baselines-<name>/seedN)")
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="finished sciformer runs, one per seed")
    parser.add_argument("--ensemble", type=int, default=1, metavar="K", help="with --train: K runs per seed, scored as one ensemble")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for sciformer train")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    results["sciformer"] = []
    for i, seed in enumerate(args.seeds):
        exp = config.load(args.config, list(args.overrides) + [f"train.seed={seed}"])
        task = builders.build_task(exp)
        print(f"seed {seed}: {task!r}", flush=True)
        for method, s in run_baselines(pixel_sets(task), task.info.num_classes, seed, args.methods).items():
            results[method].append(s)
        if args.train:
            results["sciformer"].append(sciformer_scores(train_sciformer(args, exp, seed)))
        elif i < len(args.runs):
            results["sciformer"].append(sciformer_scores(args.runs[i]))
    print(f"\n{args.config} ({len(args.seeds)} seeds: {' '.join(map(str, args.seeds))}); test pixels, mean +- std")
    print(f"{'method':<10} {'OA':>14} {'AA':>14} {'kappa':>14}")
    for method, rows in results.items():
        if not rows:
            continue
        cells = []
        for key in ("oa", "aa", "kappa"):
            v = np.array([r[key] for r in rows])
            cells.append(f"{v.mean():6.2f} +- {v.std():4.2f}")
        print(f"{method:<10} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14}")


if __name__ == "__main__":
    main()
