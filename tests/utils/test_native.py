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


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text.split("[")[1].split("]")[0] if "[" in text else None


def test_empty_large_is_new_empty_and_small_blocks_untouched():
    import torch

    from sciformer.utils.native import empty_large

    like = torch.zeros(2, dtype=torch.float64)
    out = empty_large(like, (3, 5))
    assert out.shape == (3, 5) and out.dtype == torch.float64 and out.device == like.device
    assert empty_large(like, (0,)).numel() == 0


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="no transparent huge pages here")
def test_empty_large_fills_with_far_fewer_page_faults_than_4k_pages():
    """Filling a 64 MiB block: one fault per 4 KiB page (16384) without huge pages."""
    import resource

    import torch

    from sciformer.utils.native import empty_large

    def faults_to_fill(t: torch.Tensor) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t.fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    like = torch.zeros(1)
    pages = (64 << 20) // 4096
    assert faults_to_fill(empty_large(like, (16 << 20,))) < pages // 4
