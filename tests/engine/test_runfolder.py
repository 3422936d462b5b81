"""A new run never writes over, beside or instead of a user's files (``sciformer.engine.runfolder``)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sciformer.cli import main
from sciformer.engine.runfolder import UNFINISHED_PRETRAIN_FILES, RunFolderError, check_new_run_dir, check_resume_layout
from sciformer.errors import CheckpointError

# Names a user's folder may hold, run-file names among them (a run must not take those either).
USER_NAMES = ["config.yaml", "metrics.csv", "env.json", "train.log", "notes.txt", ".notes.tmp1", ".hidden",
              "splits.npz", "checkpoints/best.pt", "checkpoints/mine.pt", "predictions/a.ply", "data/x.las"]


def _snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under ``folder``: its bytes (None for folders and special files) and mtime."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        out[str(path.relative_to(folder))] = (data, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_train_refuses_a_folder_with_user_files_and_touches_nothing(toy_config: Path, tmp_path: Path, seed: int,
                                                                    capsys: pytest.CaptureFixture) -> None:
    rng = random.Random(seed)
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in rng.sample(USER_NAMES, rng.randint(1, 4)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"user data {name}\n")
    if seed % 3 == 0:
        os.mkfifo(folder / "pipe")  # a special file is never opened
    if seed % 2 == 0:
        (folder / "link").symlink_to(tmp_path / "elsewhere")
    before = _snapshot(folder)
    assert main(["train", "-c", str(toy_config), "-o", str(folder), "train.epochs=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("is not a sciformer run" in err[0] or "already holds a run" in err[0]), err
    assert _snapshot(folder) == before


def test_pretrain_refuses_a_folder_with_user_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "pretrain.json").write_text("{}\n")
    before = _snapshot(folder)
    with pytest.raises(RunFolderError, match="is not a sciformer run"):
        check_new_run_dir(folder, resume_hint=False)
    assert _snapshot(folder) == before
    # a pre-training killed in its final writes is taken over by pretrain, not by train (and the reverse)
    (folder / ".lock").write_text("77\n")
    for name in ("config.yaml", "splits.npz", "protocol.json", "metrics.csv"):
        (folder / name).write_text("partial\n")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / ".best.pt.r9qai2qp.tmp.pt").write_bytes(b"partial")
    check_new_run_dir(folder, leftovers=UNFINISHED_PRETRAIN_FILES)
    with pytest.raises(RunFolderError, match="'pretrain.json'"):
        check_new_run_dir(folder)
    (folder / "pretrain.json").unlink()
    (folder / "train.log").write_text("a train run's log\n")
    check_new_run_dir(folder)
    with pytest.raises(RunFolderError, match="'train.log'"):
        check_new_run_dir(folder, leftovers=UNFINISHED_PRETRAIN_FILES)


def test_a_run_killed_between_its_first_best_and_last_checkpoint_says_what_to_do(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".lock").write_text("5\n")
    (run / "checkpoints" / "best.pt").write_bytes(b"weights")
    with pytest.raises(RunFolderError, match="stopped before its first checkpoints/last.pt, so it cannot be resumed; delete the folder"):
        check_new_run_dir(run)


def test_an_unfinished_run_folder_is_taken_over(toy_config: Path, tmp_path: Path) -> None:
    """What a run killed before its first checkpoint leaves (lock, records, a temporary) is replaced."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("12345\n")
    for name in ("config.yaml", "env.json", "train.log", "metrics.csv", ".env.json.x1y2ab_9.tmp.json"):
        (run / name).write_text("stale\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".last.pt.k2j4h5g6.tmp.pt").write_bytes(b"partial")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1700000000.host.1.0").write_bytes(b"the killed run's points")
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    assert (run / "checkpoints" / "best.pt").is_file() and (run / "metrics.json").is_file()
    assert "stale" not in (run / "config.yaml").read_text() and not (run / ".env.json.x1y2ab_9.tmp.json").exists()
    assert not (run / "checkpoints" / ".last.pt.k2j4h5g6.tmp.pt").exists()
    assert list((run / "tensorboard").iterdir()) == []  # the killed run's events do not mix with this run's


@pytest.mark.parametrize("finished", ["metrics.json", "checkpoints/best.pt", "checkpoints/last.pt"])
def test_a_folder_with_a_run_result_is_refused(tmp_path: Path, finished: str) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".lock").write_text("")
    (run / finished).write_text("result\n")
    with pytest.raises(RunFolderError, match="already holds a run") as info:
        check_new_run_dir(run)
    assert ("--resume" in str(info.value)) == finished.endswith("last.pt")


