"""Resumable, reproducible batch order.

The order of epoch ``e`` depends only on ``(seed, e)``, so a run resumed from a
mid-epoch checkpoint skips exactly the batches it had done. ``batch_size`` is the
global batch: with several processes each rank takes an interleaved share of it, so
the union over ranks is the batch a single process would see.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from sciformer.contracts import TaskData
from sciformer.engine.distributed import DistContext
from sciformer.engine.noise import PerSampleRNG
from sciformer.engine.runtime import epoch_seed


class EpochBatchSampler(Sampler[list[int]]):
    """Yields index batches of one epoch, starting at batch ``start``.

    A training batch of a single sample (which breaks batch normalisation) is dropped.
    """

    def __init__(
        self,
        length: int,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        epoch: int = 0,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_singleton: bool = True,
        max_batches: int | None = None,
    ) -> None:
        self.length, self.batch_size, self.shuffle = length, batch_size, shuffle
        self.seed, self.epoch, self.start = seed, epoch, start
        self.rank, self.world_size = rank, world_size
        self.drop_singleton, self.max_batches = drop_singleton, max_batches

    def global_batches(self) -> list[torch.Tensor]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
            order = torch.randperm(self.length, generator=gen)
        else:
            order = torch.arange(self.length)
        batches = list(order.split(self.batch_size))
        if self.drop_singleton and batches and len(batches[-1]) < 2 * self.world_size:
            batches.pop()
        if self.max_batches is not None:
            batches = batches[: self.max_batches]
        return batches

    def __len__(self) -> int:
        return max(0, len(self.global_batches()) - self.start)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.global_batches()[self.start :]:
            share = batch[self.rank :: self.world_size].tolist()
            if share:
                yield share


def make_loader(task: TaskData, split: str, batch_size: int, *, train: bool, seed: int, epoch: int = 0, start: int = 0, workers: int = 0,
                max_batches: int | None = None, dist: DistContext = DistContext(), votes: int = 1) -> DataLoader:
    """A loader whose order depends only on (seed, epoch); ``batch_size`` is the global batch.

    ``votes > 1`` loads the task's voting view of ``split`` (evaluation only).
    """
    dataset = task.dataset(split) if votes == 1 else task.voting_dataset(split, votes)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    if train:
        dataset = PerSampleRNG(dataset, seed, epoch)  # augmentation decided by (seed, epoch, sample)
    sampler = EpochBatchSampler(len(dataset), batch_size, shuffle=train, seed=seed, epoch=epoch, start=start, drop_singleton=train,
                                max_batches=max_batches, rank=dist.rank, world_size=dist.world_size)
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    if workers > 0:
        make_room_for_workers(workers)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=task.collate, num_workers=workers, generator=generator, persistent_workers=False,
                      worker_init_fn=stop_on_lost_batch if workers > 0 else None)


def descriptors_for(workers: int) -> int:
    """Open files a loader with ``workers`` processes may hold: torch hands each tensor of a batch
    over as a file descriptor, two batches per worker in flight (a batch of up to 32 tensors)."""
    return 128 + 2 * 32 * workers


def make_room_for_workers(workers: int) -> None:
    """Raise the open-file limit towards its hard limit when it is below :func:`descriptors_for`
    (the soft limit of many systems is 1024, the hard one far higher)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = descriptors_for(workers)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, max(need, 4096))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need:  # still too few: hand tensors over by file name
            torch.multiprocessing.set_sharing_strategy("file_system")


def stop_on_lost_batch(_: int) -> None:
    """In a loading worker: a batch that cannot be handed over (out of file descriptors while the
    queue's feeder thread passes its tensors) ends the worker, and the loader reports the worker
    gone, where Python would drop the batch and leave the loader waiting for it forever."""
    import multiprocessing.queues

    def lost(exc: BaseException, obj: object) -> None:
        sys.stderr.write(f"sciformer: a data-loading worker could not hand over a batch ({exc}) and stops\n")
        sys.stderr.flush()
        os._exit(1)

    multiprocessing.queues.Queue._on_queue_feeder_error = staticmethod(lost)  # type: ignore[method-assign]
