"""Attention tests run on one intra-op thread (the compiled kernels' results do not depend
on it; torch's reductions would, by rounding)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
