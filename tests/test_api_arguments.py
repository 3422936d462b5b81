"""Path keywords of the API: anything but a path (or None) is a one-line error naming the keyword."""

from __future__ import annotations

import re
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


def test_api_messages_name_the_keywords_and_the_command_line_its_flags(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from sciformer.cli import main
    from sciformer.contracts import PredictOptions
    from sciformer.frontend import python_api

    with python_api(), pytest.raises(sciformer.api.SciformerError, match=r"^rotations= does not apply to 'x' predictions$"):
        PredictOptions(rotations=4).require_defaults("x", "rotations")
    with pytest.raises(sciformer.api.SciformerError, match=r"^--tta-rotations does not apply to 'x' predictions$"):
        PredictOptions(rotations=4).require_defaults("x", "rotations")
    with pytest.raises(ConfigError, match=r"^train needs config= PATH \(or resume= RUN\)$"):
        sciformer.train(None)
    with pytest.raises(ConfigError, match=r"^pretrain epochs=: expected 1\.\.100000, got 0$"):
        sciformer.pretrain(DEMO, epochs=0)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    with pytest.raises(sciformer.api.SciformerError, match=re.escape(f"output_dir='{run}' already holds a run; continue it with resume='{run}'")):
        sciformer.train(DEMO, output_dir=run)
    assert main(["train", "-c", str(DEMO), "-o", str(run)]) == 2
    assert f"--output-dir {run} already holds a run; continue it with --resume {run} " in capsys.readouterr().err
    assert main(["pretrain", "-c", str(DEMO), "--epochs", "0"]) == 2
    assert "pretrain --epochs: expected 1..100000, got 0" in capsys.readouterr().err


def test_run_messages_name_init_from_and_resume_as_their_reader_typed_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from sciformer.cli import main
    from sciformer.frontend import init_from_command, python_api

    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"^init_from= starts a new run from a checkpoint's weights, resume= continues a run"):
        sciformer.train(DEMO, resume=run, init_from=run)
    assert main(["train", "--resume", str(run), "--init-from", str(run)]) == 2
    assert "--init-from starts a new run from a checkpoint's weights, --resume continues a run" in capsys.readouterr().err
    with python_api():
        assert init_from_command(run) == f"sciformer.train(CONFIG, init_from={str(run)!r})"
    assert init_from_command(run) == f"sciformer train -c CONFIG --init-from {run}"


def test_folder_and_override_messages_name_what_python_passed(tmp_path: Path) -> None:
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(sciformer.api.SciformerError, match=re.escape(f"output_dir='{user}' is not empty ('notes.txt')")):
        sciformer.train(DEMO, {"train.epochs": 1}, output_dir=user)
    with pytest.raises(ConfigError, match=r"^override 'train\.seed="):
        sciformer.train(DEMO, {"train.seed": -1}, output_dir=tmp_path / "new")
    assert (user / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def test_builtins_interrupted_while_loading_load_on_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the first import of the built-in datasets and models: the next call loads them (it found none)."""
    import importlib

    from sciformer import registry

    real, calls = importlib.import_module, []

    def interrupted(name: str, *args: object) -> object:
        calls.append(name)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(name, *args)

    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(importlib, "import_module", interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry.load_builtins()
    registry.load_builtins()
    assert len(calls) == 1 + len(registry._BUILTIN_MODULES) and registry._loaded


def test_part_category_messages_name_the_keyword_from_python(tmp_path: Path) -> None:
    from sciformer.data.pointcloud.file_predictors import shape_category
    from sciformer.errors import DataError
    from sciformer.frontend import python_api

    with python_api(), pytest.raises(DataError, match=r"^category='nope': unknown"):
        shape_category(tmp_path / "s.txt", "nope", ["Bag", "Chair"])
    with python_api(), pytest.raises(DataError, match=r"pass category= \(one of Bag, Chair\)"):
        shape_category(tmp_path / "s.txt", None, ["Bag", "Chair"])
    with pytest.raises(DataError, match=r"^--category 'nope': unknown"):
        shape_category(tmp_path / "s.txt", "nope", ["Bag", "Chair"])
