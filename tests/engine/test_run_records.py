"""env.json: written when a run starts; ``--resume`` keeps that record (command line, pid,
versions of the start) and appends the resume to its ``resumed`` list."""

from __future__ import annotations

import json
from pathlib import Path

from sciformer.cli import main
from sciformer.engine.checkpoint import load_checkpoint


def test_resume_appends_to_env_json_and_keeps_the_start(toy_run: Path) -> None:
    path = toy_run / "env.json"
    start = json.loads(path.read_text())
    assert start["resumed_from_epoch"] is None and "resumed" not in start
    start.update(command="sciformer train -c the-original.yaml", pid=1)  # in-process, both would be this test's
    path.write_text(json.dumps(start))
    for n in (1, 2):
        assert main(["train", "--resume", str(toy_run)]) == 0
        env = json.loads(path.read_text())
        assert {k: v for k, v in env.items() if k != "resumed"} == start, "the start's record is kept"
        assert len(env["resumed"]) == n
        entry = env["resumed"][-1]
        assert entry["from_epoch"] == 1 and entry["from_step"] == 0 and entry["pid"] != 1 and entry["command"] != start["command"]
        assert entry["torch"] == start["torch"] and entry["device"] == start["device"] and entry["time"]
    assert env["run_id"] == load_checkpoint(toy_run / "checkpoints" / "last.pt")["run_id"]


def test_resume_without_a_readable_env_json_writes_a_whole_one(toy_run: Path) -> None:
    path = toy_run / "env.json"
    path.write_text("[not, a record")
    assert main(["train", "--resume", str(toy_run)]) == 0
    env = json.loads(path.read_text())
    assert env["resumed_from_epoch"] == 1 and len(env["resumed"]) == 1 and env["seed"] == 0 and env["run_id"]
