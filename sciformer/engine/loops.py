"""One training epoch and one evaluation pass, shared by every task."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from sciformer.contracts import Batch, masked_logits
from sciformer.engine.metrics import ConfusionMatrix, PartIoU
from sciformer.errors import SciformerError
from sciformer.frontend import option


class TrainingDiverged(SciformerError):
    """The training loss became NaN or infinite."""


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Move every tensor of a batch dict to ``device``."""
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[Any]:
    """Mixed-precision context: bf16 on CPU or CUDA, fp16 on CUDA only; ``none`` is a no-op."""
    if amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def loss_weight(loss_fn: nn.Module, target: torch.Tensor) -> float:
    """What ``loss_fn``'s mean divides by over ``target``: the count of labelled targets, or with
    class weights (``CrossEntropyLoss(weight=...)``) the sum of their weights. Per-sample means
    of several batches or ranks add up exactly when each is weighted by this.

    Shapes:
        target: (n,) int64
    """
    ignore = getattr(loss_fn, "ignore_index", None)
    labelled = target[target != ignore] if ignore is not None else target  # (n_l,)
    weight = getattr(loss_fn, "weight", None)
    if weight is None:
        return float(labelled.numel())
    return float(weight.to(torch.float64).index_select(0, labelled.to(weight.device)).sum()) if labelled.numel() else 0.0


def train_steps(
    model: nn.Module,
    batches: Iterator[Batch],
    *,
    loss_fn: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    device: torch.device,
    amp: str,
    grad_clip: float | None,
    on_step: Callable[[float, int], None] | None = None,
    before_step: Callable[[int, Batch], None] | None = None,
    reduce_step: Callable[[float, bool], tuple[float, bool]] | None = None,
    world_size: int = 1,
    start: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """Run optimisation steps over ``batches``; returns (summed loss x weight, weight), added to ``start``.

    The weight of a batch is :func:`loss_weight`: its labelled count, or the sum of their
    class weights. ``before_step(i, batch)`` runs before the forward pass (per-step random
    streams). ``reduce_step(weight, non_finite)`` turns this process's weight and loss state
    into global ones (all ranks); each rank's loss is then weighted by its share of the
    global weight, so the gradient averaged over ``world_size`` ranks is the loss of the
    global batch, uneven shares and class weights included. ``on_step(loss_sum, weight)`` is
    called after every optimiser step with the running totals (checkpointing, signals).
    ``start``: the totals of the epoch's steps before these (a resumed epoch), which the loss of
    each step is added to in turn, so the sum is the one an uninterrupted epoch makes, bit for bit.
    """
    model.train()
    loss_sum, count = float(start[0]), float(start[1])
    for i, batch in enumerate(batches):
        batch = to_device(batch, device)
        target = batch["target"].reshape(-1)  # (n,)
        if before_step is not None:
            before_step(i, batch)
        n = loss_weight(loss_fn, target)
        with autocast(device, amp):
            logits = model(batch)  # (n, C)
            loss = loss_fn(logits.float(), target) if n else logits.float().sum() * 0.0
        non_finite = not bool(torch.isfinite(loss))
        n_global, non_finite = reduce_step(n, non_finite) if reduce_step is not None else (n, non_finite)
        if non_finite:
            raise TrainingDiverged(f"training loss became {loss.item() if n else 'nan'} at step {i} of the epoch; "
                                   f"lower optimizer.lr or set train.grad_clip, then {option('--resume')}")
        scaled = loss * (n * world_size / n_global) if world_size > 1 and n_global else loss
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(scaled).backward()
            scaler.unscale_(optimizer)
        else:
            scaled.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        loss_sum += float(loss.detach()) * n
        count += n
        if on_step is not None:
            on_step(loss_sum, count)
    return loss_sum, count


def merge_votes(logits: torch.Tensor, target: torch.Tensor, votes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Average the class probabilities of ``votes`` adjacent copies of each sample.

    Returns log mean probabilities, usable as logits by argmax and cross-entropy,
    and one target per sample (the copies must agree).

    Shapes: logits (n * V, C), target (n * V,) -> (n, C), (n,).
    """
    if logits.shape[0] % votes or target.shape[0] != logits.shape[0]:
        raise ValueError(f"voting batch: {logits.shape[0]} predictions and {target.shape[0]} targets "
                         f"are not whole groups of {votes} copies (voting needs one prediction per sample)")
    grouped = target.view(-1, votes)  # (n, V)
    if not bool((grouped == grouped[:, :1]).all()):
        raise ValueError("voting batch: copies of one sample carry different targets")
    probs = torch.softmax(logits, dim=1).view(-1, votes, logits.shape[1]).mean(dim=1)  # (n, C)
    return probs.clamp_min(1e-12).log(), grouped[:, 0]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    num_classes: int,
    ignore_index: int,
    loss_fn: nn.Module | None,
    device: torch.device,
    amp: str = "none",
    parts: PartIoU | None = None,
) -> tuple[ConfusionMatrix, float, float]:
    """Confusion matrix, summed loss x weight and weight (:func:`loss_weight`) of ``model`` over ``batches``.

    Sums (rather than means) so results of several processes add up exactly. A
    batch with ``votes = V`` holds V adjacent copies of each sample: their class
    probabilities are averaged and scored once per sample. With ``parts`` (part
    segmentation, :meth:`PartIoU.of`) each shape is predicted among its category's
    parts and its IoU accumulated; the confusion matrix carries them (``confusion.parts``).
    """
    model.eval()
    confusion = ConfusionMatrix(num_classes, ignore_index, parts=parts)
    loss_sum, count = 0.0, 0.0
    for batch in batches:
        batch = to_device(batch, device)
        target = batch["target"].reshape(-1)  # (n,) or (n * V,)
        with autocast(device, amp):
            logits = model(batch).float()  # (n, C) or (n * V, C)
        votes = int(batch.get("votes", 1))
        if votes > 1:
            logits, target = merge_votes(logits, target, votes)  # (n, C) log-probabilities, (n,)
        confusion.update(parts.update(logits, target, batch) if parts is not None else masked_logits(logits, batch).argmax(dim=1), target)
        if loss_fn is not None:
            n = loss_weight(loss_fn, target)
            if n:
                loss_sum += float(loss_fn(logits, target)) * n
                count += n
    return confusion, loss_sum, count
