"""The training run: epochs, validation, checkpoints, resume, final test evaluation.

Run folder layout::

    config.yaml             resolved experiment (defaults filled in)
    env.json                versions, device, seed, command line, run id (matched by --resume); resumes appended
    metrics.csv             one row per epoch
    checkpoints/last.pt     latest state (every epoch and every N steps), atomic
    checkpoints/best.pt     best on validation (never on test)
    metrics.json            test evaluation of best.pt (+ per_class.csv, confusion_matrix.csv)
    predictions/            task outputs (maps, point files)
    + task artifacts        split masks, protocol
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sciformer.config import Experiment
from sciformer.engine import builders
from sciformer.engine.batching import EpochBatchSampler, make_loader
from sciformer.engine.checkpoint import load_checkpoint, save_checkpoint, without_training_state
from sciformer.engine.distributed import init_distributed, shutdown
from sciformer.engine.ema import WeightAverage
from sciformer.engine.evaluation import evaluate_and_export, evaluation_views, reduce_evaluation
from sciformer.engine.inference import check_split_not_empty
from sciformer.engine.loops import TrainingDiverged, evaluate, train_steps
from sciformer.engine.metrics import PartIoU, Scores, check_monitor
from sciformer.engine.noise import StepNoise, install
from sciformer.engine.pretrain_record import init_notes
from sciformer.engine.reporting import metrics_csv_text
from sciformer.engine.run_records import env_record, epoch_line, log_scalars, open_tensorboard
from sciformer.engine.runfolder import RunLock, check_resume_layout, check_resume_state, default_run_dir, lock_run_dir, resume_command, retire_test_result
from sciformer.engine.runtime import apply_threads, environment, epoch_seed, pick_device, seed_everything
from sciformer.engine.selection import improves, new_best, restore_best, stopped_early
from sciformer.engine.signals import Interrupted, StopFlag, signals_held
from sciformer.engine.weights import context, init_from_checkpoint, load_strict, reason, resolve_init_from
from sciformer.errors import CheckpointError, SciformerError
from sciformer.frontend import option
from sciformer.utils.atomic import atomic_write_text
from sciformer.utils.progress import progress

CSV_FIELDS = ["epoch", "step", "lr", "train_loss", "val_loss", "val_oa", "val_aa", "val_kappa", "val_miou", "val_instance_miou", "val_category_miou", "epoch_time_s"]


@dataclass
class RunResult:
    run_dir: Path
    test: dict[str, Any]
    best_epoch: int


class Trainer:
    """Trains one experiment into one run folder."""

    def __init__(self, exp: Experiment, run_dir: Path | None, *, resume_state: dict[str, Any] | None = None,
                 log: Callable[[str], None] = print) -> None:
        """``run_dir`` None: a new folder ``runs/<name>-<time>`` (``-2``, ``-3``, ... where a run started
        in the same second has it), named by rank 0 for every process."""
        numbered = run_dir is None and resume_state is None
        self.exp, self.cfg, self.run_dir = exp, exp.cfg, run_dir if run_dir is not None else default_run_dir(exp.cfg.name)
        self.resume_state = resume_state
        t = self.cfg.train
        self.dist = init_distributed(t.device)
        self._lock: RunLock | None = None
        try:
            with signals_held():  # before any work; a signal meanwhile is raised once self._lock can undo the folder
                self._lock = lock_run_dir(self.run_dir, fresh=resume_state is None, numbered=numbered) if self.dist.is_main else None
            self.run_dir = self.dist.rank0_path(self._lock.run_dir if self._lock is not None else self.run_dir)  # the folder rank 0 took
            self._setup(log)
        except BaseException:
            if self._lock is not None:
                self._lock.release()  # and remove the folder if this process created it and nothing was written
            shutdown(self.dist)  # run_training leaves the group only for a trainer it got
            raise

    def _setup(self, log: Any) -> None:
        exp, t, resume_state = self.exp, self.cfg.train, self.resume_state
        self.log = log if self.dist.is_main else (lambda *a, **k: None)
        apply_threads(t.threads)  # null: the measured best
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.benchmark = False
        self.device = pick_device(t.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        self.dist.barrier()  # rank 0 holds the run folder's lock by now: every process must see it
        self.dist.check_one_folder(self.run_dir, self.device)
        if self.dist.enabled and t.batch_size < 2 * self.dist.world_size:
            raise SciformerError(f"train.batch_size {t.batch_size} is the global batch; with {self.dist.world_size} processes it must be at least {2 * self.dist.world_size}")
        if t.amp == "fp16" and self.device.type != "cuda":
            raise SciformerError("train.amp: fp16 needs a CUDA device; use bf16 or none on CPU")
        seed_everything(t.seed)
        self.task = builders.build_task(exp)
        self.info = self.task.info
        check_monitor(t.monitor, self.info)
        if self.cfg.evaluation.votes > 1:  # fail now, not after training
            self.task.voting_dataset(self.cfg.evaluation.split, self.cfg.evaluation.votes)
        evaluation_views(exp, self.task)  # likewise
        check_split_not_empty(self.task, self.cfg.evaluation.split)
        self.task.check_trainable()
        self.model = builders.build_model(exp, self.info).to(self.device)
        self.init_from: dict[str, Any] | None = None  # what train.init_from loaded (fine-tuning), for env.json
        if resume_state is None and t.init_from is not None:
            line, self.init_from = init_from_checkpoint(self.model, resolve_init_from(t.init_from, exp.base_dir), exp.to_dict(), builders.data_info_to_dict(self.info))
            for text in (line, *init_notes(self.init_from, self.task, getattr(exp.model_params, "position_source", None))):
                if text:
                    self.log(text)
        self.noise = StepNoise(t.seed, self.dist.rank)
        install(self.model, self.noise)  # dropout masks follow the sample, not the process
        self.net: nn.Module = self.model  # what the training loop calls (DDP-wrapped when distributed)
        if self.dist.enabled:
            if self.device.type == "cuda":
                self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.ema = WeightAverage(self.model, t.ema) if t.ema is not None else None  # train.ema: validation, best.pt and the test use the average
        self.loss_fn = builders.build_loss(t, self.task).to(self.device)
        self.optimizer = builders.build_optimizer(self.cfg.optimizer, self.model)
        n_train = len(self.task.dataset("train"))
        if n_train < 2:
            raise SciformerError(f"data: the training split has {n_train} samples; need at least 2")
        self.steps_per_epoch = len(EpochBatchSampler(n_train, t.batch_size, shuffle=True, max_batches=t.max_steps_per_epoch, world_size=self.dist.world_size))
        self.scheduler = builders.build_scheduler(self.cfg.schedule, self.optimizer, self.steps_per_epoch, t.epochs)
        self.scaler = torch.amp.GradScaler("cuda") if t.amp == "fp16" else None
        self.has_val = len(self.task.dataset("val")) > 0
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.partial = (0.0, 0.0)  # loss sum and loss weight of the epoch in progress
        self.best = new_best(t.monitor)
        self.history: list[dict[str, Any]] = []
        self.run_id = str((resume_state or {}).get("run_id") or uuid.uuid4().hex)  # in last.pt and env.json: a copied last.pt is told apart
        if resume_state is not None:
            self._restore(resume_state)

    # ------------------------------------------------------------------ state
    def _payload(self, partial: tuple[float, float]) -> dict[str, Any]:
        return {
            "config": self.exp.to_dict(),
            "config_dir": str(self.exp.base_dir),
            "data_info": builders.data_info_to_dict(self.info),
            "data_state": self.task.state(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "partial": list(partial),
            "best": dict(self.best),
            "history": list(self.history),
            "init_from": self.init_from,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "run_id": self.run_id,
            "world_size": self.dist.world_size, "steps_per_epoch": self.steps_per_epoch,  # checked by --resume
        }

    def _restore(self, state: dict[str, Any]) -> None:
        """Load a resumed state; every mismatch is a one-line CheckpointError, raised before any file is written."""
        where = str(self.run_dir / "checkpoints" / "last.pt")
        pos = check_resume_state(state, where)
        saved = builders.data_info_to_dict(self.info)
        if any(state["data_info"].get(k) != saved[k] for k in ("num_classes", "in_channels")):
            raise CheckpointError(f"checkpoint '{where}': the run's data changed since it was written: {reason(context(state, self.exp.to_dict(), saved))[0]}; "
                                  f"continue only on its data, or train a new run with {option('--init-from', where)} to fine-tune")
        check_resume_layout(state, where, self.steps_per_epoch, self.dist.world_size, self.cfg.train.batch_size)  # after the data check: new data changes the steps too
        if pos["step_in_epoch"] > self.steps_per_epoch or pos["epoch"] > self.cfg.train.epochs + 10**6:
            raise CheckpointError(f"checkpoint '{where}': step_in_epoch {pos['step_in_epoch']} is beyond the {self.steps_per_epoch} steps of an epoch")
        load_strict(self.model, state, where, self.exp.to_dict(), saved)
        for name, target in (("optimizer", self.optimizer), ("scheduler", self.scheduler)):
            try:
                target.load_state_dict(state[name])
            except Exception as exc:  # noqa: BLE001 - a state of another model/optimizer, or tampered
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
                detail = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines[0]
                raise CheckpointError(f"checkpoint '{where}': its {name} state does not match this run ({detail[:200]})") from None
        if self.ema is not None:
            if not state.get("ema"):
                raise CheckpointError(f"checkpoint '{where}': it was written without train.ema, so the weight average cannot continue; "
                                      "resume without train.ema, or start a new run")
            self.ema.load_state_dict(state["ema"], where)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.step_in_epoch, self.global_step = pos["epoch"], pos["step_in_epoch"], pos["global_step"]
        # the stored partial loss is global: rank 0 carries it, the others start from zero
        self.partial = pos["partial"] if self.dist.is_main else (0.0, 0.0)
        self.history = [dict(row) for row in state.get("history", [])]
        self.best = restore_best(state["best"], self.history)
        self.init_from = state.get("init_from")

    def _save(self, name: str, partial: tuple[float, float] = (0.0, 0.0)) -> None:
        """Write a checkpoint (rank 0); ``partial`` is the global loss sum/count of the epoch in progress."""
        if self.dist.is_main:
            if name == "best.pt":
                retire_test_result(self.run_dir, self.log)
            payload = self._payload(partial)  # best.pt: for evaluate / predict / --init-from (--resume takes last.pt)
            save_checkpoint(self.run_dir / "checkpoints" / name, without_training_state(payload) if name == "best.pt" else payload)
        self.dist.barrier()

    # ------------------------------------------------------------------ files
    def _write_metrics_csv(self) -> None:
        if not self.dist.is_main:
            return
        atomic_write_text(self.run_dir / "metrics.csv", metrics_csv_text(self.history, CSV_FIELDS))

    def _prepare_run_dir(self) -> None:
        if not self.dist.is_main:
            return
        atomic_write_text(self.run_dir / "config.yaml", self.exp.to_yaml())
        env = {**environment(self.device, self.cfg.train.seed), "world_size": self.dist.world_size, "init_from": self.init_from, "run_id": self.run_id}
        resumed_at = (self.epoch, self.step_in_epoch) if self.resume_state is not None else None  # a resume is appended to the run's record
        atomic_write_text(self.run_dir / "env.json", json.dumps(env_record(self.run_dir / "env.json", env, resumed_at), indent=2) + "\n")
        self.task.save_artifacts(self.run_dir)

    # ------------------------------------------------------------------ loop
    def _epoch_batches(self) -> tuple[Iterator[dict[str, Any]], list[int]]:
        """This rank's batches of the epoch from ``step_in_epoch`` on, and the global batch sizes."""
        t = self.cfg.train
        loader = make_loader(self.task, "train", t.batch_size, train=True, seed=t.seed, epoch=self.epoch, start=self.step_in_epoch,
                             workers=t.num_workers, max_batches=t.max_steps_per_epoch, dist=self.dist)
        sizes = [len(b) for b in loader.batch_sampler.global_batches()[self.step_in_epoch:]]  # type: ignore[union-attr]
        return iter(progress(loader, total=len(loader), desc=f"epoch {self.epoch + 1}/{t.epochs}", mode=t.progress)), sizes

    def fit(self) -> RunResult:
        """Train (or continue) to ``train.epochs``, then evaluate best.pt on the test split."""
        self._prepare_run_dir()
        self.log(f"run folder: {self.run_dir}")
        for key, value in self.task.describe().items():
            self.log(f"  {key}: {value}")
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model {self.cfg.model.name}: {n_params:,} parameters on {self.device}")
        if not self.has_val:
            self.log("no validation split: best.pt is the last epoch (train.monitor and early stopping do not apply)")
        writer = open_tensorboard(self.run_dir, self.cfg.train.tensorboard and self.dist.is_main)
        try:
            self._train_epochs(writer)
        finally:
            if writer is not None:
                writer.close()
        return self._final_evaluation()

    def _train_epochs(self, writer: Any) -> None:
        t = self.cfg.train
        if self.step_in_epoch == 0 and self._stopped_early():  # --resume of an early-stopped run: to its final evaluation
            self.log(f"early stop: no validation improvement for {t.early_stop_patience} validations (after epoch {self.epoch}, "
                     "before this resume); nothing left to train")
            return
        with StopFlag() as stop:
            while self.epoch < t.epochs:
                if self.step_in_epoch == 0:
                    seed_everything(epoch_seed(t.seed, self.epoch))
                    self.partial = (0.0, 0)
                start = time.perf_counter()
                loss_sum, count = self._run_epoch(stop)
                self.epoch += 1
                self.step_in_epoch = 0
                self.partial = (0.0, 0)
                row: dict[str, Any] = {"epoch": self.epoch, "step": self.global_step, "lr": self.optimizer.param_groups[0]["lr"],
                                       "train_loss": loss_sum / count if count > 0 else 0.0}
                validate = self.has_val and (self.epoch % t.val_every == 0 or self.epoch == t.epochs)
                # train.ema: the average is validated and becomes best.pt's model (swapped in only then)
                with self._averaged() if validate or not self.has_val else nullcontext():
                    if validate:
                        scores, val_loss = self._evaluate("val")
                        summary = scores.summary()
                        if math.isnan(val_loss):  # non-finite scores on some sample: their arg-max (class 0) is no prediction
                            summary = {k: math.nan if isinstance(v, float) else v for k, v in summary.items()}
                        row.update(val_loss=val_loss, **{f"val_{k}": v for k, v in summary.items()})
                        value = val_loss if t.monitor == "loss" else getattr(scores, t.monitor)
                        if improves(self.best, value, val_loss):  # a tie goes to the lower validation loss; never a NaN loss
                            self.best.update(value=float(value), epoch=self.epoch, loss=float(val_loss))
                            self._save("best.pt")
                    elif not self.has_val:
                        self.best.update(value=None, epoch=self.epoch)
                        self._save("best.pt")
                row["epoch_time_s"] = round(time.perf_counter() - start, 3)
                self.history.append(row)
                stop_early = self._stopped_early()
                self._write_metrics_csv()
                log_scalars(writer, row)
                self._save("last.pt")
                self.log(epoch_line(row, t.epochs))
                if validate and isinstance(row.get("val_loss"), float) and math.isnan(row["val_loss"]):
                    self.log("  validation loss is NaN: the model gives non-finite scores on some validation sample, so this epoch "
                             "scores NaN and cannot become best.pt (diverged? try train.grad_clip or a lower optimizer.lr)")
                if self.dist.any(stop.signal is not None, self.device):  # a signal during validation or the save
                    raise Interrupted(f"stopped by signal {stop.signal or 'on another rank'} after epoch {self.epoch}; "
                                      f"checkpoint written, continue with: {resume_command(self.run_dir, self.dist.world_size)}")
                if stop_early:
                    self.log(f"early stop: no validation improvement for {t.early_stop_patience} validations")
                    break

    def _stopped_early(self) -> bool:
        """Whether early stopping ends the run after the last recorded epoch (:func:`stopped_early`)."""
        t = self.cfg.train
        return self.has_val and bool(self.history) and self.history[-1].get("epoch") == self.epoch \
            and stopped_early(self.best, self.history, t.early_stop_patience, t.val_every)

    def _run_epoch(self, stop: StopFlag) -> tuple[float, float]:
        """Train the rest of the epoch; returns the epoch's loss sum and weight (resumed part included)."""
        t = self.cfg.train
        batches, sizes = self._epoch_batches()
        rank, world = self.dist.rank, self.dist.world_size

        def before_step(i: int, batch: dict[str, Any]) -> None:
            # rows of the global batch this rank holds (the sampler deals them round-robin)
            self.noise.begin(self.global_step, torch.arange(rank, sizes[i], world), sizes[i])

        def reduce_step(count: float, non_finite: bool) -> tuple[float, bool]:
            if not self.dist.enabled:
                return count, non_finite
            totals = self.dist.all_reduce_sum(torch.tensor([count, int(non_finite)], dtype=torch.float64))
            return float(totals[0]), bool(totals[1] > 0)

        def on_step(loss_sum: float, count: float) -> None:
            self._check_finite()
            if self.ema is not None:
                self.ema.update(self.model)
            self.step_in_epoch += 1
            self.global_step += 1
            self.partial = (loss_sum, count)  # the resumed part included (train_steps' start)
            stopping = self.dist.any(stop.signal is not None, self.device)
            if stopping or (t.checkpoint_every_steps and self.global_step % t.checkpoint_every_steps == 0):
                self._save("last.pt", partial=self._reduced(self.partial))
            if stopping:
                raise Interrupted(
                    f"stopped by signal {stop.signal or 'on another rank'} at epoch {self.epoch + 1}, step {self.step_in_epoch}; "
                    f"checkpoint written, continue with: {resume_command(self.run_dir, self.dist.world_size)}"
                )

        train_steps(self.net, batches, loss_fn=self.loss_fn, optimizer=self.optimizer, scheduler=self.scheduler,
                    scaler=self.scaler, device=self.device, amp=t.amp, grad_clip=t.grad_clip, on_step=on_step,
                    before_step=before_step, reduce_step=reduce_step, world_size=world, start=self.partial)
        self.noise.end()
        return self._reduced(self.partial)

    def _averaged(self) -> AbstractContextManager[None]:
        """The model holds the weight average inside the block (train.ema), its own weights otherwise."""
        return self.ema.applied(self.model) if self.ema is not None else nullcontext()

    def _check_finite(self) -> None:
        """Stop before a checkpoint can hold NaN or infinite weights."""
        tensors = [t.detach() for t in (*self.model.parameters(), *self.model.buffers()) if t.is_floating_point()]
        if tensors and not bool(torch.isfinite(torch.stack([t.float().abs().sum() for t in tensors])).all()):
            raise TrainingDiverged(f"training weights became nan/inf at epoch {self.epoch + 1}, step {self.step_in_epoch + 1}; "
                                   f"lower optimizer.lr or set train.grad_clip, then {option('--resume')}")

    def _reduced(self, partial: tuple[float, float]) -> tuple[float, float]:
        """Loss sum and loss weight (:func:`~sciformer.engine.loops.loss_weight`) summed over ranks."""
        if not self.dist.enabled:
            return partial
        totals = self.dist.all_reduce_sum(torch.tensor(partial, dtype=torch.float64))
        return float(totals[0]), float(totals[1])

    def _evaluate(self, split: str) -> tuple[Scores, float]:
        t = self.cfg.train
        loader = make_loader(self.task, split, self.cfg.evaluation.batch_size, train=False, seed=t.seed, workers=t.num_workers, dist=self.dist)
        mode = t.progress if self.dist.is_main else "never"
        confusion, loss_sum, count = evaluate(self.model, progress(loader, total=len(loader), desc=f"eval {split}", mode=mode),
                                              num_classes=self.info.num_classes, ignore_index=self.task.ignore_index, loss_fn=self.loss_fn, device=self.device, amp=t.amp,
                                              parts=PartIoU.of(self.info, self.task.ignore_index))
        return reduce_evaluation(confusion, loss_sum, count, self.dist)

    def _final_evaluation(self) -> RunResult:
        best_path = self.run_dir / "checkpoints" / "best.pt"
        if not best_path.exists():  # every validation gave a NaN monitored value or loss
            validations = sum("val_loss" in r for r in self.history)
            raise SciformerError(f"train.monitor '{self.best['metric']}': none of the {validations} validations gave a finite value "
                                 f"and loss, so no best.pt was written; see {self.run_dir / 'metrics.csv'} (last.pt holds the last epoch)")
        state = load_checkpoint(best_path)
        self.model.load_state_dict(state["model"])
        result = evaluate_and_export(self.exp, self.task, self.model, self.device, self.run_dir,
                                     extra={"best_epoch": state["best"]["epoch"], "monitor": self.best["metric"] if self.has_val else None, "best_val": state["best"]["value"],
                                            **({"pretrained": pre} if (pre := (state.get("init_from") or {}).get("pretrain")) else {})},
                                     log=self.log, dist=self.dist)
        return RunResult(self.run_dir, result, int(state["best"]["epoch"]))

