"""A config error caused by a command-line override names the override, not the YAML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer import config
from sciformer.errors import ConfigError


def test_override_errors_name_the_command_line(toy_config: Path) -> None:
    with pytest.raises(ConfigError, match=r"^command line 'train.epochs=many': train.epochs: "):
        config.load(toy_config, ["train.epochs=many"])
    with pytest.raises(ConfigError, match=r"^command line 'train.epoch=3': unknown key 'train.epoch'"):
        config.load(toy_config, ["train.epoch=3"])
    toy_config.write_text(toy_config.read_text().replace("epochs: 3", "epochs: lots"))
    with pytest.raises(ConfigError, match=rf"^{toy_config}: train.epochs: "):  # the YAML's own value: the YAML
        config.load(toy_config, ["train.batch_size=4"])
