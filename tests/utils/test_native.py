"""ctypes helpers of the optional compiled kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer.utils.native import load_library


def test_load_library_absent_is_none(tmp_path: Path):
    assert load_library(tmp_path, "_no_such_kernel") is None


def test_pointer_refuses_non_contiguous_and_maps_none_to_null():
    import torch

    from sciformer.utils.native import pointer

    t = torch.zeros(4, 3)
    assert pointer(t) == t.data_ptr()
    assert pointer(None) is None
    with pytest.raises(ValueError, match="contiguous"):
        pointer(t.t())
