"""Errors a user can act on.

Every error raised for bad input (a config key, a file, an argument) is a
:class:`SciformerError`. The CLI prints its message on one line and exits with
code 2, without a traceback. Messages name the file, key or argument and what
was expected.
"""

from __future__ import annotations


class SciformerError(Exception):
    """Base class of user-facing errors (bad config, bad file, bad argument)."""

    exit_code = 2

    def __str__(self) -> str:  # always one line
        return " ".join(super().__str__().split())


class ConfigError(SciformerError, ValueError):
    """An experiment config is invalid: names the dotted key and what was expected."""


class DataError(SciformerError, ValueError):
    """An input file or array is unreadable or inconsistent: names the file or key."""


class CheckpointError(SciformerError, ValueError):
    """A checkpoint is missing, truncated, foreign or unsafe."""
