"""Attention tests run on one intra-op thread: tiny tensors, where thread wake-ups would
dominate on shared CPUs (tests that need two threads set them themselves)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
