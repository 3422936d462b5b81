"""Hardening cases (:mod:`hardening`): config value ranges, output folders, resumes and tampered
checkpoints, non-finite training, special files as data. Also the case table shared with
:mod:`hardening_cases_files` (:data:`CASES`, :func:`case`) and its tiny-scene helpers."""

from __future__ import annotations

import fcntl
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import corpus
import torch
from corpus import Case, Trained, hsi_experiment, make_scene, train_argv, write_mat_v5

CASES: list[Case] = []
_HELD: list[object] = []  # open lock handles (kept alive for the case)


def case(id: str, *expect: str) -> Callable[[Callable[[Path, Trained], list[str]]], Callable[[Path, Trained], list[str]]]:
    def register(build: Callable[[Path, Trained], list[str]]) -> Callable[[Path, Trained], list[str]]:
        CASES.append(Case(id, build, tuple(expect)))
        return build

    return register


def _hsi(d: Path, extra: str = "", **data: object) -> Path:
    """A valid tiny hsi_scene experiment (scene.mat) plus ``extra`` YAML lines."""
    cube, gt = make_scene()
    write_mat_v5(d / "scene.mat", cube=cube, gt=gt)
    path = hsi_experiment(d, "scene.mat", image_key="cube", **data)
    if extra:
        path.write_text(path.read_text() + extra)
    return path


def _override(*overrides: str) -> Callable[[Path, Trained], list[str]]:
    return lambda d, t: train_argv(d, _hsi(d), *overrides)


# --- config value ranges ---------------------------------------------------------------------

for _id, _ovr, _expect in [
    ("cfg-adam-beta-one", "optimizer.betas=[0.9, 1.0]", ("optimizer.betas", "[0, 1)")),
    ("cfg-adam-beta-negative", "optimizer.betas=[-0.1, 0.999]", ("optimizer.betas", "[0, 1)")),
    ("cfg-nesterov-no-momentum", "optimizer={name: sgd, nesterov: true, momentum: 0}", ("nesterov", "momentum > 0")),
    ("cfg-momentum-above-one", "optimizer.momentum=1.5", ("optimizer.momentum",)),
    ("cfg-lr-inf", "optimizer.lr=.inf", ("optimizer.lr", "finite")),
    ("cfg-lr-nan", "optimizer.lr=.nan", ("optimizer.lr", "finite")),
    ("cfg-seed-negative", "train.seed=-1", ("train.seed",)),
    ("cfg-epochs-true", "train.epochs=true", ("train.epochs", "expected a number, got true")),  # was 1 epoch
    ("cfg-ema-false", "train.ema=false", ("train.ema", "expected a number or null, got false")),
    ("cfg-model-width-true", "model.dim=true", ("model.dim", "expected a number, got true")),  # model and data parameters too
    ("cfg-split-seed-true", "data.split.seed=true", ("data.split.seed", "expected a number or null, got true")),
    ("cfg-seed-huge", "train.seed=1e30", ("train.seed",)),
    ("cfg-batch-huge", "train.batch_size=1e30", ("train.batch_size",)),
    ("cfg-eval-batch-huge", "evaluation.batch_size=10000000000", ("evaluation.batch_size",)),
    ("cfg-epochs-huge", "train.epochs=1000000000000", ("train.epochs",)),
    ("cfg-device-meta", "train.device=meta", ("train.device", "meta")),
    ("cfg-device-garbage", "train.device=cuda:x", ("train.device",)),
    ("cfg-model-width-huge", "model.dim=1000000", ("model.dim", "largest model size")),
    ("cfg-model-depth-huge", "model.depth=100000", ("model.depth", "largest model size")),
    ("cfg-patch-size-huge", "data.patch_size=10001", ("data.patch_size", "up to")),
    ("cfg-workers-huge", "train.num_workers=100000", ("train.num_workers",)),
    ("cfg-weight-decay-inf", "optimizer.weight_decay=.inf", ("optimizer.weight_decay", "finite")),
    ("cfg-grad-clip-nan", "train.grad_clip=.nan", ("train.grad_clip", "finite")),
    ("cfg-name-slash", "name=../../escape", ("name", "file-name component")),
    ("cfg-name-dotdot", "name=..", ("name", "file-name component")),
    ("cfg-name-long", "name=" + "n" * 300, ("name", "file-name component")),
]:
    case(_id, *_expect)(_override(_ovr))


