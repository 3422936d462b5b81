"""A dict of overrides holds Python values: a str stays exactly that string (never re-read as YAML)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sciformer import config
from sciformer.api import _override_list

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text", ["run #2", "123", "note: x", "null", "true", "1e-3", "[8, 16]", "a\"b\\c", "ü 😀", "  lead", "~", ""])
def test_a_string_value_in_a_dict_stays_that_string(text: str) -> None:
    exp = config.load(ROOT / "experiments" / "indian_pines_demo.yaml", _override_list({"description": text}))
    assert exp.to_dict()["description"] == text


def test_other_values_are_read_as_before() -> None:
    assert _override_list({"train.epochs": np.int64(2), "a.b": np.array([1, 2]), "c": None, "d": ["x #y"]}) == [
        "train.epochs=2", "a.b=[1, 2]", "c=null", 'd=["x #y"]']
