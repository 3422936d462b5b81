"""The hardening corpus (:mod:`hardening`) through the command line, in one fresh process
(which also runs the cases of :mod:`corpus`, checked here for time and memory; their
messages are checked in-process by ``test_bad_input_corpus.py``).

Every case must exit with code 2, print exactly one line on stderr holding its expected
fragments and no traceback (warnings shown: a library's warning before it is a second line), finish within 30 s, and write nothing that looks finished
(``metrics.json``, ``last.pt``, ``best.pt``, ``pred.*``). The whole corpus runs in one
child process whose peak resident memory (``RUSAGE_CHILDREN``) must stay under 1 GiB:
no small file may make a reader inflate or allocate gigabytes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import hardening
import pytest

LIMIT_S = 30.0
PEAK_RSS_BYTES = 2**30


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("hardening")
    out = work / "results.json"
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("SCIFORMER_DEBUG", None)
    env.pop("PYTHONWARNINGS", None)  # Python's default filters, as a user has them: a warning before the line is a second line
    # the pure readers: importing open3d alone adds ~0.5 GB of RSS; its reader path is tested in test_open3d_io
    env["SCIFORMER_NO_OPEN3D"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run([sys.executable, str(here / "hardening.py"), str(out), str(work / "cases")], env=env,
                          capture_output=True, text=True, timeout=900)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    data["__peak_rss__"] = {"kib": peak_kib, "before_kib": before}
    return data


@pytest.mark.parametrize("case", hardening.CASES, ids=lambda c: c.id)
def test_refused_in_one_line(case, results: dict[str, dict]) -> None:
    r = results[case.id]
    err = r["stderr"]
    assert "Traceback" not in err, err[-3000:]
    assert r["code"] == 2, f"{case.id}: exit {r['code']}: {err[-2000:]}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{case.id}: {len(lines)} lines on stderr:\n{err[:3000]}"
    assert len(lines[0]) <= 700, f"{case.id}: a {len(lines[0])}-character line"
    for fragment in case.expect:
        assert fragment in lines[0], f"{case.id}: {fragment!r} not in {lines[0]!r}"
    assert r["seconds"] < LIMIT_S, f"{case.id}: {r['seconds']:.1f} s"
    assert not r["finished"], f"{case.id}: wrote {r['finished']}"


def test_original_corpus_bounded_in_time_and_one_line(results: dict[str, dict]) -> None:
    bad = {}
    for key, r in results.items():
        if not key.startswith("corpus:"):
            continue
        lines = r["stderr"].strip().splitlines()
        if r["code"] != 2 or r["seconds"] >= LIMIT_S or "Traceback" in r["stderr"] or len(lines) != 1 or r["finished"]:
            bad[key] = (r["code"], round(r["seconds"], 1), r["stderr"][-300:], r["finished"][:1])
    assert len([k for k in results if k.startswith("corpus:")]) > 100
    assert not bad, bad


def test_peak_memory_of_the_whole_corpus(results: dict[str, dict]) -> None:
    # the corpus process's own peak (RUSAGE_SELF after each case), not RUSAGE_CHILDREN of pytest,
    # which also holds the peaks of every other test's subprocesses
    peak = max(r["maxrss_kib"] for r in results.values() if "maxrss_kib" in r) * 1024  # Linux reports KiB
    assert peak < PEAK_RSS_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"
