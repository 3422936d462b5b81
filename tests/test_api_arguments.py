"""Path keywords of the API: anything but a path (or None) is a one-line error naming the keyword."""

from __future__ import annotations

from pathlib import Path

import pytest

import sciformer
from sciformer.errors import ConfigError

DEMO = Path(__file__).resolve().parents[1] / "experiments" / "indian_pines_demo.yaml"


@pytest.mark.parametrize("keyword", ["output_dir", "resume", "init_from", "base_dir"])
def test_train_names_a_path_keyword_of_the_wrong_kind(keyword: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"^train: {keyword}= must be a path .*got 5$"):
        sciformer.train(DEMO, {"train.epochs": 1}, **{keyword: 5})
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


@pytest.mark.parametrize("keyword", ["output_dir", "base_dir"])
def test_pretrain_names_a_path_keyword_of_the_wrong_kind(keyword: str) -> None:
    with pytest.raises(ConfigError, match=rf"^pretrain: {keyword}= must be a path"):
        sciformer.pretrain(DEMO, **{keyword: 5})
