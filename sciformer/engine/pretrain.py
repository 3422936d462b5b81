"""``sciformer pretrain``: masked-band pre-training of a hyperspectral experiment's model.

The experiment's data (split, normalisation fitted on its training pixels, patches,
augmentation), model, optimizer, schedule, batch size, seed, threads, steps per epoch and
gradient clip are used as they are; ``epochs``, the hidden fractions and the band-group
size are the command's own. No label enters the objective, but the split is drawn from the
scene's label map: a scene without one is refused in one line saying so. The run folder gets::

    config.yaml                 the resolved experiment
    pretrain.json               settings, scene, seed, pixels used, the loss of every epoch
    metrics.csv                 epoch, train_loss (the masked-band loss), lr, epoch_time_s
    splits.npz, protocol.json   the split (its training pixels fit the normalisation)
    checkpoints/best.pt         the encoder's weights (no head: ``sciformer train
                                --init-from RUN`` starts a new one)

all written at the end (a failed write removes them): an interrupted or diverged
pre-training leaves nothing. ``sciformer train --init-from`` records the pre-training
settings in the new run's env.json and metrics.json and says when the protocol is
transductive (``--pixels all``) or the encoder saw another split's training pixels
(:func:`~sciformer.engine.pretrain_record.pretrain_note`).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer import config
from sciformer.config import Experiment
from sciformer.engine import builders
from sciformer.engine.batching import EpochBatchSampler
from sciformer.engine.checkpoint import save_checkpoint
from sciformer.engine.loops import TrainingDiverged, to_device
from sciformer.engine.noise import PerSampleRNG
from sciformer.engine.pretrain_record import train_pixels_digest
from sciformer.engine.reporting import metrics_csv_text
from sciformer.engine.runfolder import UNFINISHED_PRETRAIN_FILES, RunLock, default_run_dir, lock_run_dir
from sciformer.engine.runtime import apply_threads, environment, epoch_seed, pick_device, seed_everything
from sciformer.engine.signals import signals_held
from sciformer.errors import ConfigError, LabelsMissing, SciformerError
from sciformer.frontend import init_from_command, option
from sciformer.spectral.pretrain import MaskedBandModelling, hidden_groups, hidden_pixels
from sciformer.utils.atomic import atomic_write_text
from sciformer.utils.progress import progress

CSV_FIELDS = ["epoch", "train_loss", "lr", "epoch_time_s"]  # metrics.csv of a pre-training run


@dataclass
class PretrainSettings:
    """The command's own settings (everything else comes from the experiment)."""

    epochs: int = 20
    mask_ratio: float = 0.5
    band_group: int = 10
    pixel_ratio: float = 0.0  # share of each patch's pixels hiding their whole spectrum
    pixels: str = "all"  # all | train

    def check(self) -> None:
        for name in ("epochs", "band_group"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise ConfigError(f"pretrain {name}: expected an integer, got {getattr(self, name)!r}")
        for name in ("mask_ratio", "pixel_ratio"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), (int, float)):
                raise ConfigError(f"pretrain {name}: expected a number, got {getattr(self, name)!r}")
        if not 1 <= self.epochs <= 100_000:
            raise ConfigError(f"pretrain {option('--epochs')}: expected 1..100000, got {self.epochs}")
        if not 0.0 < self.mask_ratio < 1.0:
            raise ConfigError(f"pretrain {option('--mask-ratio')}: expected a fraction in (0, 1), got {self.mask_ratio}")
        if not 0.0 <= self.pixel_ratio < 1.0:
            raise ConfigError(f"pretrain {option('--pixel-ratio')}: expected a fraction in [0, 1), got {self.pixel_ratio}")
        if not 1 <= self.band_group <= 100_000:
            raise ConfigError(f"pretrain {option('--band-group')}: expected a positive band count, got {self.band_group}")
        if self.pixels not in ("all", "train"):
            raise ConfigError(f"pretrain {option('--pixels')}: expected 'all' or 'train', got {self.pixels!r}")

    def hidden_counts(self, channels: int, patch_size: int) -> tuple[int, int, int]:
        """(band groups, groups hidden, pixels hidden) per patch; a setting that hides every band
        or no pixel although asked to is a one-line ConfigError."""
        groups, hidden = hidden_groups(channels, self.band_group, self.mask_ratio)
        if groups < 2:
            raise ConfigError(f"pretrain {option('--band-group', self.band_group)}: the model's {channels} input channels make {groups} group, "
                              f"so every band would be hidden; use at most {max(channels // 2, 1)}")
        pixels = hidden_pixels(patch_size, self.pixel_ratio)
        if self.pixel_ratio and pixels == 0:
            raise ConfigError(f"pretrain {option('--pixel-ratio', self.pixel_ratio)} hides no pixel of a {patch_size} x {patch_size} patch")
        return groups, hidden, pixels


