"""Every config seed is 0..2**32-1, refused at load time in one line naming the key (a negative
split seed once passed validation and ended in numpy's traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer import config
from sciformer.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SEEDS = [("indian_pines_demo.yaml", "data.split.seed"), ("indian_pines_demo.yaml", "train.seed"),
         ("s3dis_area5.yaml", "data.split_seed"), ("modelnet10.yaml", "data.split_seed"), ("modelnet10.yaml", "data.sample_seed")]


@pytest.mark.parametrize(("experiment", "key"), SEEDS)
def test_a_seed_out_of_range_is_a_config_error_naming_it(experiment: str, key: str) -> None:
    for bad in (-1, 2**32):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            config.load(EXPERIMENTS / experiment, [f"{key}={bad}"])
    for good in (0, 2**32 - 1):
        config.load(EXPERIMENTS / experiment, [f"{key}={good}"])