@case("cfg-seed-flag-negative", "train.seed")
def _(d: Path, t: Trained) -> list[str]:
    return [*train_argv(d, _hsi(d)), "--seed", "-1"]


@case("cfg-seed-flag-huge", "--seed", "invalid int value")
def _(d: Path, t: Trained) -> list[str]:
    return [*train_argv(d, _hsi(d)), "--seed", "1e30"]


@case("cfg-name-long-value-not-echoed", "name", "chars)")
def _(d: Path, t: Trained) -> list[str]:
    cfg = _hsi(d)
    cfg.write_text(cfg.read_text().replace("name: bad_hsi", "name: " + "x" * 500_000))
    return ["train", "--config", str(cfg)]  # default run folder from the name: refused before


@case("cfg-ten-megabytes", "exp.yaml", "a config is at most")
def _(d: Path, t: Trained) -> list[str]:
    cfg = _hsi(d)
    cfg.write_text(cfg.read_text().replace("name: bad_hsi", "name: " + "x" * 10_000_000))
    return ["train", "--config", str(cfg)]


@case("cfg-duplicate-section", "exp.yaml", "duplicate key 'train'")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, _hsi(d, extra="train: {epochs: 2}\n"))


@case("cfg-duplicate-nested-key", "exp.yaml", "duplicate key 'lr'")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, _hsi(d, extra="optimizer: {lr: 0.1, lr: 0.2}\n"))


@case("cfg-fifo", "exp.yaml", "not a regular file")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "exp.yaml")
    return train_argv(d, d / "exp.yaml")


@case("cfg-dev-zero", "/dev/zero", "not a regular file")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, Path("/dev/zero"))


# --- output folders -----------------------------------------------------------------------------


@case("out-dir-is-file", "run", "expected a folder")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run").write_text("a file\n")
    return train_argv(d, _hsi(d))


@case("out-dir-below-file", "a path component is a file")
def _(d: Path, t: Trained) -> list[str]:
    (d / "blocker").write_text("a file\n")
    return ["train", "--config", str(_hsi(d)), "--output-dir", str(d / "blocker" / "run")]


@case("out-dir-locked", "being written by another sciformer process")
def _(d: Path, t: Trained) -> list[str]:
    (d / "run").mkdir()
    handle = open(d / "run" / ".lock", "a+")
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write("4242\n")
    handle.flush()
    _HELD.append(handle)
    return train_argv(d, _hsi(d))


# --- resumes and tampered checkpoints -------------------------------------------------------------


def _copy_run(d: Path, t: Trained) -> Path:
    run = d / "resumed"
    shutil.copytree(t.hsi(), run)
    return run


for _id, _ovr, _expect in [
    ("resume-changed-width", "model.dim=16", ("--resume cannot change model.dim",)),
    ("resume-changed-optimizer", "optimizer.name=sgd", ("--resume cannot change optimizer.name",)),
    ("resume-changed-data", "data.patch_size=5", ("--resume cannot change data.patch_size",)),
    ("resume-changed-seed", "train.seed=5", ("--resume cannot change train.seed",)),  # redrew the split (data.split.seed null)
]:
    def _build(d: Path, t: Trained, ovr: str = _ovr) -> list[str]:
        return ["train", "--resume", str(_copy_run(d, t)), ovr]

    case(_id, *_expect)(_build)


def _tampered_resume(d: Path, t: Trained, edit: Callable[[dict], None]) -> list[str]:
    run = _copy_run(d, t)
    corpus.save_tampered(run / "checkpoints" / "last.pt", run / "checkpoints" / "last.pt", edit)
    return ["train", "--resume", str(run)]


