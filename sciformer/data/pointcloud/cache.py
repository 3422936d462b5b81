"""Preprocessing caches: stable keys and atomically written folders of .npy arrays.

Caches live under ``ctx.cache_dir`` (``$SCIFORMER_CACHE``), never beside raw data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sciformer.utils.atomic import atomic_folder


def cache_key(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (paths, parameters, versions)."""
    blob = json.dumps([str(p) if isinstance(p, Path) else p for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_identity(path: Path) -> list[Any]:
    """Path, size, modification time, inode change time (both in nanoseconds) and inode number:
    changes when the file does, even when a rewrite keeps the size and puts the modification
    time back (``os.utime``, ``cp -p``, ``rsync -a``, ``tar x``: none can set the change time,
    and a copy is a new inode). A spurious change only costs a cache miss."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def files_identity(paths: Sequence[Path]) -> list[Any]:
    """:func:`file_identity` of each path (``[path, None]`` for one that is missing: its reader
    names it later): a cache keyed by it is rebuilt when any of the files is edited, added or removed."""
    return [file_identity(p) if p.is_file() else [str(p), None] for p in paths]


def save_arrays_atomic(folder: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None,
                       *, replace: bool = False) -> None:
    """Write ``arrays`` as ``<key>.npy`` files (and ``meta.json``) into ``folder`` atomically
    (:func:`~sciformer.utils.atomic.atomic_folder`); a folder another process completed first is
    kept, unless ``replace`` (a stale folder: it is swapped for the new one whole)."""
    try:
        with atomic_folder(folder, replace=replace) as tmp:
            for key, value in arrays.items():
                np.save(tmp / f"{key}.npy", value)
            (tmp / "meta.json").write_text(json.dumps(meta or {}, indent=1))
    except OSError:  # another process finished first
        if not (folder / "meta.json").is_file():
            raise


def load_arrays(folder: Path, keys: Sequence[str], mmap: bool = True) -> dict[str, np.ndarray]:
    """Load ``<key>.npy`` files written by :func:`save_arrays_atomic` (memory-mapped)."""
    out = {}
    for key in keys:
        path = folder / f"{key}.npy"
        if path.is_file():
            out[key] = np.load(path, mmap_mode="r" if mmap else None)
    return out
