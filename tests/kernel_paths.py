"""Shared by the tests of compiled kernels with a torch fallback (importable: tests/ is on sys.path).

Each such test runs three ways: ``compiled`` (float32, library enabled), ``torch`` (float32,
``_neighborhood_native.enabled`` off) and ``float64`` (torch), against a float64 oracle.
"""

from __future__ import annotations

import pytest
import torch

from sciformer.attention import _neighborhood_native as native

needs_lib = pytest.mark.skipif(native.library() is None, reason="compiled vector attention not built")
PATHS = [pytest.param("compiled", marks=needs_lib), "torch", "float64"]


def select_path(path: str, monkeypatch: pytest.MonkeyPatch) -> torch.dtype:
    """Select the path (monkeypatched ``enabled``); the dtype of its inputs."""
    monkeypatch.setattr(native, "enabled", path == "compiled")
    return torch.float64 if path == "float64" else torch.float32


def close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str = "",
          scale: float | torch.Tensor | None = None, floor: float = 1e-6) -> None:
    """Largest difference relative to ``scale`` (default: the largest |want|, at least
    ``floor``) under ``tol``; NaN fails."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if scale is None:
        scale = want.abs().max().clamp_min(floor)
    err = ((got.double() - want.double()).abs().max() / scale).item()
    assert err < tol, (what, err)
