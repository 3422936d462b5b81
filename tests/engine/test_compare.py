"""``sciformer compare``: the --csv file never replaces a run's files or an existing file
without --overwrite; scores are named by the split they were computed on; a status column says
whether a run finished (from checkpoints/last.pt's epoch and train.epochs); damaged run files are
one line naming the file."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from sciformer.cli import main
from sciformer.engine.checkpoint import FORMAT, VERSION


def fake_run(folder: Path, *, epochs: int = 2, done: int | None = 2, metrics: dict[str, Any] | None = None,
             best: int = 1, patience: int | None = None, lr: float = 0.01, val_every: int = 1) -> Path:
    """A run folder as train leaves it: config.yaml, metrics.json and checkpoints/last.pt (records
    only; epochs that are multiples of ``val_every`` validated)."""
    folder.mkdir(parents=True)
    config = {"name": "toy", "train": {"epochs": epochs, "early_stop_patience": patience, "val_every": val_every},
              "optimizer": {"lr": lr}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics))
    if done is not None:
        (folder / "checkpoints").mkdir()
        torch.save({"format": FORMAT, "version": VERSION, "epoch": done, "step_in_epoch": 0,
                    "best": {"metric": "oa", "value": 0.5, "epoch": best}, "model": {"w": torch.zeros(3)},
                    "history": [{"epoch": e, "train_loss": 1.0, **({"val_loss": 1.0} if e % val_every == 0 else {})}
                                for e in range(1, done + 1)]},
                   folder / "checkpoints" / "last.pt")
    return folder


def table(capsys: pytest.CaptureFixture, *runs: Path) -> list[dict[str, str]]:
    assert main(["compare", "--csv", "-", *map(str, runs)]) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


TEST = {"split": "test", "oa": 0.75, "miou": 0.5, "best_epoch": 1}


def test_csv_refuses_existing_files_and_any_file_inside_a_compared_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = fake_run(tmp_path / "a", metrics=TEST)
    other = fake_run(tmp_path / "other", metrics=TEST)
    (other / "metrics.csv").write_text("epoch,train_loss\n1,0.5\n")
    (a / "evaluation").mkdir()
    (a / "evaluation" / "per_class.csv").write_text("class,iou\n")
    (tmp_path / "link.csv").symlink_to(a / "evaluation" / "per_class.csv")
    cases = [(other / "metrics.csv", "exists; pass --overwrite"), (a / "evaluation" / "per_class.csv", "lies in a compared run folder"),
             (a / "evaluation" / "new.csv", "lies in a compared run folder"), (tmp_path / "link.csv", "lies in a compared run folder")]
    for target, needle in cases:
        before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        for extra in ([], ["--overwrite"]) if "compared" in needle else ([],):
            assert main(["compare", str(a), "--csv", str(target), *extra]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and needle in err[0], err
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
        assert not (a / "evaluation" / "new.csv").exists()
    assert main(["compare", str(a), "--csv", str(other / "metrics.csv"), "--overwrite"]) == 0  # asked for: replaced
    assert (other / "metrics.csv").read_text().startswith("run,status")


def test_scores_are_named_by_the_split_they_were_computed_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    val = {"split": "val", "oa": 0.25, "miou": 0.125, "best_epoch": 1, "full_resolution": {"oa": 0.375, "miou": 0.0625}}
    rows = table(capsys, fake_run(tmp_path / "t", metrics=TEST), fake_run(tmp_path / "v", metrics=val, lr=0.1))
    assert [r["test_oa"] for r in rows] == ["0.7500", "-"] and [r["val_oa"] for r in rows] == ["-", "0.2500"]
    assert [r["val_miou"] for r in rows] == ["-", "0.1250"] and [r["val_every_point_oa"] for r in rows] == ["-", "0.3750"]
    assert "every_point_oa" not in rows[0]  # no test row has every-point scores
    rows = table(capsys, fake_run(tmp_path / "v2", metrics=val))
    assert "test_oa" not in rows[0] and rows[0]["val_oa"] == "0.2500"


def test_status_says_whether_a_run_finished_and_whose_metrics_a_row_shows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = [fake_run(tmp_path / "done", metrics=TEST),
            fake_run(tmp_path / "resumed", epochs=400, done=12, metrics=TEST),  # resumed with more epochs, killed
            fake_run(tmp_path / "early", epochs=50, done=6, best=3, patience=3, metrics={**TEST, "best_epoch": 3}),
            fake_run(tmp_path / "stale", done=2, best=2, metrics=TEST),  # best.pt moved on since metrics.json
            fake_run(tmp_path / "nometrics", metrics=None),  # trained, killed in its final evaluation
            fake_run(tmp_path / "nockpt", done=None, metrics=None),
            # killed after an epoch that did not validate: not an early stop, however far from the best
            fake_run(tmp_path / "between", epochs=50, done=3, best=0, patience=1, val_every=2, metrics=None),
            fake_run(tmp_path / "early-nometrics", epochs=50, done=6, best=3, patience=3, metrics=None)]
    status = [r["status"] for r in table(capsys, *runs)]
    assert status[6] == "unfinished: epoch 3 of 50"
    assert status[0] == "finished"
    assert status[1] == "unfinished: epoch 12 of 400; metrics.json is from an earlier end"
    assert status[2] == "finished (early stop)"
    assert status[3] == "finished; metrics.json is of epoch 1, best.pt of epoch 2"
    assert status[4] == "unfinished: final evaluation not done"  # resume runs it; never "finished" without a test result
    assert status[7] == "unfinished: final evaluation not done (after an early stop)"
    assert status[5] == "no checkpoints/last.pt"


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("metrics.json", "", "metrics.json' is empty"),
    ("metrics.json", '{"oa": 0.5, "miou"', "metrics.json' is not valid JSON"),
    ("metrics.json", "[1, 2]", "metrics.json' holds a JSON list"),
    ("metrics.json", '{"oa": 0.5, "full_resolution": [1]}', "metrics.json' has a 'full_resolution'"),
    ("pretrain.json", '{"history": [1]}', "pretrain.json' has a 'history'"),
    ("pretrain.json", "\xff", "pretrain.json' is not valid JSON"),
    ("config.yaml", "- a\n- b\n", "config.yaml' is not a run's config"),
    ("checkpoints/last.pt", "not a torch file", "last.pt' is truncated or not a torch file"),
])
def test_a_damaged_run_file_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture, name: str, content: str, needle: str) -> None:
    good, bad = fake_run(tmp_path / "good", metrics=TEST), fake_run(tmp_path / "bad", metrics=TEST)
    (bad / name).write_text(content)
    assert main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and str(bad) in err[0], err


def test_the_table_has_one_line_per_run_whatever_the_values_hold(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A folded ``description: >`` ends in a newline and a folder name may hold one: each row stays one line."""
    runs = [fake_run(tmp_path / "a", metrics=TEST), fake_run(tmp_path / "two\nlines", metrics=TEST, lr=0.1)]
    for run, text in zip(runs, ["first run\n", "second\trun\n"], strict=True):
        config = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**config, "description": text}))
    assert main(["compare", *map(str, runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines  # header, rule, two rows
    assert lines[2].split()[:4] == [str(runs[0]), "finished", "first", "run"]
    assert lines[3].startswith(str(tmp_path / "two\\nlines")) and "second\\trun" in lines[3]


def test_a_run_its_process_is_writing_shows_running_with_that_pid(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The lock a live process holds is "running"; a lock file a killed run left (its pid gone, or a pid
    alive now that holds no lock on the file) is unfinished."""
    import os
    import subprocess
    import sys

    from sciformer.engine.folder_lock import drop_folder_lock, open_folder_lock

    live, gone, reused = (fake_run(tmp_path / n, epochs=2000, done=169, metrics=None) for n in ("live", "gone", "reused"))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    (gone / ".lock").write_text(ended.stdout)
    (reused / ".lock").write_text(f"{os.getppid()}\n")  # alive, but holds no lock on this file
    testing, earlier = fake_run(tmp_path / "testing", metrics=None), fake_run(tmp_path / "earlier", metrics=TEST)  # trained: in the final evaluation
    handles = [(run, open_folder_lock(run, flag="--output-dir")) for run in (live, testing, earlier)]
    try:
        status = [r["status"] for r in table(capsys, live, gone, reused, testing, earlier)]
    finally:
        for run, handle in handles:
            drop_folder_lock(run, ".lock", handle)
    assert status == [f"running (pid {os.getpid()}): epoch 169 of 2000", "unfinished: epoch 169 of 2000", "unfinished: epoch 169 of 2000",
                      *[f"running (pid {os.getpid()}): final evaluation"] * 2]
    after = [r["status"] for r in table(capsys, live, testing, earlier)]  # the locks were released: the process ended
    assert after == ["unfinished: epoch 169 of 2000", "unfinished: final evaluation not done", "finished"]