def test_absent_and_empty_folders_are_accepted(tmp_path: Path) -> None:
    check_new_run_dir(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    check_new_run_dir(tmp_path / "empty")


def test_a_failed_run_leaves_no_folder_it_created(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Failing after the lock (fp16 on a CPU) removes the run folder and the parents it created, not older ones."""
    (tmp_path / "old").mkdir()
    for out in (tmp_path / "nest" / "a" / "b", tmp_path / "old" / "a" / "b"):
        assert main(["train", "-c", str(toy_config), "-o", str(out), "train.amp=fp16"]) == 2
        assert "fp16 needs a CUDA device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "toy.yaml"]
    assert list((tmp_path / "old").iterdir()) == []


def test_resume_takes_a_run_and_its_last_checkpoint_only(toy_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A copied last.pt would continue in its copy's grandparent (writing over a user's config.yaml there),
    best.pt would rewind the run over its later checkpoints: both refused, nothing written."""
    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=2"]) == 0
    backup = tmp_path / "backup"
    (backup / "checkpoints").mkdir(parents=True)
    (backup / "config.yaml").write_text("user file\n")
    for name in ("last.pt", "best.pt"):
        (backup / "checkpoints" / name).write_bytes((run / "checkpoints" / name).read_bytes())
    (backup / "old.pt").write_bytes((run / "checkpoints" / "last.pt").read_bytes())
    before, run_before = _snapshot(backup), _snapshot(run)
    for path, fragment in [(backup / "checkpoints" / "last.pt", "is not a sciformer run folder"),
                           (backup / "old.pt", "is not one"), (run / "checkpoints" / "best.pt", "cannot be resumed")]:
        capsys.readouterr()
        assert main(["train", "--resume", str(path), "train.epochs=3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0] and "--init-from" in err[0], err
    assert _snapshot(backup) == before and _snapshot(run) == run_before
    # the run itself, by folder or by its last.pt (also through a link to it), continues
    link = tmp_path / "link.pt"
    link.symlink_to(run / "checkpoints" / "last.pt")
    assert main(["train", "--resume", str(link)]) == 2  # a link elsewhere is not the run's checkpoints/last.pt
    assert main(["train", "--resume", str(run / "checkpoints" / "last.pt"), "train.epochs=3"]) == 0
    assert main(["train", "--resume", str(run), "train.epochs=4"]) == 0


def _link_to_user_file(run: Path, user: Path, name: str) -> None:
    (run / name).symlink_to(user / "notes.txt")


def _user_files_in_checkpoints(run: Path, user: Path) -> None:
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "mine.pt").write_text("user checkpoint\n")


@pytest.mark.parametrize("plant", [
    lambda run, user: _link_to_user_file(run, user, "train.log"),  # a link among the run's names: written through
    lambda run, user: (run / ".lock").unlink() or _link_to_user_file(run, user, ".lock"),
    lambda run, user: (run / "checkpoints").symlink_to(user, target_is_directory=True),
    _user_files_in_checkpoints,
    lambda run, user: (run / ".user_plan.tmpl").write_text("a user's dotfile, not a temporary\n"),
    lambda run, user: (run / ".notes.abcd1234.tmp").write_text("a user's file in the temporary pattern\n"),
    lambda run, user: os.mkfifo(run / "train.log"),  # opening it would wait forever
    lambda run, user: (run / "checkpoints").write_text("a file where the run wants a folder\n"),
    lambda run, user: (run / ".lock").write_text("my own lock file, not sciformer's\n"),
    lambda run, user: (run / "tensorboard").mkdir() or (run / "tensorboard" / "notes.txt").write_text("mine\n"),
    lambda run, user: os.link(user / "notes.txt", run / "train.log"),  # a second name of the user's file: opened in place
    lambda run, user: (run / ".lock").unlink() or os.link(user / "pid.txt", run / ".lock"),
    lambda run, user: (run / ".lock").write_text(""),  # an empty lock any tool may leave: not sciformer's
], ids=["log-link", "lock-link", "checkpoints-link", "file-in-checkpoints", "dotfile", "tmp-lookalike", "fifo", "checkpoints-file",
        "user-lock", "file-in-tensorboard", "log-hardlink", "lock-hardlink", "empty-lock"])
def test_an_unfinished_run_folder_with_anything_else_is_refused_untouched(plant, toy_config: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    user, run = tmp_path / "user", tmp_path / "run"
    user.mkdir()
    (user / "notes.txt").write_text("the user's notes\n")
    (user / ".draft.abcd1234.tmp").write_text("draft\n")
    (user / "pid.txt").write_text("42\n")
    run.mkdir()
    (run / ".lock").write_text("4242\n")
    (run / "config.yaml").write_text("stale\n")
    plant(run, user)
    before, user_before = _snapshot(run), _snapshot(user)
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a sciformer run" in err[0], err
    assert _snapshot(run) == before and _snapshot(user) == user_before


@pytest.mark.parametrize("plant", [
    lambda run, user: (run / "train.log").unlink() or (run / "train.log").symlink_to(user / "notes.txt"),
    lambda run, user: (run / "train.log").unlink() or os.link(user / "notes.txt", run / "train.log"),
    lambda run, user: (run / ".lock").unlink() or os.link(user / "pid.txt", run / ".lock"),
    lambda run, user: (run / ".lock").unlink(),  # a copy without the dotfile: not recognisable as a run
    lambda run, user: (run / "tensorboard").symlink_to(user, target_is_directory=True),
    lambda run, user: (run / "predictions").symlink_to(user, target_is_directory=True),
    lambda run, user: os.rename(run / "checkpoints", user / "ckpts") or (run / "checkpoints").symlink_to(user / "ckpts"),
], ids=["log-link", "log-hardlink", "lock-hardlink", "no-lock", "tensorboard-link", "predictions-link", "checkpoints-link"])
def test_resume_refuses_a_run_folder_that_would_write_through_to_other_files(plant, toy_config: Path, tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    run, user = tmp_path / "run", tmp_path / "user"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    user.mkdir()
    (user / "notes.txt").write_text("the user's notes\n")
    (user / "pid.txt").write_text("42\n")
    plant(run, user)
    before, user_before = _snapshot(run), _snapshot(user)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.epochs=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("is not a sciformer run folder" in err[0] or "restore the run folder" in err[0]), err
    assert _snapshot(run) == before and _snapshot(user) == user_before


def test_a_failure_after_the_lock_leaves_an_existing_folder_as_it_was(toy_config: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "-c", str(toy_config), "-o", str(empty), "train.amp=fp16"]) == 2
    assert list(empty.iterdir()) == []  # its lock file went with the failure
    (tmp_path / "a1").mkdir()
    assert main(["train", "-c", str(toy_config), "-o", str(tmp_path / "a1" / ".." / "a2" / "run"), "train.amp=fp16"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a1", "empty", "toy.yaml"]


def test_a_run_folder_name_of_undecodable_bytes_trains_and_reports(toy_config: Path, tmp_path: Path) -> None:
    """A file name is bytes on Linux: one that is not UTF-8 reaches train.log and the figures' titles intact."""
    run = Path(os.fsdecode(os.fsencode(tmp_path) + b"/run\xff"))
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    assert (run / "curves.png").is_file() and (run / "confusion_matrix.png").is_file()
    assert b"run\xff" in (run / "train.log").read_bytes()


def test_compare_prints_and_writes_an_undecodable_run_name_as_its_bytes(toy_config: Path, tmp_path: Path) -> None:
    """Under a strict UTF-8 locale (PYTHONIOENCODING=utf-8:strict) the table and the CSV name the
    run with its own bytes, as ``ls`` does, instead of raising UnicodeEncodeError."""
    run = Path(os.fsdecode(os.fsencode(tmp_path) + b"/run\xff"))
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=1"]) == 0
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-m", "sciformer", "compare", os.fsencode(run)]
    table = subprocess.run(command, capture_output=True, timeout=120, env=env)
    assert table.returncode == 0, table.stderr
    assert b"run\xff" in table.stdout and not table.stderr
    csv_path = tmp_path / "runs.csv"
    written = subprocess.run([*command, "--csv", str(csv_path)], capture_output=True, timeout=120, env=env)
    assert written.returncode == 0, written.stderr
    rows = csv_path.read_bytes().splitlines()
    assert len(rows) == 2 and rows[1].startswith(os.fsencode(run) + b",")


@pytest.mark.parametrize("where", ["second check", "temporaries"])
def test_a_signal_while_the_run_folder_is_taken_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """SIGTERM (read as Ctrl-C) between creating the folder with its .lock and handing the lock
    over once left a folder of only a .lock; the lock now removes what it created."""
    from sciformer.engine import runfolder

    checks = []
    real_check = runfolder.check_new_run_dir

    def check(*args, **kwargs):
        checks.append(1)
        if where == "second check" and len(checks) == 2:
            raise KeyboardInterrupt
        return real_check(*args, **kwargs)

    def clean(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(runfolder, "check_new_run_dir", check)
    if where == "temporaries":
        monkeypatch.setattr(runfolder, "clean_temporaries", clean)
    with pytest.raises(KeyboardInterrupt):
        runfolder.lock_run_dir(tmp_path / "new" / "parents" / "run")
    assert not (tmp_path / "new").exists()


def test_resume_on_a_process_count_that_changes_the_epoch_is_refused(toy_config: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """A run on 3 processes drops a last global batch with fewer than 6 samples, one process keeps
    it: resuming on another count would change the steps per epoch and the schedule built on them.
    The checkpoint records both; a mismatch names the command that continues the run as it ran."""
    import torch

    run = tmp_path / "run"
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=2"]) == 0
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    assert state["world_size"] == 1 and state["steps_per_epoch"] > 1
    state["world_size"], state["steps_per_epoch"] = 3, state["steps_per_epoch"] - 1  # as written by 3 processes
    torch.save(state, last)
    before = _snapshot(run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.epochs=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "on 3 process(es)" in err[0] and f"torchrun --nproc-per-node 3 -m sciformer train --resume {run}" in err[0], err
    after = _snapshot(run)
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}  # the lock names the last process
    state["world_size"], state["steps_per_epoch"] = 3, state["steps_per_epoch"] + 1  # the same batches on 3 processes
    torch.save(state, last)
    assert main(["train", "--resume", str(run), "train.epochs=3"]) == 0


def test_resume_with_another_batch_size_mid_epoch_is_refused(toy_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    """The epoch's sample order split into batches of another size would train samples the
    checkpoint's steps already trained (the sampler itself is the oracle); from an epoch's end on
    the batch size may change."""
    import torch

    from sciformer.engine.batching import EpochBatchSampler
    from sciformer.engine.trainer import Trainer
    from sciformer.errors import SciformerError

    run, real = tmp_path / "run", Trainer._check_finite

    def stop(self: Trainer) -> None:  # before step 2's checkpoint: last.pt holds epoch 0, step 1
        if self.global_step == 1:
            raise SciformerError("stopped")
        real(self)

    monkeypatch.setattr(Trainer, "_check_finite", stop)
    assert main(["train", "-c", str(toy_config), "-o", str(run), "train.epochs=2", "train.checkpoint_every_steps=1"]) != 0
    monkeypatch.setattr(Trainer, "_check_finite", real)
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"]) == (0, 1)
    n = 16 * state["steps_per_epoch"]  # any training split of at least one batch shows it
    trained = set(EpochBatchSampler(n, 16, shuffle=True, max_batches=1).global_batches()[0].tolist())
    again = {i for b in EpochBatchSampler(n, 8, shuffle=True, start=1) for i in b} & trained
    assert len(again) == 8  # what a resume with batches of 8 from step 1 would train twice
    before = _snapshot(run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.batch_size=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 1 of epoch 1 with train.batch_size=16" in err[0] and "resume with train.batch_size=16" in err[0], err
    assert {k: v for k, v in _snapshot(run).items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}
    assert main(["train", "--resume", str(run)]) == 0  # as it ran: to the end of epoch 2
    assert main(["train", "--resume", str(run), "train.epochs=3", "train.batch_size=8"]) == 0  # from an epoch's end: allowed
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 3


def test_a_new_batch_size_after_an_epochs_last_step_says_only_its_end_is_left() -> None:
    """A checkpoint written at an epoch's last step (checkpoint_every_steps dividing it, killed in
    validation) has no sample left to retrain: the refusal says so rather than 'twice'."""
    state = {"config": {"train": {"batch_size": 32}}, "epoch": 0, "step_in_epoch": 6, "steps_per_epoch": 6, "world_size": 1}
    with pytest.raises(CheckpointError) as caught:
        check_resume_layout(state, "last.pt", 12, 1, 16)
    assert "all trained; only its validation and checkpoint are left" in str(caught.value)
    with pytest.raises(CheckpointError, match="train some of that epoch's samples twice"):
        check_resume_layout(state | {"step_in_epoch": 3}, "last.pt", 12, 1, 16)
