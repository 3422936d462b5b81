"""Fixtures of the point-cloud data tests; the miniature dataset layouts come from tests/synthetic.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import (
    CUBE_QUADS,
    CUBE_V,
    off_text,
    write_las,
    write_modelnet_h5,
    write_modelnet_off,
    write_modelnet_txt,
    write_s3dis,
    write_shapenetpart,
)

from sciformer.contracts import BuildContext, default_data_root

REAL = default_data_root()


def real_path(*parts: str) -> Path:
    """A path under the real data folder; skips the test when it is absent."""
    path = REAL.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not found at {path} (set SCIFORMER_DATA)")
    return path


def _one_line_error(excinfo: pytest.ExceptionInfo[BaseException], *needles: str) -> str:
    """Assert an error message is one line holding every needle; return it."""
    msg = str(excinfo.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.fixture
def one_line_error():
    return _one_line_error


@pytest.fixture
def cloud() -> dict[str, np.ndarray]:
    """Seven points with float32 coordinates, uint8 colour, unit normals and int32 labels."""
    rng = np.random.default_rng(0)
    n = 7
    normal = rng.normal(size=(n, 3))
    return {
        "coord": rng.normal(size=(n, 3)).astype(np.float32),
        "colour": rng.integers(0, 256, size=(n, 3)).astype(np.uint8),
        "normal": (normal / np.linalg.norm(normal, axis=1, keepdims=True)).astype(np.float32),
        "label": rng.integers(0, 5, n).astype(np.int32),
    }


@pytest.fixture
def ctx(tmp_path: Path) -> BuildContext:
    return BuildContext(base_dir=tmp_path, cache_dir=tmp_path / "cache", seed=0)


class Fakes:
    """The generators above, handed to tests through the ``fakes`` fixture."""

    modelnet_h5 = staticmethod(write_modelnet_h5)
    modelnet_txt = staticmethod(write_modelnet_txt)
    modelnet_off = staticmethod(write_modelnet_off)
    off_text = staticmethod(off_text)
    s3dis = staticmethod(write_s3dis)
    shapenetpart = staticmethod(write_shapenetpart)
    las = staticmethod(write_las)
    real_path = staticmethod(real_path)
    cube_vertices = CUBE_V
    cube_quads = CUBE_QUADS


@pytest.fixture
def fakes() -> type[Fakes]:
    return Fakes
