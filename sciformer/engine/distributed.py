"""Data-parallel training with PyTorch's own engine (DistributedDataParallel).

``torchrun --nproc-per-node N -m sciformer train ...`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; :func:`init_distributed` joins the process group (gloo on CPU, nccl on
GPU). ``train.batch_size`` is the global batch: every rank takes an interleaved share of
each batch, metrics are reduced across ranks, and only rank 0 writes files or prints.

A process that joined a group ends differently from others when it is the command line
(``cli.main``): through its exit handlers and ``os._exit``, not the interpreter's
finalization. gloo's worker threads outlive ``destroy_process_group`` (DistributedDataParallel's
reducer keeps the group), and one that releases a finished collective's tensors while the
interpreter finalizes needs the GIL, which ends the thread inside a C++ destructor: the
process aborts ("terminate called without an active exception", status -6) after a run
that wrote everything (measured: 5 of 30 two-rank runs of a small DDP script under load).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from sciformer.errors import SciformerError
from sciformer.utils import ranks

_joined = False  # this process joined a process group; unlike dist.is_initialized(), still True after destroy_process_group


def joined() -> bool:
    """Whether this process joined a process group (its gloo / nccl threads may still run)."""
    return _joined


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the process group (a single process by default)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks (in place on a CPU/communication-device copy); returns it."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        if not self.enabled:
            return flag
        t = torch.tensor([1 if flag else 0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def rank0_path(self, path: Path) -> Path:
        """Rank 0's ``path`` on every rank: a default run folder is named from each process's
        own clock, so processes that reach it in different seconds name different folders."""
        if not self.enabled:
            return path
        shared: list[object] = [str(path)]
        dist.broadcast_object_list(shared, src=0)
        return Path(str(shared[0]))

    def check_one_folder(self, run_dir: Path, device: torch.device) -> None:
        """Refuse a run folder whose lock (taken by rank 0) some process does not see."""
        if not self.any(not (run_dir / ".lock").is_file(), device):
            return
        if ranks.machines_of_launch() > 1:
            raise SciformerError(f"the run folder {run_dir} is not one folder for every process: with torchrun --nnodes > 1, "
                                 "--output-dir must be on a file system all machines share")
        raise SciformerError(f"the run folder {run_dir} is not one folder for every process: rank 0 holds its lock "
                             "and another process does not see it (was the folder moved or removed meanwhile?)")


def init_distributed(device_name: str) -> DistContext:
    """Join the process group when launched by torchrun; a no-op for a single process."""
    world_size = ranks.world_size()  # one reading of torchrun's WORLD_SIZE (check_one_process uses it too)
    if world_size <= 1:
        return DistContext()
    global _joined
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name != "cpu" and torch.cuda.is_available()
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise SciformerError(f"process {local_rank} of this machine has no GPU of its own ({torch.cuda.device_count()} visible); "
                                 "start at most one process per GPU (torchrun --nproc-per-node), or train on CPU with train.device=cpu")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        except (RuntimeError, ValueError) as exc:
            raise SciformerError(f"cannot join the process group (rank {rank} of {world_size}): {str(exc).splitlines()[0]}") from None
    _joined = True
    return DistContext(rank, world_size, local_rank)


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
