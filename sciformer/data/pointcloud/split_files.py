"""Files listed per split (``data.train_files`` / ``val_files`` / ``test_files``): no file
may serve two splits, under any name and as any copy.

Used by the point-scene and LiDAR-tile datasets after their files are found.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sciformer.errors import DataError
from sciformer.utils.digest import ends_sha256, file_sha256

T = TypeVar("T")


def check_disjoint_splits(paths: dict[str, list[Path]], noun: str = "files", *, listed: str = "data.{}_files",
                          copies: bool = True) -> None:
    """Refuse (DataError) a file in two splits or twice in one, however it is named: another
    spelling, an absolute path, a symbolic or a hard link to it are the same file (device and
    inode); and a byte-identical copy of a file in another split (same size, then the same
    first and last 8 KiB, then the same SHA-256: only files that agree so far are read
    whole). Copies within one split are allowed; a file that cannot be read is a DataError.
    ``listed`` names where a split's files are listed (``{}``: the split); ``copies=False``
    checks file identity only (a published benchmark's own lists, whose shapes may repeat)."""
    owner: dict[tuple[int, int], tuple[str, str]] = {}
    by_size: dict[int, list[tuple[str, Path]]] = defaultdict(list)
    for split, ps in paths.items():
        for p in ps:
            st = _read(os.stat, listed.format(split), p)
            key = (st.st_dev, st.st_ino)
            if key in owner:
                other_split, other_name = owner[key]
                same = "" if other_name == str(p) else f" (as {other_name})"
                if other_split == split:
                    raise DataError(f"{listed.format(split)}: {p.name} is listed twice{same}; each file once")
                raise DataError(f"{listed.format(split)}: {p.name} is also in {listed.format(other_split)}{same}; "
                                f"splits must not share {noun}")
            owner[key] = (split, str(p))
            if st.st_size > 0 and copies:  # (an empty file is refused by its reader)
                by_size[st.st_size].append((split, p))
    for group in by_size.values():
        _refuse_copies(_in_two_splits(group, ends_sha256, listed), noun, listed)


def _in_two_splits(group: list[tuple[str, Path]], digest: Callable[[Path], str], listed: str) -> list[tuple[str, Path]]:
    """The files of ``group`` whose ``digest`` equals that of a file in another split (in order)."""
    if len({split for split, _ in group}) < 2:
        return []
    keys = [_read(digest, listed.format(split), p) for split, p in group]
    splits: dict[str, set[str]] = defaultdict(set)
    for (split, _), key in zip(group, keys):
        splits[key].add(split)
    return [item for item, key in zip(group, keys) if len(splits[key]) > 1]


def _refuse_copies(group: list[tuple[str, Path]], noun: str, listed: str) -> None:
    """Raise for the first file of ``group`` whose whole content equals that of a file listed
    before it in another split."""
    first: dict[str, tuple[str, Path]] = {}
    for split, p in group:
        key = _read(file_sha256, listed.format(split), p)
        other_split, other = first.setdefault(key, (split, p))
        if other_split != split:
            raise DataError(f"{listed.format(split)}: {p.name} has the same bytes as {other} in {listed.format(other_split)}; "
                            f"splits must not share {noun}")


def _read(read: Callable[[Path], T], where: str, path: Path) -> T:
    """``read(path)``; an OSError (a file gone or unreadable since it was listed) as a DataError."""
    try:
        return read(path)
    except OSError as exc:
        raise DataError(f"{where}: {path}: cannot read ({exc.strerror or type(exc).__name__})") from None


def scene_names(paths: list[Path], where: str) -> list[str]:
    """One distinct output name per file of a split: its stem (``t_points`` for
    ``a/t_points.npy``); files sharing a stem are named by their path from the folder they
    share, folders joined with ``__`` (``a__t_points``, ``b__t_points``), with the suffix too
    where that is all that differs (``t_points_npy``, ``t_points_ply``). Names that would still
    meet (a file named ``a__t_points.npy`` beside ``a/t_points.npy``) are a DataError naming
    both files (``where``: the list they come from), so no prediction is written over another."""
    names = [p.stem for p in paths]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        groups[name].append(i)
    for members in (m for m in groups.values() if len(m) > 1):
        base = os.path.commonpath([os.path.abspath(paths[i].parent) for i in members])
        parts = [Path(os.path.relpath(os.path.abspath(paths[i]), base)).parts for i in members]
        stems = ["__".join((*part[:-1], paths[i].stem)) for i, part in zip(members, parts)]
        whole = len(set(stems)) < len(stems)  # only the suffix differs somewhere: keep it
        for i, part, stem in zip(members, parts, stems):
            names[i] = "__".join((*part[:-1], paths[i].name.replace(".", "_"))) if whole else stem
    seen: dict[str, Path] = {}
    for p, name in zip(paths, names):
        if name in seen:
            raise DataError(f"{where}: {seen[name]} and {p} would both write predictions named '{name}'; rename one")
        seen[name] = p
    return names
