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
