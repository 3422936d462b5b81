"""Build the task data, model, optimiser and learning-rate schedule of an experiment."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from sciformer.config import Experiment, OptimizerConfig, ScheduleConfig, TrainConfig
from sciformer.contracts import BuildContext, DataInfo, TaskData
from sciformer.errors import ConfigError
from sciformer.registry import DATASETS, MODELS


def build_task(exp: Experiment) -> TaskData:
    """Build the experiment's dataset (reads and preprocesses the data)."""
    entry = DATASETS.get(exp.cfg.data.name, key="data.name")
    ctx = BuildContext(base_dir=exp.base_dir, seed=exp.cfg.train.seed)
    return entry.builder(exp.data_params, ctx)


def build_model(exp: Experiment, info: DataInfo) -> nn.Module:
    """Build the experiment's model for data described by ``info``."""
    entry = MODELS.get(exp.cfg.model.name, key="model.name")
    return entry.builder(exp.model_params, info)


def data_info_to_dict(info: DataInfo) -> dict[str, Any]:
    """``info`` as plain data for a checkpoint (loads with ``weights_only=True``)."""
    return dataclasses.asdict(info)


def data_info_from_dict(raw: dict[str, Any]) -> DataInfo:
    """The :class:`DataInfo` of a checkpoint; older checkpoints kept the optional fields in an
    ``extras`` dict, whose known keys are read and the others (descriptive only) dropped."""
    known = {f.name for f in dataclasses.fields(DataInfo)} - {"num_classes", "class_names", "in_channels"}
    legacy = raw.get("extras") or {}
    optional = {k: v for k, v in {**legacy, **raw}.items() if k in known}
    return DataInfo(int(raw["num_classes"]), list(raw["class_names"]), int(raw["in_channels"]), **optional)


def build_loss(train: TrainConfig, task: TaskData) -> nn.CrossEntropyLoss:
    """The training loss: cross-entropy with the task's ignore index, ``train.label_smoothing``
    and ``train.class_weights`` (``inverse_sqrt``: w_c = 1 / sqrt(n_c / n) over the task's
    training counts, classes without a training label 0, scaled so that sum_c n_c w_c = n)."""
    spec, num_classes = train.class_weights, task.info.num_classes
    weight = None
    if isinstance(spec, list):
        if len(spec) != num_classes:
            raise ConfigError(f"train.class_weights: {len(spec)} weights for {num_classes} classes")
        weight = torch.tensor(spec, dtype=torch.float32)  # (K,)
        if not bool((weight > 0).any()):
            raise ConfigError("train.class_weights: every weight is 0; at least one class must count")
    elif spec == "inverse_sqrt":
        counts = task.class_counts()
        if counts is None:
            raise ConfigError("train.class_weights: inverse_sqrt needs training label counts, which this dataset "
                              "does not provide; give one weight per class instead")
        n = torch.tensor([float(c) for c in counts], dtype=torch.float64)  # (K,)
        if len(n) != num_classes or float(n.sum()) <= 0:
            raise ConfigError(f"train.class_weights: the training split has no labelled target in {num_classes} classes")
        w = torch.where(n > 0, (n.sum() / n.clamp_min(1.0)).sqrt(), torch.zeros_like(n))  # (K,)
        weight = (w * n.sum() / (w * n).sum()).to(torch.float32)  # (K,) average training label weighs 1
    return nn.CrossEntropyLoss(weight=weight, ignore_index=task.ignore_index, label_smoothing=train.label_smoothing)


def build_optimizer(cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD; no weight decay on biases and normalisation weights (1-D params)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
    if cfg.name == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    raise ConfigError(f"optimizer.name: unknown optimizer '{cfg.name}'")


def lr_factor(cfg: ScheduleConfig, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """Learning-rate multiplier at optimisation ``step`` (0-based): linear warm-up, then the schedule."""
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "step":
        return cfg.gamma ** (step // (cfg.step_epochs * steps_per_epoch))
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int, epochs: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step scheduler (call ``step()`` after every optimiser step)."""
    total = steps_per_epoch * epochs
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(cfg, step, steps_per_epoch, total))
