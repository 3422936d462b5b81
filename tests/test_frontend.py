"""The command line's warning lines (sciformer.frontend.one_line_warnings)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import sciformer.data.pointcloud.las as las_module
from sciformer.frontend import one_line_warnings


def test_a_sciformer_warning_is_one_line_and_others_keep_their_form(capsys: pytest.CaptureFixture[str]) -> None:
    """Python's default prints 'file:line: UserWarning: ...' and a second line of source; a README
    that promises a one-line warning means one line."""
    here = las_module.__file__  # a warning raised in the package
    with warnings.catch_warnings(record=True) as passed_on, one_line_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit("x.laz: the LAZ header declares 3 points\nbut more follow", UserWarning, here, 90)
        warnings.warn_explicit("WARNING: already worded", UserWarning, here, 91)
        warnings.warn_explicit("from elsewhere", UserWarning, str(Path(pytest.__file__)), 5)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "WARNING: x.laz: the LAZ header declares 3 points but more follow"
    assert err[1] == "WARNING: already worded"
    assert len(err) == 2 and [str(w.message) for w in passed_on] == ["from elsewhere"]  # another package's: Python's way
    with one_line_warnings():
        pass
    assert warnings.showwarning.__module__ == "warnings"  # given back
