"""YAML 1.2 (core schema) scalars in configs and overrides, and a dump that reads back as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from sciformer import config
from sciformer.errors import ConfigError
from sciformer.utils.yamlio import dumps, loads

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "value"), [("010", 10), ("0123", 123), ("-007", -7), ("+5", 5), ("0o17", 15), ("0x1F", 31),
                                             ("1_000", 1000), ("0", 0), ("1:30", "1:30"), ("0b101", "0b101"), ("0x", "0x")])
def test_integers_are_read_as_yaml_1_2(text: str, value: object) -> None:
    assert loads(f"v: {text}") == {"v": value}


@pytest.mark.parametrize(("text", "value"), [(".5", 0.5), ("-.5", -0.5), ("+.5", 0.5), (".5e3", 500.0), ("-.5E-2", -0.005),
                                             ("1.", 1.0), ("1e3", 1000.0), ("-1.5e+2", -150.0), (".", "."), ("-.", "-."),
                                             ("-.e3", "-.e3"), ("..5", "..5"), ("-.inf", float("-inf"))])
def test_floats_are_read_as_yaml_1_2(text: str, value: object) -> None:
    """The core schema's floats, [-+]?(.[0-9]+|[0-9]+(.[0-9]*)?)([eE][-+]?[0-9]+)? (-.5 and .5e3 were strings)."""
    loaded = loads(f"v: {text}")["v"]
    assert type(loaded) is type(value) and loaded == value


def test_a_leading_zero_is_decimal_in_an_override() -> None:
    demo = ROOT / "experiments" / "indian_pines_demo.yaml"
    train = config.load(demo, ["train.epochs=010", "train.seed=0123"]).cfg.train
    assert (train.epochs, train.seed) == (10, 123)
    with pytest.raises(ConfigError, match=r"train\.epochs.*1:30"):  # a string now (not sexagesimal 90): one line naming the key
        config.load(demo, ["train.epochs=1:30"])


def test_a_dump_reads_back_as_it_was() -> None:
    data = {"a": ["0o17", "1e3", "010", "yes", "on", "1:30", "0x1F", "x", "-.5", ".5e3", 5, 1.5, -0.5, True, None,
                  "run\x85b", "a\u2028b", "c\u2029d", "e\nf"]}  # line-break characters YAML would fold
    assert loads(dumps(data)) == data


def test_an_integer_too_long_to_read_is_a_one_line_config_error(tmp_path: Path) -> None:
    """Python reads at most 4300 decimal digits (a bare ValueError beyond): from a file and an override alike."""
    demo = ROOT / "experiments" / "indian_pines_demo.yaml"
    path = tmp_path / "huge.yaml"
    path.write_text(demo.read_text() + f"\nextra: {'9' * 5000}\n")
    with pytest.raises(ConfigError, match="an integer of 5,000 digits"):
        config.load(path)
    with pytest.raises(ConfigError, match=r"override 'train\.epochs=999.*an integer of 5,000 digits") as caught:
        config.load(demo, [f"train.epochs={'9' * 5000}"])
    assert len(str(caught.value)) < 300  # the override is named, not printed whole
    with pytest.raises(ConfigError, match="expected an integer, got 'abc'"):
        loads('v: !!int "abc"')
