"""train.threads: null means the measured best thread count; every shipped experiment gets it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sciformer import config
from sciformer.engine.runtime import MEASURED_BEST_THREADS, available_cores, default_threads

EXPERIMENTS = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.yaml"))


def test_null_threads_is_one_on_small_machines_and_torch_default_elsewhere():
    assert default_threads(1) == 1 and default_threads(2) == 1  # measured: 1 beats 2 on 2 cores
    assert default_threads(64) == torch.get_num_threads()  # not measured: torch's own choice
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_sets_or_inherits_the_measured_thread_count(path):
    """On the measured 2-core machine, each experiment runs with the thread count measured best."""
    threads = config.load(path, []).cfg.train.threads
    effective = threads if threads is not None else default_threads(2)
    assert effective == MEASURED_BEST_THREADS[2], f"{path.name}: train.threads={threads} is not the measured best"

