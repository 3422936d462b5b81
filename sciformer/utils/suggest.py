"""'Did you mean' suggestions for unknown names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """Return the candidate closest to ``name`` or None if nothing is close."""
    matches = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.5)
    return matches[0] if matches else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A suffix like ``"; did you mean 'foo'?"`` or an empty string."""
    match = closest(name, candidates)
    return f"; did you mean '{match}'?" if match else ""
