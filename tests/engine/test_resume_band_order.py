"""A run trained before bands were sorted by wavelength (its recorded centres out of order)
cannot be resumed: the rebuilt scene's bands come in another order than its weights saw."""

from __future__ import annotations

import pytest
import torch

from sciformer.engine.runfolder import check_resume_state
from sciformer.errors import CheckpointError


def _state(wavelengths: list[float], **data: object) -> dict[str, object]:
    return {"epoch": 2, "global_step": 10, "best": {"metric": "val_oa", "value": 0.5, "epoch": 1}, "history": [],
            "optimizer": {}, "scheduler": {}, "data_state": {"wavelengths": torch.tensor(wavelengths), **data}}


def test_a_run_trained_out_of_wavelength_order_is_not_resumed() -> None:
    with pytest.raises(CheckpointError, match="out of wavelength order.*--init-from"):
        check_resume_state(_state([400.0, 696.5, 686.9, 700.0]), "last.pt")
    assert check_resume_state(_state([400.0, 686.9, 696.5, 700.0]), "last.pt")["epoch"] == 2
    assert check_resume_state(_state([400.0, 686.9, 696.5, 700.0], bands_ascending=True), "last.pt")["epoch"] == 2
