"""An override that switches a section's kind (or a registry name) leaves out what the YAML set
for the old one, with a note; a key set on the command line for another kind names that override."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sciformer import config
from sciformer.data.hsi.config import SplitConfig
from sciformer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"


def readme_overrides() -> list[str]:
    """The overrides of the README's sentence "Overrides use dotted keys and YAML values: `...`"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"Overrides use dotted keys and YAML values: `([^`]+)`", text)
    assert match, "README lost its override example"
    return match.group(1).split()


def test_the_readme_override_example_loads(capsys: pytest.CaptureFixture) -> None:
    overrides = readme_overrides()
    assert "data.split.kind=stratified" in overrides
    for name in ("indian_pines_demo", "indian_pines_fixed", "indian_pines_blocks"):
        exp = config.load(EXPERIMENTS / f"{name}.yaml", overrides)
        split = exp.data_params.split
        assert split.kind == "stratified" and exp.cfg.train.epochs == 30 and exp.model_params.depth == 4
        fields = SplitConfig.model_fields  # what the YAML set for the old kind is gone: the defaults are back
        assert split.train_fraction == fields["train_fraction"].default and split.train_path is None
    note = capsys.readouterr().err
    assert ("note: command line 'data.split.kind=stratified': data.split.train_fraction from "
            f"{EXPERIMENTS / 'indian_pines_demo.yaml'} does not apply to kind 'stratified' and is left out") in note
    assert "data.split.train_path from" in note


def test_a_key_of_another_kind_set_on_the_command_line_names_it() -> None:
    demo = EXPERIMENTS / "indian_pines_demo.yaml"
    with pytest.raises(ConfigError, match=r"^command line 'data.split.block_size=4': data.split.block_size applies to "
                                          r"kind 'blocks', not to kind 'stratified' \(set data.split.kind=blocks"):
        config.load(demo, ["data.split.kind=stratified", "data.split.block_size=4"])
    with pytest.raises(ConfigError, match=r"^command line 'data.split.train_per_class=5': data.split.train_per_class "
                                          r"applies to kind 'stratified', not to kind 'blocks'"):
        config.load(demo, ["data.split.train_per_class=5"])
    # set together on the command line, both keys stay
    exp = config.load(demo, ["data.split.kind=stratified", "data.split.train_per_class=5"])
    assert exp.data_params.split.train_per_class == 5


def test_a_kind_switch_in_a_stored_config_notes_only_changed_values(capsys: pytest.CaptureFixture) -> None:
    exp = config.load(EXPERIMENTS / "indian_pines_demo.yaml")
    again = config.from_dict(exp.to_dict(), exp.base_dir, ["data.split.kind=stratified"], source="checkpoint 'x' config")
    assert again.data_params.split.kind == "stratified"
    note = capsys.readouterr().err
    assert "data.split.train_fraction from checkpoint 'x' config" in note and "block_size" not in note


def test_a_model_switch_leaves_out_the_old_models_keys(capsys: pytest.CaptureFixture) -> None:
    exp = config.load(EXPERIMENTS / "indian_pines_blocks.yaml", ["model.name=spectralformer"])
    assert exp.cfg.model.name == "spectralformer" and exp.model_params.dropout == 0.0  # a key both know stays
    assert "model.band_tokens from" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^command line 'model.band_tokens=true': unknown key 'model.band_tokens'"):
        config.load(EXPERIMENTS / "indian_pines_blocks.yaml", ["model.name=spectralformer", "model.band_tokens=true"])
