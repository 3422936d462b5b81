"""Fine-tuning across band sets: Indian Pines, source and target on disjoint halves of the scene.

The built-in Indian Pines scene (145 x 145 x 200, band centres from its loader) is cut by
columns into two parts that share no pixel:

- **source**: columns ``[0, split_col)``, all 200 bands;
- **target**: columns ``[split_col + gap, 145)``, every second band (100 bands, their
  centres given as ``data.wavelengths``).

Each part is written as its own ``.npy`` cube and label map (``--workdir``, default under
the system temp folder; never the repository or ``$SCIFORMER_DATA``). The source model is
trained on the source cube only, so it never sees a target pixel, label or spectrum. Both
keep the 16-class numbering of the scene (``data.class_names``) so the head transfers;
classes absent from a part simply have no pixels there.

Source run (seed 0, reused when its ``metrics.json`` exists): the recipe of
``experiments/indian_pines_demo.yaml`` (12 epochs) on a stratified split, ``--source-fraction``
of each class for training, bands placed by wavelength.

Target runs, for each fraction and seed: the recipe of ``experiments/indian_pines_fixed.yaml``
(100 epochs, label smoothing 0.1) on a stratified split of the target (that fraction of each
class trains, validation is 10 % of those training pixels, every other labelled target
pixel is test), (a) from scratch and (b) ``train.init_from`` the source run; nothing else
differs. Test OA / AA come from each run's ``metrics.json`` (the checkpoint chosen on
validation). Prints mean +- std over seeds::

    python benchmarks/bench_hsi_transfer.py --seeds 0 1 2 --fractions 0.05 --jobs 2

Runs go to ``WORKDIR/runs``; a run whose ``metrics.json`` exists is read, not retrained.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sciformer.data.hsi.builtin import INDIAN_PINES_CLASSES, load_indian_pines

REPO = Path(__file__).resolve().parents[1]


def write_parts(workdir: Path, split_col: int = 72, gap: int = 1, band_step: int = 2) -> dict[str, Any]:
    """Write the source and target cubes, label maps and band centres; return their facts.

    Files: ``source_cube.npy`` (H, split_col, B) and ``source_gt.npy``; ``target_cube.npy``
    (H, W - split_col - gap, B / band_step) and ``target_gt.npy``; the band centres of each in
    ``source_nm.npy`` / ``target_nm.npy``.
    """
    scene = load_indian_pines()
    if scene.wavelengths is None:
        raise SystemExit("the built-in Indian Pines scene has no band centres (tensorly missing?)")
    cube, gt, nm = scene.cube, scene.gt, np.asarray(scene.wavelengths, dtype=np.float64)  # (H, W, B), (H, W), (B,)
    start = split_col + gap
    parts = {
        "source": (cube[:, :split_col, :], gt[:, :split_col], nm),
        "target": (cube[:, start:, ::band_step], gt[:, start:], nm[::band_step]),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {"split_col": split_col, "gap": gap, "band_step": band_step}
    for name, (c, g, w) in parts.items():
        np.save(workdir / f"{name}_cube.npy", np.ascontiguousarray(c))
        np.save(workdir / f"{name}_gt.npy", np.ascontiguousarray(g.astype(np.int64)))
        np.save(workdir / f"{name}_nm.npy", w)
        counts = np.bincount(g.ravel(), minlength=len(INDIAN_PINES_CLASSES) + 1)[1:]
        facts[name] = {"shape": list(c.shape), "labelled": int(counts.sum()), "per_class": [int(x) for x in counts]}
    return facts


def _experiment(workdir: Path, part: str, recipe: str, train_per_class: float) -> dict[str, Any]:
    exp = yaml.safe_load((REPO / "experiments" / recipe).read_text())
    exp.pop("description", None)
    exp["name"] = f"ip_transfer_{part}"
    data = exp["data"]
    data["source"] = str(workdir / f"{part}_cube.npy")
    data["label_path"] = str(workdir / f"{part}_gt.npy")
    data["wavelengths"] = [float(w) for w in np.load(workdir / f"{part}_nm.npy")]
    data["class_names"] = list(INDIAN_PINES_CLASSES)
    data["split"] = {"kind": "stratified", "train_per_class": train_per_class, "val_fraction": 0.1}
    exp.setdefault("model", {})["position_source"] = "wavelength"
    exp.setdefault("train", {})["threads"] = 1
    return exp


def _train(config: Path, run_dir: Path, seed: int, init_from: Path | None = None) -> dict[str, Any]:
    """Train one run through the CLI unless its metrics.json exists; return its test scores."""
    metrics = run_dir / "metrics.json"
    if not metrics.is_file():
        cmd = [sys.executable, "-m", "sciformer", "train", "-c", str(config), "-o", str(run_dir), "--seed", str(seed),
               "train.threads=1"]
        if init_from is not None:
            cmd += ["--init-from", str(init_from)]
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        log = run_dir.parent / f"{run_dir.name}.log"
        t0 = time.time()
        with log.open("w") as fh:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=os.environ.copy()).returncode
        if rc != 0 or not metrics.is_file():
            raise SystemExit(f"{' '.join(cmd)} failed (exit {rc}); see {log}")
        print(f"  trained {run_dir.name} in {(time.time() - t0) / 60:.1f} min", flush=True)
    m = json.loads(metrics.read_text())
    support = {name: int(c["support"]) for name, c in m.get("per_class", {}).items()}
    return {"oa": 100 * m["oa"], "aa": 100 * m["aa"], "kappa": 100 * m["kappa"], "support": support}


def _init_line(runs: Path) -> str | None:
    for log in sorted(runs.glob("*init*.log")):
        for line in log.read_text().splitlines():
            if "init-from" in line:
                return line.strip()
    return None


def _fmt(vals: list[float]) -> str:
    a = np.asarray(vals, dtype=np.float64)
    return f"{a.mean():6.2f} +- {a.std(ddof=1) if a.size > 1 else 0.0:4.2f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "sciformer_hsi_transfer")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.05], help="labelled share of each target class")
    p.add_argument("--source-fraction", type=float, default=0.5)
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (each on one thread)")
    p.add_argument("--split-only", action="store_true", help="write the two parts and stop")
    args = p.parse_args(argv)

    wd = args.workdir.resolve()
    if wd == REPO or REPO in wd.parents:
        raise SystemExit(f"--workdir {wd} is inside the repository; give a folder outside it")
    facts = write_parts(wd)
    print(f"workdir {wd}")
    for part in ("source", "target"):
        f = facts[part]
        present = ", ".join(f"{i + 1}:{n}" for i, n in enumerate(f["per_class"]) if n)
        print(f"{part}: cube {tuple(f['shape'])}, {f['labelled']} labelled pixels; class:pixels {present}")
    if args.split_only:
        return

    src_cfg = wd / "source.yaml"
    src_cfg.write_text(yaml.safe_dump(_experiment(wd, "source", "indian_pines_demo.yaml", args.source_fraction)))
    runs = wd / "runs"
    source_run = runs / "source_s0"
    jobs: dict[tuple[str, float, int], Any] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        src = pool.submit(_train, src_cfg, source_run, 0)
        for frac in args.fractions:
            cfg = wd / f"target_{frac:g}.yaml"
            cfg.write_text(yaml.safe_dump(_experiment(wd, "target", "indian_pines_fixed.yaml", frac)))
            for seed in args.seeds:
                jobs[("scratch", frac, seed)] = pool.submit(_train, cfg, runs / f"target_{frac:g}_scratch_s{seed}", seed)
        src_scores = src.result()
        for frac in args.fractions:
            cfg = wd / f"target_{frac:g}.yaml"
            for seed in args.seeds:
                jobs[("init", frac, seed)] = pool.submit(
                    _train, cfg, runs / f"target_{frac:g}_init_s{seed}", seed, source_run / "checkpoints" / "best.pt")
        results = {k: v.result() for k, v in jobs.items()}

    print(f"\nsource (200 bands, left part, {args.source_fraction:g} of each class, seed 0): "
          f"test OA {src_scores['oa']:.2f} AA {src_scores['aa']:.2f}")
    line = _init_line(runs)
    if line:
        print(line)
    for frac in args.fractions:
        support = results[("scratch", frac, args.seeds[0])]["support"]
        print(f"target test pixels per class ({frac:g} split, seed {args.seeds[0]}): "
              f"{', '.join(f'{n} {c}' for n, c in support.items() if c)}")
    print("\n| target training share | start | OA | AA | seeds |\n|---|---|---|---|---|")
    for frac in args.fractions:
        for start in ("scratch", "init"):
            r = [results[(start, frac, s)] for s in args.seeds]
            label = "from scratch" if start == "scratch" else "--init-from source"
            print(f"| {100 * frac:g}% of each class | {label} | {_fmt([x['oa'] for x in r])} | "
                  f"{_fmt([x['aa'] for x in r])} | {' '.join(map(str, args.seeds))} |")
        for start in ("scratch", "init"):
            per_seed = ", ".join(f"s{s} {results[(start, frac, s)]['oa']:.2f}" for s in args.seeds)
            print(f"  {frac:g} {start}: OA per seed {per_seed}")


if __name__ == "__main__":
    main()
