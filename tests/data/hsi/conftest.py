"""Small synthetic scenes for the hyperspectral data tests (the shared builder in tests/synthetic.py)."""

from __future__ import annotations

import pytest
from synthetic import make_hsi_scene


@pytest.fixture
def scene():
    return make_hsi_scene()


@pytest.fixture
def scene_factory():
    """The shared :func:`synthetic.make_hsi_scene` generator, for tests that need other sizes."""
    return make_hsi_scene
