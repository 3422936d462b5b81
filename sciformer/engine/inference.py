"""Models from checkpoints: the experiment a checkpoint holds, its model with weights, and
the ``batch -> logits`` function that evaluation, export and ``sciformer predict`` share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer import config
from sciformer.config import Experiment
from sciformer.contracts import PredictFn
from sciformer.engine import builders
from sciformer.engine.checkpoint import load_checkpoint
from sciformer.engine.loops import autocast, to_device
from sciformer.engine.runtime import pick_device
from sciformer.errors import CheckpointError

RESUME_KEYS = ("optimizer", "scheduler", "epoch", "global_step", "best")


def checkpoint_experiment(state: dict[str, Any], ckpt_path: Path, overrides: list[str]) -> Experiment:
    """The experiment stored in a checkpoint, validated; errors name the checkpoint."""
    if not isinstance(state.get("config_dir"), str):
        raise CheckpointError(f"checkpoint '{ckpt_path}' lacks 'config_dir' (the folder its config paths are relative to)")
    return config.from_dict(state["config"], Path(state["config_dir"]), overrides, source=f"checkpoint '{ckpt_path}' config")


def load_for_inference(ckpt_path: Path, overrides: list[str], device_name: str | None = None) -> tuple[Experiment, dict[str, Any], nn.Module, torch.device]:
    """Experiment, checkpoint state, model (eval mode, on its device) and device of a checkpoint or run folder.

    A run folder means its ``checkpoints/best.pt``; every mismatch is a one-line CheckpointError.
    """
    state = load_checkpoint(ckpt_path, in_run="best.pt")  # a run folder: the model its metrics.json reports
    exp = checkpoint_experiment(state, ckpt_path, overrides)
    device = pick_device(device_name or exp.cfg.train.device)
    try:
        info = builders.data_info_from_dict(state["data_info"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint '{ckpt_path}': data_info is incomplete or malformed ({type(exc).__name__}: {exc}); "
                              "expected num_classes, class_names and in_channels") from None
    model = builders.build_model(exp, info)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, AttributeError, KeyError) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        detail = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines[0]
        detail = detail if len(detail) <= 240 else detail[:237] + "..."
        raise CheckpointError(f"checkpoint '{ckpt_path}' does not match model '{exp.cfg.model.name}': {detail}") from None
    return exp, state, model.to(device).eval(), device


def predict_fn(model: nn.Module, device: torch.device, amp: str) -> PredictFn:
    """``batch -> logits`` (float32, on ``device``) with the model in eval mode, no grad."""

    @torch.no_grad()
    def predict(batch: dict[str, Any]) -> torch.Tensor:
        model.eval()
        with autocast(device, amp):
            return model(to_device(batch, device)).float()

    return predict