def pretrain_config(config_source: str | Path | dict[str, Any], overrides: Sequence[str], settings: PretrainSettings, *,
                    output_dir: str | Path | None = None, seed: int | None = None, base_dir: str | Path | None = None) -> Path:
    """``sciformer pretrain`` and ``sciformer.pretrain``: load the experiment (a YAML path, or a dict
    with paths relative to ``base_dir``), pre-train into ``output_dir`` (default
    ``runs/<name>-pretrain-<time>``); returns the run folder."""
    settings.check()  # before any data is read
    extra = [str(o) for o in overrides] + ([f"train.seed={seed}"] if seed is not None else [])
    if isinstance(config_source, dict):
        exp = config.from_dict(config_source, Path(base_dir) if base_dir is not None else Path.cwd(), extra, source="config dict")
    else:
        exp = config.load(config_source, extra)
    return pretrain(exp, Path(output_dir) if output_dir is not None else None, settings).parents[1]


def pretrain(exp: Experiment, run_dir: Path | None, settings: PretrainSettings, log: Any = print) -> Path:
    """Pre-train ``exp``'s model into ``run_dir`` (None: a new ``runs/<name>-pretrain-<time>``, ``-2``, ...
    where a run started in the same second has it); returns the checkpoint written."""
    settings.check()
    # refused before anything is written; a pre-training is not resumed and writes everything at its end
    lock: RunLock | None = None
    try:
        with signals_held():  # a signal meanwhile is raised once the lock can undo the folder
            lock = lock_run_dir(run_dir or default_run_dir(f"{exp.cfg.name}-pretrain"), fresh=True, leftovers=UNFINISHED_PRETRAIN_FILES,
                                resume_hint=False, numbered=run_dir is None)
        _pretrain(exp, lock.run_dir, settings, log)
        return lock.run_dir / "checkpoints" / "best.pt"
    finally:
        if lock is not None:
            lock.release()  # removes the folder again if nothing was written


def _pretrain(exp: Experiment, run_dir: Path, settings: PretrainSettings, log: Any) -> None:
    t = exp.cfg.train
    if t.init_from is not None:
        raise ConfigError("pretrain: train.init_from does not apply (pre-training starts from a fresh model); remove it")
    ignored = [k for k, on in (("train.amp", t.amp != "none"), ("train.ema", t.ema is not None)) if on]
    if ignored:
        log(f"note: pretrain runs in float32 on the raw weights; {', '.join(ignored)} do not apply")
    apply_threads(t.threads)
    device = pick_device(t.device)
    seed_everything(t.seed)
    try:
        task = builders.build_task(exp)
    except LabelsMissing as exc:  # no label enters the objective, but the split is drawn from the label map
        raise LabelsMissing(f"{exc}; pretrain needs the scene's label map too: the experiment's split is drawn from it "
                            "and the normalisation fitted on its training pixels (no label enters the objective)") from None
    if not hasattr(task, "pretrain_dataset"):
        raise ConfigError(f"pretrain: data '{exp.cfg.data.name}' has no unlabelled pixels to pre-train on; "
                          "masked-band pre-training is for hyperspectral scenes (hsi_scene)")
    model = builders.build_model(exp, task.info)
    objective = MaskedBandModelling(model, settings.mask_ratio, settings.band_group, settings.pixel_ratio).to(device)
    groups, hidden, pixels = settings.hidden_counts(task.info.in_channels, int(task.info.patch_size or 1))
    dataset = task.pretrain_dataset(settings.pixels)
    steps = len(EpochBatchSampler(len(dataset), t.batch_size, shuffle=True, max_batches=t.max_steps_per_epoch))
    if steps == 0:
        raise ConfigError(f"pretrain: {len(dataset)} pixels give no batch of train.batch_size {t.batch_size}")
    optimizer = builders.build_optimizer(exp.cfg.optimizer, objective)
    scheduler = builders.build_scheduler(exp.cfg.schedule, optimizer, steps, settings.epochs)
    log(f"pretrain {exp.cfg.model.name} on {len(dataset):,} pixels ({settings.pixels}; no label enters the objective): per patch "
        f"{hidden} of {groups} groups of {settings.band_group} bands hidden in every pixel"
        f"{f' and {pixels} pixels whole' if pixels else ''}; {settings.epochs} epochs of {steps} steps")
    history: list[dict[str, Any]] = []
    for epoch in range(settings.epochs):
        start = time.perf_counter()
        loss = _epoch(objective, task, dataset, optimizer, scheduler, settings, t, epoch, device)
        history.append({"epoch": epoch + 1, "train_loss": loss, "lr": optimizer.param_groups[0]["lr"],
                        "epoch_time_s": round(time.perf_counter() - start, 2)})
        log(f"pretrain epoch {epoch + 1}/{settings.epochs}  masked-band loss {loss:.4f}  {history[-1]['epoch_time_s']:.1f} s")
    record = {"objective": "masked_bands", **settings.__dict__, "source": str(exp.cfg.data.model_dump().get("source")),
              "seed": t.seed, "train_pixels_sha256": train_pixels_digest(task), "pixels_used": len(dataset), "history": history,
              "env": environment(device, t.seed)}
    record = json.loads(json.dumps(record, default=str))  # plain data only (torch.load reads checkpoints with weights_only)
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}  # the head is the fine-tuning's
    _write(run_dir, exp, task, record, {"config": exp.to_dict(), "config_dir": str(exp.base_dir), "data_info": builders.data_info_to_dict(task.info),
                                        "data_state": task.state(), "model": weights, "epoch": settings.epochs, "pretrain": record, "init_from": None})
    log(f"pretrained weights: {run_dir / 'checkpoints' / 'best.pt'} (start a run from them with: {init_from_command(run_dir)})")


