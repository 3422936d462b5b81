"""Scoring a model on a split over every rank: the final test evaluation of ``train`` and ``evaluate``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer.config import Experiment
from sciformer.contracts import PredictOptions, TaskData
from sciformer.engine.batching import make_loader
from sciformer.engine.distributed import DistContext
from sciformer.engine.folder_lock import drop_folder_lock, missing_folders, open_folder_lock, remove_empty_folders
from sciformer.engine.inference import predict_fn
from sciformer.engine.loops import evaluate
from sciformer.engine.metrics import ConfusionMatrix, PartIoU, Scores, format_table, label_scorer, percent
from sciformer.engine.report import EVALUATION_FILES, check_evaluation_replaceable, write_evaluation_set
from sciformer.engine.runfolder import OWN_FOLDERS
from sciformer.engine.signals import outputs_complete, undone_on_abrupt_exit
from sciformer.errors import SciformerError
from sciformer.utils.progress import progress


def reduce_evaluation(confusion: ConfusionMatrix, loss_sum: float, count: float, dist: DistContext) -> tuple[Scores, float]:
    """Sum confusion matrices and losses over ranks; returns scores and mean loss (``count``: the loss weight)."""
    if dist.enabled:
        for tensor in confusion.sums():  # the confusion matrix and, for part segmentation, the shape IoUs
            dist.all_reduce_sum(tensor)
        totals = dist.all_reduce_sum(torch.tensor([loss_sum, float(count)], dtype=torch.float64))
        loss_sum, count = float(totals[0]), float(totals[1])
    return confusion.compute(), (loss_sum / count if count else float("nan"))



def evaluation_views(exp: Experiment, task: TaskData) -> PredictOptions:
    """The final evaluation's test-time views (``evaluation.tta_rotations``, ``tta_flip``,
    ``overlap``), checked against what ``task`` can use (a one-line ConfigError)."""
    e = exp.cfg.evaluation
    views = PredictOptions(overlap=e.overlap, rotations=e.tta_rotations, flip=e.tta_flip)
    task.check_test_views(views)
    return views


def every_point_line(full: dict[str, Any], views: dict[str, Any] | None) -> str:
    """One line with the every-point scores of whole scenes (``full_resolution``) and their views."""
    seen = "single pass" if not views else (f"{views['tta_rotations']} turns{' + mirrors' if views['tta_flip'] else ''}, "
                                             f"overlap {views['overlap']:g}")
    scores = (f"OA {percent(full['oa'], 0)}  mIoU {percent(full['miou'], 0)}" if full.get("oa") is not None
              else "no scored points (every label is ignored)")
    return (f"every point ({full['points']:,} points, {full['scenes']} scene{'s' if full['scenes'] != 1 else ''}, {seen}): "
            f"{scores}  (metrics.json: full_resolution)")


def evaluate_and_export(exp: Experiment, task: TaskData, model: nn.Module, device: torch.device, out_dir: Path, *,
                        extra: dict[str, Any] | None = None, log: Callable[[str], None] = print, dist: DistContext = DistContext(),
                        only_recorded: bool = False) -> dict[str, Any]:
    """Evaluate on ``evaluation.split`` (sharded over ranks), then rank 0 writes metrics and task predictions
    (:func:`~sciformer.engine.report.write_evaluation_set`; ``only_recorded``: an existing ``predictions/``
    is replaced only where it holds nothing but an earlier evaluation's recorded set)."""
    cfg = exp.cfg
    split = cfg.evaluation.split
    votes = cfg.evaluation.votes
    views = evaluation_views(exp, task)
    loader = make_loader(task, split, cfg.evaluation.batch_size, train=False, seed=cfg.train.seed, workers=cfg.train.num_workers, dist=dist, votes=votes)
    start = time.perf_counter()
    confusion, loss_sum, count = evaluate(model, progress(loader, total=len(loader), desc=f"eval {split}", mode=cfg.train.progress if dist.is_main else "never"),
                                          num_classes=task.info.num_classes, ignore_index=task.ignore_index, loss_fn=None, device=device, amp=cfg.train.amp,
                                          parts=PartIoU.of(task.info, task.ignore_index))
    scores, _ = reduce_evaluation(confusion, loss_sum, count, dist)
    payload: dict[str, Any] = {}
    if dist.is_main:
        facts = {"protocol": task.describe(), "votes": votes, "eval_time_s": round(time.perf_counter() - start, 3), "world_size": dist.world_size, **(extra or {})}
        if not views.single_pass:  # they shape the full-resolution scores
            facts["test_views"] = {"tta_rotations": views.rotations, "tta_flip": views.flip, "overlap": views.overlap}
        payload = write_evaluation_set(out_dir, split, scores, task.info.class_names, facts, lambda stage: task.export_predictions(
            predict_fn(model, device, cfg.train.amp), stage, cfg.evaluation.batch_size, cfg.export, split=split,
            score=label_scorer(task.info.class_names, task.ignore_index), views=views), only_recorded=only_recorded,
            label_ids=task.info.label_ids)
        outputs_complete()  # the whole set is written: a signal now cannot make it look failed
        log(format_table(scores, task.info.class_names, title=f"{split} results ({exp.cfg.name}{f', {votes} votes' if votes > 1 else ''})"))
        if "full_resolution" in payload:  # whole scenes: the table scores the evaluation items; this, every point
            log(every_point_line(payload["full_resolution"], payload.get("test_views")))
    dist.barrier()
    return payload


def evaluation_folder(files: list[Path], split: str) -> Path:
    """Default folder of ``sciformer evaluate``: in the first checkpoint's run folder (beside its
    ``checkpoints/``), or beside a checkpoint file that is not in a run's ``checkpoints/``.

    ``evaluation`` for ``best.pt`` on the test split; another checkpoint adds its stem
    (``evaluation-last``), another split its name (``evaluation-val``), an ensemble
    ``ensemble-N-<8 hex digits naming the set of members>``. Where two evaluations would still
    meet (a checkpoint named ``val.pt``), :func:`check_evaluation_dir` refuses the second.
    """
    if len(files) > 1:
        tag = hashlib.sha256("\n".join(sorted(str(f.resolve()) for f in files)).encode()).hexdigest()[:8]
        parts = ["evaluation", f"ensemble-{len(files)}-{tag}"]
    else:
        parts = ["evaluation"] + ([files[0].stem] if files[0].stem != "best" else [])
    parts += [split] if split != "test" else []
    folder = files[0].resolve().parent
    return (folder.parent if folder.name == "checkpoints" else folder) / "-".join(parts)


def check_evaluation_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse a run folder (its metrics.json is the run's own test result), a file, and, unless
    ``overwrite``, a folder that already holds an evaluation's files. A table
    (``per_class.csv``, ...) or a ``predictions/`` entry that no earlier evaluation wrote (a
    user's file, or the unrecorded predictions of an older sciformer) is refused, ``overwrite``
    or not, naming the first such entry (:func:`check_evaluation_replaceable`):
    ``--overwrite`` replaces an earlier evaluation's files, never others."""
    if out_dir.exists() and not out_dir.is_dir():
        raise SciformerError(f"--output-dir {out_dir} is a file; expected a folder")
    real = Path(os.path.realpath(out_dir))  # through links, as far as the path exists
    inside = any(p.name in OWN_FOLDERS and (p.parent / ".lock").exists() for p in (real, *real.parents))
    if (real / "checkpoints").is_dir() or (real / ".lock").exists() or inside:
        raise SciformerError(f"--output-dir {out_dir} is a run folder or one of its own folders (a run's metrics.json is its test result); "
                             "choose another folder, e.g. its evaluation/")
    if not out_dir.is_dir():
        return
    check_evaluation_replaceable(out_dir)  # files of someone else's: --overwrite would not help
    if overwrite:
        return
    found = [name for name in EVALUATION_FILES if (out_dir / name).exists()]
    if found:
        raise SciformerError(f"--output-dir {out_dir} already holds {', '.join(found)} (an earlier evaluation); "
                             "choose another --output-dir or pass --overwrite to replace them")


EVALUATION_LOCK = ".evaluate.lock"  # held in the folder while an evaluation writes it


@contextlib.contextmanager
def locked_evaluation_dir(out_dir: Path, overwrite: bool) -> Iterator[None]:
    """Hold ``out_dir`` for one evaluation: created and locked (a second evaluation into it
    meanwhile is refused with one line), then checked again (:func:`check_evaluation_dir`:
    another one may have finished there since the first check). On leaving, the lock file goes,
    and so do the folders this created where nothing was written into them (a failure)."""
    created = missing_folders(out_dir)
    handle = open_folder_lock(out_dir, EVALUATION_LOCK, flag="evaluation folder")

    def release() -> None:
        drop_folder_lock(out_dir, EVALUATION_LOCK, handle)
        remove_empty_folders(created)  # stops at the first with files (an evaluation's, someone else's)

    try:
        with undone_on_abrupt_exit(release):
            check_evaluation_dir(out_dir, overwrite)
            yield
    finally:
        release()


def evaluate_checkpoints(checkpoints: list[Path], overrides: list[str], output_dir: Path | None, *,
                         allow_band_mismatch: bool = False, overwrite: bool = False) -> Path:
    """``sciformer evaluate``: one checkpoint or an ensemble on ``evaluation.split``; returns the folder written.

    The folder (``output_dir`` or :func:`evaluation_folder`) is checked before any data is read
    and held while it is written (:func:`locked_evaluation_dir`).
    """
    from sciformer.data.predicting import table_as_given
    from sciformer.engine import builders
    from sciformer.engine.checkpoint import checkpoint_file
    from sciformer.engine.ensemble import load_models
    from sciformer.engine.inference import check_split_not_empty, predictor_state
    from sciformer.engine.weights import check_data_fits

    exp, state, model, device = load_models(checkpoints, overrides)
    files = [checkpoint_file(c, in_run="best.pt") for c in checkpoints]
    out_dir = output_dir if output_dir is not None else evaluation_folder(files, exp.cfg.evaluation.split)
    check_evaluation_dir(out_dir, overwrite)  # before any data is read
    with locked_evaluation_dir(out_dir, overwrite):
        task = builders.build_task(exp)
        check_split_not_empty(task, exp.cfg.evaluation.split)
        trained = predictor_state(state, exp)
        task.match_checkpoint(trained, allow_band_mismatch=allow_band_mismatch)
        key = "data.classes" if "classes" in trained else "data.class_names" if getattr(exp.data_params, "class_names", None) else "this data"
        check_data_fits(state, exp, task.info, files[0], key)  # classes (count, names, order), input channels where they size the model
        now = task.state()
        if isinstance(trained.get("classes"), dict) and isinstance(now.get("classes"), dict):  # a class -> codes table
            table_as_given(trained["classes"], now["classes"], trained.get("unmapped"), now.get("unmapped"))
        extra = {"checkpoint": str(files[0]), "checkpoint_epoch": state.get("epoch")} if len(files) == 1 else \
            {"checkpoints": [str(f.resolve()) for f in files], "checkpoint_epochs": model.epochs}
        evaluate_and_export(exp, task, model, device, out_dir, extra=extra, only_recorded=True)
    return out_dir
