"""Names drawn into figures (``sciformer.utils.text.drawable``): any name a file or folder can
have is drawn, as itself, by matplotlib (the oracle: its own renderer and mathtext test)."""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib import cbook
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sciformer.utils.text import drawable

# file names: any bytes but NUL and '/', decoded as Python decodes them (undecodable bytes -> lone surrogates)
NAMES = st.binary(min_size=1, max_size=24).map(lambda b: os.fsdecode(b.replace(b"\0", b"").replace(b"/", b"") or b"x"))
TEXTS = st.one_of(NAMES, st.text(alphabet=st.sampled_from(list("ab$_^\\{}%\t\n\u202e\u00e9\u4e2d ")), min_size=1, max_size=16))


@settings(max_examples=40, deadline=None)
@given(TEXTS)
def test_any_name_renders_without_mathtext(text: str) -> None:
    shown = drawable(text)
    assert not cbook.is_math_text(shown)  # a '$' is literal, never parsed
    shown.encode("utf-8")  # no lone surrogate left
    fig = Figure()
    FigureCanvasAgg(fig)
    fig.suptitle(shown)
    fig.legend(handles=[], title=shown)
    fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")  # measures and draws the text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Zl", "Zp", "Co", "Cn")), max_size=20))
def test_a_printable_name_without_dollar_is_drawn_unchanged(text: str) -> None:
    if "$" not in text and all(ch == " " or ch.isprintable() for ch in text):
        assert drawable(text) == text


@pytest.mark.parametrize(("raw", "shown"), [
    (b"te\xff", "te\\xff"),
    (b"\xc3\xa9t\xe9", "\u00e9t\\xe9"),  # decodable bytes stay characters, the stray one is escaped
    (b"scan$_$1", "scan\\$_\\$1"),
    (b"tab\there", "tab\\there"),
])
def test_undecodable_bytes_and_special_characters_are_shown_escaped(raw: bytes, shown: str) -> None:
    assert drawable(os.fsdecode(raw)) == shown


def test_a_run_outlives_the_reader_of_its_output(tmp_path) -> None:
    """`sciformer train ... | head -1`: the pipe closes after the first line; the run goes on and
    finishes (its lines go to train.log), instead of ending with "Broken pipe"."""
    import os
    import subprocess
    import sys

    import numpy as np
    from synthetic import make_hsi_scene

    cube, gt, _ = make_hsi_scene(h=16, w=16, bands=8, classes=3, block=4)
    np.save(tmp_path / "cube.npy", cube.astype(np.float32))
    np.save(tmp_path / "gt.npy", gt.astype(np.int64))
    (tmp_path / "exp.yaml").write_text(
        "data: {name: hsi_scene, source: cube.npy, label_path: gt.npy, patch_size: 3, split: {kind: stratified, train_per_class: 10}}\n"
        "model: {name: spectralformer, dim: 8, depth: 1, num_heads: 1, group_size: 2, stride: 2}\n"
        "train: {epochs: 3, batch_size: 8, progress: never, threads: 1}\nexport: {png: false, envi: false}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sciformer", "train", "-c", "exp.yaml", "-o", "run"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()  # the reader is gone
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Broken pipe" not in err
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert "test results" in (tmp_path / "run" / "train.log").read_text()