def _write(run_dir: Path, exp: Experiment, task: Any, record: dict[str, Any], payload: dict[str, Any]) -> None:
    """The files, the checkpoint, then ``pretrain.json`` last (what marks the folder a finished
    pre-training: ``compare``); a failure removes what was written (nothing looks finished)."""
    written = [run_dir / n for n in ("config.yaml", "splits.npz", "protocol.json", "metrics.csv", "checkpoints/best.pt", "pretrain.json")]
    try:
        atomic_write_text(run_dir / "config.yaml", exp.to_yaml())
        task.save_artifacts(run_dir)  # splits.npz, protocol.json: the pixels the normaliser was fitted on
        atomic_write_text(run_dir / "metrics.csv", metrics_csv_text(record["history"], CSV_FIELDS))
        save_checkpoint(run_dir / "checkpoints" / "best.pt", payload)
        atomic_write_text(run_dir / "pretrain.json", json.dumps(record, indent=2) + "\n")
    except BaseException as exc:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        if isinstance(exc, OSError):
            raise SciformerError(f"pretrain: cannot write the results into {run_dir} ({exc.strerror or exc}); nothing was kept") from None
        raise


def _epoch(objective: MaskedBandModelling, task: Any, dataset: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
           settings: PretrainSettings, t: Any, epoch: int, device: torch.device) -> float:
    objective.train()
    seed = epoch_seed(t.seed, epoch)
    items = PerSampleRNG(dataset, t.seed, epoch)  # augmentation decided by (seed, epoch, pixel)
    masks = torch.Generator().manual_seed(seed + 1)
    batches = EpochBatchSampler(len(items), t.batch_size, shuffle=True, seed=t.seed, epoch=epoch, max_batches=t.max_steps_per_epoch)
    total, count = 0.0, 0
    for index in progress(batches, total=len(batches), desc=f"pretrain {epoch + 1}/{settings.epochs}", mode=t.progress):
        batch = to_device(task.collate([items[i] for i in index]), device)
        n, num_bands, p = batch["patch"].shape[:3]
        loss = objective(batch, objective.draw_hidden(n, num_bands, p, masks))
        value = float(loss.detach())
        if not math.isfinite(value):
            raise TrainingDiverged(f"pretrain: the masked-band loss became {value} in epoch {epoch + 1}; "
                                   "lower optimizer.lr or set train.grad_clip")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if t.grad_clip is not None:
            nn.utils.clip_grad_norm_(objective.parameters(), t.grad_clip)
        optimizer.step()
        scheduler.step()
        total += value * n
        count += n
    return total / max(count, 1)
