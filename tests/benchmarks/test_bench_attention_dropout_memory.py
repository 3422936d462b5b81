"""benchmarks/bench_attention_dropout_memory.py: its table shows dropout building the (n, H, L, L) weights."""

from __future__ import annotations

import subprocess
import sys

from bench_scripts import BENCHMARKS


def test_the_table_shows_the_weights_built_with_dropout_only() -> None:
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_attention_dropout_memory.py"), "--lengths", "4096",
                          "--n", "1", "--heads", "1"], capture_output=True, text=True, check=True).stdout  # 64 MiB blocks: above the library's fixed costs
    rows = {r[1]: r for r in (line.split() for line in out.splitlines()) if r and r[0] == "4096"}
    assert set(rows) == {"0.0", "0.1"} and all(len(r) == 7 for r in rows.values())
    assert float(rows["0.0"][6]) < 0.5  # without dropout: O(L), well under one block (16 MiB blocks read 1.36 once)
    assert float(rows["0.1"][4]) > 2.0 and float(rows["0.1"][6]) >= float(rows["0.1"][4])  # with it: the weights, several times
