"""A GeoTIFF map or probability raster that GDAL could not write completely (a file-size
limit, a full disk: GDAL only logs it) is a one-line DataError, and a file already there
stays as it was."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sciformer.data.hsi.geotiff import write_geotiff_map, write_geotiff_probabilities

rasterio = pytest.importorskip("rasterio")
ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}

WRITE = """
import sys
import numpy as np
from sciformer.data.hsi.geotiff import write_geotiff_map, write_geotiff_probabilities
from sciformer.errors import DataError
rng = np.random.default_rng(1)
try:
    if sys.argv[2] == "map":
        write_geotiff_map(sys.argv[1], rng.integers(0, 6, (300, 300)).astype(np.uint8), list("abcdef"))
    else:
        write_geotiff_probabilities(sys.argv[1], rng.random((300, 300, 3)).astype(np.float32), list("abc"))
except (DataError, OSError) as exc:  # GDAL logs some failed writes, rasterio raises others
    print("failed", len(str(exc).splitlines()), "file-size limit" in str(exc))
else:
    print("wrote")
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


@pytest.mark.parametrize("kind", ["map", "probabilities"])
def test_a_truncated_geotiff_is_an_error_and_the_old_file_stays(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "out.tif"
    old = np.arange(4, dtype=np.uint8).reshape(2, 2)
    write_geotiff_map(target, old, list("abc"))
    before = target.read_bytes()
    out = subprocess.run([sys.executable, "-c", WRITE, str(target), kind], capture_output=True, text=True,
                         timeout=120, env=ENV, preexec_fn=_limited)
    assert out.stdout.split() == ["failed", "1", "True"], out.stdout + out.stderr
    assert target.read_bytes() == before  # the earlier map, byte for byte
    with rasterio.open(target) as src:
        assert np.array_equal(src.read(1), old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tif"]  # no temporary left


def test_a_complete_geotiff_reads_back_as_given(tmp_path: Path) -> None:
    probs = np.random.default_rng(2).random((40, 30, 3)).astype(np.float32)
    write_geotiff_probabilities(tmp_path / "p.tif", probs, list("abc"))
    with rasterio.open(tmp_path / "p.tif") as src:
        assert np.array_equal(np.moveaxis(src.read(), 0, -1), probs)
