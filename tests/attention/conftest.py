"""Attention tests run on one intra-op thread (the shared ``one_thread`` fixture; tests that
need two threads set them themselves)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    yield
