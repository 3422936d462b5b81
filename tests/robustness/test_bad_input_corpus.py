"""The bad-input corpus through the command line: every case is refused cleanly.

Each case of :mod:`corpus` writes one malformed input (config, scene cube, point file,
dataset folder or checkpoint) and the command that reads it. The command must exit with
code 2, print exactly one line on stderr (``sciformer <command>: error: ...``) naming the
file or key and what was expected, print no traceback, and leave no output that looks
like a finished run (no new ``metrics.json``, ``last.pt``, ``best.pt`` or prediction file).
Cases that plant a code payload also check that it never ran.

The API-level checks of the same errors live beside the code they test
(tests/test_config.py, tests/engine/test_checkpoint.py, tests/data/...); here the whole
path from the command line is exercised, in-process for speed and for a few cases in a
fresh ``python -m sciformer`` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import corpus
import pytest

from sciformer.cli import main
from sciformer.registry import DATASETS

_FINISHED = ("metrics.json", "last.pt", "best.pt")


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> corpus.Trained:
    return corpus.Trained(tmp_path_factory.mktemp("trained_runs"))


def _outputs(d: Path) -> dict[Path, tuple[int, int]]:
    """Files that would mean a run, evaluation or prediction finished: path -> (size, mtime)."""
    out = {}
    for path in d.rglob("*"):
        if path.is_file() and (path.name in _FINISHED or path.name.startswith("pred.")):
            st = path.stat()
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


def _check_refusal(case: corpus.Case, d: Path, code: int, err: str, command: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{case.id}: expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith(f"sciformer {command}: error: "), line
    for fragment in case.expect:
        assert fragment in line, f"{case.id}: {fragment!r} not in {line!r}"
    assert code == 2, f"{case.id}: exit code {code}, stderr {line!r}"
    if case.marker:
        assert not (d / "pwned").exists(), f"{case.id}: the planted code ran"


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.id)
def test_cli_refuses_bad_input(case: corpus.Case, tmp_path: Path, trained: corpus.Trained, capsys: pytest.CaptureFixture) -> None:
    argv = case.build(tmp_path, trained)
    before = _outputs(tmp_path)
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    _check_refusal(case, tmp_path, code, captured.err, argv[0])
    assert _outputs(tmp_path) == before, f"{case.id}: a finished-looking output was written"


# Cases that need no test-only model, run as a user would: a fresh interpreter.
SUBPROCESS_CASES = ["config-python-tag", "hsi-envi-wrong-size", "ckpt-pickled-code-predict"]


def test_subprocess_refusals_have_no_traceback(tmp_path: Path, trained: corpus.Trained) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # warnings would show up as extra lines
    env.pop("SCIFORMER_DEBUG", None)
    jobs = []
    for case_id in SUBPROCESS_CASES:
        case = corpus.by_id(case_id)
        d = tmp_path / case_id
        d.mkdir()
        argv = case.build(d, trained)
        proc = subprocess.Popen([sys.executable, "-m", "sciformer", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=d)
        jobs.append((case, d, argv, proc))
    for case, d, argv, proc in jobs:  # started together: the interpreter start-ups overlap
        _, err = proc.communicate(timeout=120)
        _check_refusal(case, d, proc.returncode, err, argv[0])
        assert not _outputs(d), f"{case.id}: a finished-looking output was written"
        assert not (d / "runs").exists()


def test_debug_variable_shows_the_traceback(tmp_path: Path, trained: corpus.Trained, monkeypatch: pytest.MonkeyPatch) -> None:
    """SCIFORMER_DEBUG=1 re-raises the error instead of printing one line (for bug reports)."""
    from sciformer.errors import DataError

    argv = corpus.by_id("hsi-cube-nan-npy").build(tmp_path, trained)
    monkeypatch.setenv("SCIFORMER_DEBUG", "1")
    with pytest.raises(DataError, match="NaN/Inf"):
        main(argv)


# Corpus coverage: every kind of input named below has cases, and every registered dataset
# (the toy one of tests/conftest.py aside) has a section, so a new reader gets one too.
REQUIRED_PREFIXES = [
    "config-", "hsi-mat-v5", "hsi-mat-v73", "hsi-envi", "hsi-cube-nan", "hsi-label", "modelnet-h5", "modelnet-txt",
    "las-", "laz-", "s3dis-", "shapenetpart-", "predict-ply", "predict-pcd", "predict-xyz", "predict-off", "predict-npy",
    "predict-las", "predict-cube", "ckpt-pickled-code", "ckpt-truncated", "ckpt-foreign",
]
DATASET_SECTIONS = {"hsi_scene": "hsi-", "modelnet": "modelnet-", "las_tiles": "las-", "s3dis": "s3dis-", "shapenetpart": "shapenetpart-",
                    "point_scenes": "point-scenes-"}


def test_corpus_covers_every_reader() -> None:
    ids = [c.id for c in corpus.CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for prefix in REQUIRED_PREFIXES:
        assert any(i.startswith(prefix) for i in ids), f"no corpus case for {prefix}*"
    datasets = [name for name in DATASETS.names() if name != "toy_blobs"]
    missing = [name for name in datasets if name not in DATASET_SECTIONS]
    assert not missing, f"datasets without bad-input cases in tests/robustness/corpus.py: {missing}"
    for case in corpus.CASES:
        assert case.expect, f"{case.id}: give the message fragments to expect"