for _id, _edit, _expect in [
    ("ckpt-epoch-float", lambda s: s.update(epoch=1.5), ("'epoch' is '1.5'", "non-negative integer")),
    ("ckpt-epoch-negative", lambda s: s.update(epoch=-3), ("'epoch'",)),
    ("ckpt-step-huge", lambda s: s.update(step_in_epoch=10**12), ("step_in_epoch",)),
    ("ckpt-partial-garbage", lambda s: s.update(partial=["x", None]), ("'partial'",)),
    ("ckpt-best-garbage", lambda s: s.update(best=[1, 2]), ("'best' is malformed",)),
    ("ckpt-optimizer-garbage", lambda s: s.update(optimizer={"state": 3, "param_groups": "x"}), ("optimizer state does not match",)),
    ("ckpt-model-other-shapes", lambda s: s["model"].update({k: torch.zeros(3) for k in list(s["model"])[:1]}), ("its weights do not fit the model",)),
    ("ckpt-classes-huge", lambda s: s["data_info"].update(num_classes=10**12), ("data_info.num_classes",)),
    ("ckpt-channels-negative", lambda s: s["data_info"].update(in_channels=-5), ("data_info.in_channels",)),
    ("ckpt-class-names-short", lambda s: s["data_info"].update(class_names=["a"]), ("class_names",)),
    # another run's last.pt copied into this folder (its split and seed would replace the folder's)
    ("ckpt-of-another-run", lambda s: s.update(run_id="0" * 32), ("was written by another run", "--init-from")),
]:
    def _build(d: Path, t: Trained, edit: Callable[[dict], None] = _edit) -> list[str]:
        return _tampered_resume(d, t, edit)

    case(_id, *_expect)(_build)


for _id, _edit, _expect in [("evaluate-ckpt-epoch-text", lambda s: s.update(epoch="x"), "'epoch' is 'x'"),
                            ("evaluate-ckpt-step-negative", lambda s: s.update(global_step=-5), "'global_step' is '-5'")]:
    def _build(d: Path, t: Trained, edit: Callable[[dict], None] = _edit) -> list[str]:  # were written into metrics.json
        ckpt = corpus.save_tampered(t.checkpoint(), d / "x.pt", edit)
        return ["evaluate", "--checkpoint", str(ckpt), "--output-dir", str(d / "eval")]

    case(_id, _expect, "non-negative integer")(_build)


@case("ckpt-classes-huge-evaluate", "data_info.num_classes")
def _(d: Path, t: Trained) -> list[str]:
    ckpt = corpus.save_tampered(t.checkpoint(), d / "x.pt", lambda s: s["data_info"].update(num_classes=2**40))
    return ["evaluate", "--checkpoint", str(ckpt), "--output-dir", str(d / "eval")]


@case("ckpt-deflated-members", "compressed members")
def _(d: Path, t: Trained) -> list[str]:
    src, dst = t.checkpoint(), d / "bomb.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        zout.writestr(info.filename.rsplit("/", 1)[0] + "/data/999", b"\x00" * (64 * 2**20))  # 64 MiB of zeros in a few KB
    return ["evaluate", "--checkpoint", str(dst), "--output-dir", str(d / "eval")]


@case("ckpt-fifo", "is a FIFO")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "x.pt")
    return ["evaluate", "--checkpoint", str(d / "x.pt"), "--output-dir", str(d / "eval")]


@case("ckpt-dev-zero", "/dev/zero", "a device")
def _(d: Path, t: Trained) -> list[str]:
    return ["evaluate", "--checkpoint", "/dev/zero", "--output-dir", str(d / "eval")]


# --- non-finite training ---------------------------------------------------------------------------


@case("train-diverges", "became nan", "lower optimizer.lr")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, _hsi(d), "optimizer={name: sgd, lr: 100, momentum: 0.9}", "train.max_steps_per_epoch=null", "train.epochs=3")


# --- special files as data ----------------------------------------------------------------------


@case("data-fifo", "scene.mat", "FIFO")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "scene.mat")
    return train_argv(d, hsi_experiment(d, "scene.mat", image_key="cube"))


@case("data-dev-zero", "/dev/zero", "a device")
def _(d: Path, t: Trained) -> list[str]:
    return train_argv(d, hsi_experiment(d, "/dev/zero"))


@case("predict-input-fifo", "shape.ply", "not a regular file or folder")
def _(d: Path, t: Trained) -> list[str]:
    os.mkfifo(d / "shape.ply")
    return ["predict", "--checkpoint", str(t.points()), "--input", str(d / "shape.ply"), "--output", str(d / "pred.json")]
