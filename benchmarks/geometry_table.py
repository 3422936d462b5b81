"""The timing table of ``bench_geometry.py``: cases whose methods run round-robin, each keeping
its best time, with a ratio to the fastest peer and an agreement check per method."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def has(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@dataclass
class Row:
    case: str
    method: str
    seconds: float | None = None
    note: str = ""
    peer: bool = True
    agree: str = ""
    fn: Callable[[], object] | None = None
    check: Callable[[object], str] | None = None


@dataclass
class Bench:
    repeats: int
    budget: float
    min_time: float = 3.0
    max_runs: int = 40
    rows: list[Row] = field(default_factory=list)
    pending: list[Row] = field(default_factory=list)

    def add(self, case, method, fn, *, peer=True, estimate=None, check=None, note="") -> Row:
        """Queue ``fn``; ``None`` prints 'absent'; ``estimate`` (s) above the budget skips it."""
        row = Row(case, method, None, note, peer)
        if fn is None:
            row.note = "absent (not installed)"
        elif estimate is not None and estimate > self.budget:
            row.note = f"skipped (> budget): est. {estimate:.0f} s > {self.budget:.0f} s"
        else:
            row.fn, row.check = fn, check
            self.pending.append(row)
        self.rows.append(row)
        return row

    def measure(self) -> None:
        """Time the queued rows round-robin (load changes hit every method alike); keep the best.

        Every row runs ``repeats`` times; fast rows run on (still interleaved) until they have
        used ``min_time`` seconds or ``max_runs`` runs, so their best-of is a best of many.
        """
        if self.pending:
            print(f"# measuring {self.pending[0].case} ...", file=sys.stderr, flush=True)
        best = {id(r): float("inf") for r in self.pending}
        spent = {id(r): 0.0 for r in self.pending}
        runs = {id(r): 0 for r in self.pending}
        last: dict[int, object] = {}
        while True:
            active = [
                r for r in self.pending
                if runs[id(r)] < self.repeats or (spent[id(r)] < self.min_time and runs[id(r)] < self.max_runs)
            ]
            if not active:
                break
            for row in active:
                t0 = time.perf_counter()
                out = row.fn()
                seconds = time.perf_counter() - t0
                best[id(row)] = min(best[id(row)], seconds)
                spent[id(row)] += seconds
                runs[id(row)] += 1
                last[id(row)] = out
        for row in self.pending:
            row.seconds = best[id(row)]
            if row.check is not None:
                row.agree = row.check(last[id(row)])
            row.fn = row.check = None
        self.pending = []

    def print_table(self) -> None:
        print("| case | method | time (s) | vs fastest peer | agrees with sciformer | note |")
        print("|---|---|---:|---:|---|---|")
        for case in dict.fromkeys(r.case for r in self.rows):
            rows = [r for r in self.rows if r.case == case]
            peers = [r.seconds for r in rows if r.peer and r.seconds is not None]
            fastest = min(peers) if peers else None
            for r in rows:
                t = "-" if r.seconds is None else f"{r.seconds:.3f}"
                ratio = "-" if r.seconds is None or fastest is None else f"{r.seconds / fastest:.2f}x"
                name = f"**{r.method}**" if not r.peer else r.method
                print(f"| {case} | {name} | {t} | {ratio} | {r.agree} | {r.note} |")
