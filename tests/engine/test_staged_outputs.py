"""predict's outputs as one set (engine/staged_outputs.py): replaced files keep their permission
bits, and a signal during the final renames waits until every file is in place."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from sciformer.engine import staged_outputs as staging


def _stage(tmp_path: Path, names: list[str]) -> staging.StagedOutputs:
    outputs = staging.StagedOutputs()
    for name in names:
        outputs.path(tmp_path / "out" / name).write_text(f"new {name}")
    return outputs


def test_a_replaced_output_keeps_its_permission_bits(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    old = tmp_path / "out" / "a.las"
    old.write_text("old")
    old.chmod(0o640)
    _stage(tmp_path, ["a.las", "b.las"]).publish(overwrite=True)
    assert old.read_text() == "new a.las"
    assert stat.S_IMODE(old.stat().st_mode) == 0o640


def test_a_signal_during_the_renames_leaves_the_whole_new_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "out").mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "out" / name).write_text("old")
    outputs = _stage(tmp_path, ["a", "b", "c"])
    real, calls = os.replace, []

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the first rename

    monkeypatch.setattr(staging.os, "replace", replace)
    monkeypatch.setattr("sciformer.engine.signals._PROCESS", False)  # a script calling main (an earlier test may have made it the process)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a script (earlier tests may ignore it)
    try:
        with pytest.raises(KeyboardInterrupt):
            outputs.publish(overwrite=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [(tmp_path / "out" / n).read_text() for n in "abc"] == ["new a", "new b", "new c"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a", "b", "c"]  # no stage left


@pytest.mark.parametrize("spelled", ["out", "."])
def test_an_error_of_a_writer_names_the_final_output_not_its_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   spelled: str) -> None:
    """A writer names the path it was given (the staged one); the user must read the output they asked for."""
    from sciformer.errors import DataError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as caught, staging.staged_outputs() as outputs:
        first = outputs.path(Path(spelled) / "a.tif")
        first.write_text("partial")
        second = outputs.path(Path(spelled) / "b map.tif")
        raise DataError(f"{second}: the GeoTIFF was not written completely (beside {first.parent}); is the disk full?")
    text = str(caught.value)
    assert staging.STAGE_PREFIX not in text
    assert text.startswith(f"{Path(spelled) / 'b map.tif'}: the GeoTIFF was not written completely (beside {spelled});"), text
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(staging.STAGE_PREFIX)]  # the stage is removed


def test_a_failed_write_names_the_final_file(tmp_path: Path) -> None:
    """An OSError (disk full, file-size limit) is printed with its file name: the final one."""
    with pytest.raises(OSError) as caught, staging.staged_outputs() as outputs:
        staged = outputs.path(tmp_path / "out" / "map.npy")
        raise OSError(28, "No space left on device", str(staged))
    assert caught.value.filename == str(tmp_path / "out" / "map.npy")
