"""More malformed inputs, by kind: config ranges, output folders, resumes and tampered
checkpoints, special files, decompression bombs, malformed point and label files.

Same contract as :mod:`corpus` (each builder writes one bad input and returns the argv
that must exit 2 with one line); run in one fresh process by ``test_hardening_corpus.py``,
which also bounds each case's time and the process's peak memory. The cases live in
:mod:`hardening_cases_runs` and :mod:`hardening_cases_files`; importing this module registers
them all in :data:`CASES`.
"""

from __future__ import annotations

from pathlib import Path

import corpus
import hardening_cases_files  # noqa: F401  (registers its cases)
from corpus import Trained
from hardening_cases_runs import _HELD, CASES

# --- runner: every case in this one process (python hardening.py OUT_JSON WORK_DIR) ---------------


class CaseTimeout(BaseException):
    """A case ran past its time limit (BaseException: the command line must not catch it)."""


FINISHED = ("metrics.json", "last.pt", "best.pt")


def finished_outputs(d: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in d.rglob("*"):
        if path.is_file() and (path.name in FINISHED or path.name.startswith("pred.")):
            st = path.stat()
            out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


def run_all(work: Path, ids: list[str] | None = None, limit_s: float = 30.0, with_corpus: bool = False) -> dict[str, dict]:
    """Run the cases (and, ``with_corpus``, those of :mod:`corpus` as ``corpus:<id>``) in this process."""
    import contextlib
    import io
    import signal
    import time

    from sciformer.cli import main

    def on_alarm(signum: int, frame: object) -> None:
        raise CaseTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    trained = Trained(work / "trained")
    results: dict[str, dict] = {}
    cases = [(c.id, c) for c in CASES] + ([(f"corpus:{c.id}", c) for c in corpus.CASES] if with_corpus else [])
    for key, c in cases:
        if ids and key not in ids:
            continue
        d = work / key.replace(":", "_")
        d.mkdir(parents=True)
        argv = c.build(d, trained)
        before = finished_outputs(d)
        err, out = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = main(argv)
        except CaseTimeout:
            code = "timeout"
        except SystemExit as exc:  # argparse errors
            code = exc.code
        except BaseException as exc:
            import traceback

            code = f"raised {type(exc).__name__}"
            err.write(traceback.format_exc())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        after = finished_outputs(d)
        results[key] = {"code": code, "stderr": err.getvalue(), "seconds": time.perf_counter() - start,
                         "maxrss_kib": peak_rss_kib(),
                         "finished": sorted(k for k in after if after[k] != before.get(k))}
        while _HELD:
            _HELD.pop().close()
    return results


def peak_rss_kib() -> int:
    """This process image's peak RSS (VmHWM): unlike ru_maxrss it does not inherit the RSS of
    the parent that forked it (Linux records the pre-exec memory in ru_maxrss)."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    import json
    import sys

    out_json, work = Path(sys.argv[1]), Path(sys.argv[2])
    out_json.write_text(json.dumps(run_all(work, sys.argv[3:] or None, with_corpus=True)))
