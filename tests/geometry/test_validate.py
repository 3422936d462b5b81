"""Input checks shared by the geometry functions (sciformer/geometry/_validate.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sciformer.geometry._validate import value_range


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_value_range_matches_torch_and_propagates_nan(dtype):
    """The range behind the overflow and finiteness checks (NumPy on CPU, so no torch
    thread pool wakes before the kernel) equals torch's own, nan included."""
    x = (torch.randn(1000, 3, generator=torch.Generator().manual_seed(0)) * 50).to(dtype)
    lo, hi = torch.aminmax(x)
    assert value_range(x) == (float(lo), float(hi))
    x[17, 1] = float("nan")
    assert all(np.isnan(v) for v in value_range(x))
