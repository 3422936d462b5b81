"""The README's Python examples run as written: every ```python block of the sections
"Python API" and "Using sciformer with PyG", each in a fresh interpreter in an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTIONS = ("Python API", "Using sciformer with PyG")


def section_blocks(text: str, title: str) -> list[str]:
    """The ```python blocks between ``## title`` and the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"README has no '## {title}' section"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("title", SECTIONS)
def test_readme_python_blocks_run(title: str, tmp_path: Path) -> None:
    blocks = section_blocks(README.read_text(encoding="utf-8"), title)
    assert blocks, f"'## {title}' holds no python block"
    if "PyG" in title:
        pytest.importorskip("torch_geometric")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for i, code in enumerate(blocks):
        script = tmp_path / f"block_{i}.py"
        script.write_text(code, encoding="utf-8")
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                             timeout=600, check=False)
        assert out.returncode == 0, f"README '{title}' block {i} failed:\n{out.stderr[-3000:]}"
